// Tests for kvcache/metrics (Prometheus text, histograms) and kvcache/store_config (defaults, validation,
// flag parsers).
#include <gtest/gtest.h>

#include "kvcache/metrics.h"
#include "kvcache/store_config.h"

namespace ds41::kvcache {
namespace {

TEST(Metrics, PrometheusTextExposition) {
  MetricsRegistry m;
  m.counter("ds41_x_total", "X things", {{"tier", "disk"}}).inc(3);
  m.counter("ds41_x_total", "X things", {{"tier", "dram"}}).inc();
  m.gauge("ds41_a_bytes", "A \"bytes\"\nline2").set(-5);
  EXPECT_EQ(m.counter_value("ds41_x_total", {{"tier", "disk"}}), 3u);
  EXPECT_EQ(m.counter_value("ds41_x_total", {{"tier", "nope"}}), 0u);
  EXPECT_EQ(m.gauge_value("ds41_a_bytes"), -5);
  // Same series twice is the same object.
  EXPECT_EQ(&m.counter("ds41_x_total", "X things", {{"tier", "disk"}}),
            &m.counter("ds41_x_total", "X things", {{"tier", "disk"}}));
  EXPECT_EQ(m.prometheus_text(),
            "# HELP ds41_a_bytes A \"bytes\"\\nline2\n"
            "# TYPE ds41_a_bytes gauge\n"
            "ds41_a_bytes -5\n"
            "# HELP ds41_x_total X things\n"
            "# TYPE ds41_x_total counter\n"
            "ds41_x_total{tier=\"disk\"} 3\n"
            "ds41_x_total{tier=\"dram\"} 1\n");
}

TEST(Metrics, HistogramBucketsAreInclusiveCumulativeAndRendered) {
  MetricsRegistry m;
  Histogram& h = m.histogram("ds41_wait_seconds", "Waits", {0.1, 1}, {{"tier", "disk"}});
  EXPECT_EQ(&h, &m.histogram("ds41_wait_seconds", "Waits", {0.1, 1}, {{"tier", "disk"}}));
  for (double v : {0.05, 0.1, 0.5, 1.0, 7.0}) h.observe(v);  // a bound belongs to its own bucket
  EXPECT_EQ(h.cumulative(0), 2u);
  EXPECT_EQ(h.cumulative(1), 4u);
  EXPECT_EQ(h.cumulative(2), 5u);
  EXPECT_EQ(h.count(), 5u);
  EXPECT_DOUBLE_EQ(h.sum(), 8.65);
  EXPECT_EQ(m.prometheus_text(),
            "# HELP ds41_wait_seconds Waits\n"
            "# TYPE ds41_wait_seconds histogram\n"
            "ds41_wait_seconds_bucket{tier=\"disk\",le=\"0.1\"} 2\n"
            "ds41_wait_seconds_bucket{tier=\"disk\",le=\"1\"} 4\n"
            "ds41_wait_seconds_bucket{tier=\"disk\",le=\"+Inf\"} 5\n"
            "ds41_wait_seconds_sum{tier=\"disk\"} 8.65\n"
            "ds41_wait_seconds_count{tier=\"disk\"} 5\n");
}

TEST(StoreConfig, DefaultsFollowTheServingDesign) {
  KvStoreConfig c;
  EXPECT_EQ(c.block_tokens, 128u);
  EXPECT_EQ(c.disk.retention_ns, 72LL * 3600 * kNsPerSecond);
  EXPECT_DOUBLE_EQ(c.dram.memory_fraction, 0.10);
  EXPECT_EQ(c.dram.ttl_ns, 300 * kNsPerSecond);
  EXPECT_EQ(c.dram.resolved_capacity(1000), 100u);
  EXPECT_GT(host_memory_bytes(), 0u);
}

TEST(StoreConfig, ValidationNamesTheField) {
  KvStoreConfig c;
  auto s = c.validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model_identity"), std::string::npos);
  c.model_identity = "m";
  s = c.validate();
  EXPECT_NE(s.message().find("--kv-dir"), std::string::npos) << s.message();
  c.disk.dir = "/tmp/x";
  s = c.validate();
  EXPECT_NE(s.message().find("--kv-disk-capacity"), std::string::npos) << s.message();
  c.disk.capacity_bytes = 1 << 20;
  EXPECT_TRUE(c.validate().ok());
  c.dram.memory_fraction = 0.95;
  EXPECT_NE(c.validate().message().find("memory_fraction"), std::string::npos);
  c.dram.memory_fraction = 0.1;
  c.swa_backend = SwaBackend::kRedis;
  EXPECT_NE(c.validate().message().find("at least one node"), std::string::npos);
  c.redis.nodes = {"127.0.0.1:0"};
  EXPECT_NE(c.validate().message().find("port"), std::string::npos);
  c.redis.nodes = {"127.0.0.1:6379", "localhost:6380"};
  EXPECT_TRUE(c.validate().ok());
  c.writer.threads = 0;
  EXPECT_NE(c.validate().message().find("threads"), std::string::npos);
}

TEST(StoreConfig, FlagParsers) {
  EXPECT_EQ(*parse_duration_ns("72h"), 72LL * 3600 * kNsPerSecond);
  EXPECT_EQ(*parse_duration_ns("90m"), 90LL * 60 * kNsPerSecond);
  EXPECT_EQ(*parse_duration_ns("500ms"), 500'000'000LL);
  EXPECT_EQ(*parse_duration_ns("3d"), 3LL * 86400 * kNsPerSecond);
  EXPECT_EQ(*parse_duration_ns("1.5s"), 1'500'000'000LL);
  EXPECT_EQ(*parse_duration_ns("30"), 30 * kNsPerSecond);
  EXPECT_FALSE(parse_duration_ns("h").ok());
  EXPECT_FALSE(parse_duration_ns("5y").ok());
  EXPECT_FALSE(parse_duration_ns("-5s").ok());
  EXPECT_EQ(*parse_byte_size("500G"), 500ULL << 30);
  EXPECT_EQ(*parse_byte_size("64MiB"), 64ULL << 20);
  EXPECT_EQ(*parse_byte_size("1T"), 1ULL << 40);
  EXPECT_EQ(*parse_byte_size("4096"), 4096u);
  EXPECT_FALSE(parse_byte_size("12Q").ok());
  EXPECT_FALSE(parse_byte_size("").ok());
  std::string host;
  int port;
  EXPECT_TRUE(parse_host_port("10.0.0.1:6379", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 6379);
  EXPECT_FALSE(parse_host_port("nohost", &host, &port).ok());
  EXPECT_FALSE(parse_host_port("h:70000", &host, &port).ok());
}

}  // namespace
}  // namespace ds41::kvcache
