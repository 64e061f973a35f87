// Tests for kvcache/redis_swa_pool against real redis-server processes that the tests start on
// loopback (random free ports, no persistence) and kill in teardown. redis-server missing is a
// test FAILURE (it is in .ci/packages.txt), never a skip. Labelled `redis` in ctest (what they
// need); no assertion on wall-clock durations: TTLs are read back with PTTL, timeouts and the
// down window are checked through the error counters and a FakeClock.
#include "kvcache/redis_swa_pool.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "kvcache/kv_store.h"
#include "kvcache/posix_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

std::string find_redis_server() {
  const char* path = getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  p += ":/usr/sbin:/usr/local/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string cand = dir + "/redis-server";
    if (!dir.empty() && access(cand.c_str(), X_OK) == 0) return cand;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// One redis-server child. Killed (SIGKILL) in the destructor; PR_SET_PDEATHSIG also kills it if
// the test process dies first, so no stray servers survive a crashed test.
class RedisServer {
 public:
  ~RedisServer() { kill_now(); }
  // Returns an empty string on success, else why it failed.
  std::string start(const std::string& binary) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      pid_t parent = getpid();
      pid_ = fork();
      if (pid_ == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        std::string port = std::to_string(port_);
        execl(binary.c_str(), binary.c_str(), "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--dir", "/tmp",
              static_cast<char*>(nullptr));
        _exit(127);
      }
      for (int i = 0; i < 200; ++i) {  // up to ~4 s
        if (ping()) return "";
        int st;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
          pid_ = -1;
          break;  // exited (port taken?): retry with another port
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      kill_now();
    }
    return "redis-server did not come up";
  }
  bool ping() {
    struct timeval tv = {0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    bool ok = false;
    if (c && !c->err) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
  }
  long long integer_command(const char* cmd, const std::string& arg = "") {
    struct timeval tv = {1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    long long v = -100;
    if (c && !c->err) {
      auto* r = static_cast<redisReply*>(arg.empty() ? redisCommand(c, cmd)
                                                     : redisCommand(c, "%s %b", cmd, arg.data(), arg.size()));
      if (r && r->type == REDIS_REPLY_INTEGER) v = r->integer;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return v;
  }
  void kill_now() {
    if (pid_ > 0) {
      kill(pid_, SIGCONT);
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  void pause() { kill(pid_, SIGSTOP); }
  void resume() { kill(pid_, SIGCONT); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

class RedisPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string bin = find_redis_server();
    ASSERT_FALSE(bin.empty()) << "redis-server is not installed: the Redis SWA pool tests need it "
                                 "(Debian package redis-server, listed in .ci/packages.txt)";
    for (auto& s : servers_) {
      std::string err = s.start(bin);
      ASSERT_TRUE(err.empty()) << err;
    }
    config_.nodes = {servers_[0].address(), servers_[1].address()};
    config_.timeout_ms = 200;
    config_.ttl_ns = 300 * kNsPerSecond;
    config_.down_retry_ns = 1 * kNsPerSecond;
  }
  std::unique_ptr<RedisSwaPool> make() {
    auto p = RedisSwaPool::create(config_, clock_, metrics_);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return std::move(*p);
  }
  static BlockKey key(uint64_t i) { return BlockKey{i * 0x9e3779b97f4a7c15ULL, i}; }
  static std::vector<uint8_t> value(uint64_t i, size_t n = 100000) { return testing::make_payload(i, n); }
  uint64_t errors(size_t node, const char* reason) {
    return metrics_.counter_value("ds41_kv_swa_redis_errors_total",
                                  {{"node", config_.nodes[node]}, {"reason", reason}});
  }

  RedisServer servers_[2];
  RedisSwaPoolConfig config_;
  FakeClock clock_;  // drives only the down-retry window; Redis keeps its own time for TTLs
  MetricsRegistry metrics_;
};

TEST_F(RedisPoolTest, ShardedRoundTripOverTwoNodes) {
  auto p = make();
  size_t per_node[2] = {0, 0};
  for (uint64_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(p->put(key(i), value(i)).ok()) << i;
    per_node[p->node_for(key(i))]++;
  }
  EXPECT_GT(per_node[0], 5u);
  EXPECT_GT(per_node[1], 5u);
  EXPECT_EQ(servers_[0].integer_command("DBSIZE"), static_cast<long long>(per_node[0]));
  EXPECT_EQ(servers_[1].integer_command("DBSIZE"), static_cast<long long>(per_node[1]));
  for (uint64_t i = 0; i < 40; ++i) {
    // The key lives on exactly the node node_for() names.
    EXPECT_EQ(servers_[p->node_for(key(i))].integer_command("EXISTS", p->redis_key(key(i))), 1);
    SwaBytes b = p->get(key(i));
    ASSERT_TRUE(b) << i;
    EXPECT_EQ(*b, value(i));
    EXPECT_TRUE(p->contains(key(i)));
  }
  EXPECT_FALSE(p->get(key(1000)));
  EXPECT_FALSE(p->contains(key(1000)));
  ASSERT_TRUE(p->erase(key(3)).ok());
  EXPECT_FALSE(p->get(key(3)));
  EXPECT_EQ(metrics_.counter_value("ds41_kv_swa_hits_total", {{"backend", "redis"}}), 40u);
  // A 2.7 MB snapshot (the released model's SWA size) round-trips.
  ASSERT_TRUE(p->put(key(77), value(77, 2700000)).ok());
  EXPECT_EQ(*p->get(key(77)), value(77, 2700000));
}

TEST_F(RedisPoolTest, TtlUsesNativeRedisExpiry) {
  auto p = make();
  ASSERT_TRUE(p->put(key(1), value(1, 100)).ok());
  auto ttl = p->pttl_ms(key(1));
  ASSERT_TRUE(ttl.ok()) << ttl.status().to_string();
  EXPECT_GT(*ttl, 290000);
  EXPECT_LE(*ttl, 300000);
  ASSERT_TRUE(p->put(key(2), value(2, 100), 5 * kNsPerSecond).ok());  // per-entry TTL
  ttl = p->pttl_ms(key(2));
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(*ttl, 0);
  EXPECT_LE(*ttl, 5000);
  EXPECT_EQ(*p->pttl_ms(key(3)), -2);  // absent
  // Overwriting resets the expiry.
  ASSERT_TRUE(p->put(key(2), value(2, 100)).ok());
  EXPECT_GT(*p->pttl_ms(key(2)), 290000);
}

TEST_F(RedisPoolTest, NodeKilledMidTestEveryLookupReturnsInTime) {
  auto p = make();
  for (uint64_t i = 0; i < 60; ++i) ASSERT_TRUE(p->put(key(i), value(i, 20000)).ok());
  servers_[1].kill_now();
  // No wall-clock bound here (issue 9: a timed assertion is not a correctness test). "Returns in
  // time" is what the counters show: every call on the dead node ended as a connect/io error or
  // was skipped inside the down window, and a hang would be the test's own timeout.
  int hits = 0, misses = 0;
  for (int round = 0; round < 3; ++round) {
    for (uint64_t i = 0; i < 60; ++i) {
      SwaBytes b;
      bool has = false;
      Status put_status;
      EXPECT_NO_THROW({
        b = p->get(key(i));
        has = p->contains(key(i));
        put_status = p->put(key(i + 1000), value(i, 1000));
      });
      if (p->node_for(key(i)) == 0) {
        ASSERT_TRUE(b) << "key " << i << " lives on the surviving node";
        EXPECT_EQ(*b, value(i, 20000));
        EXPECT_TRUE(has);
        ++hits;
      } else {
        EXPECT_FALSE(b);
        EXPECT_FALSE(has);
        ++misses;
      }
      if (p->node_for(key(i + 1000)) == 1) {
        EXPECT_EQ(put_status.code(), StatusCode::kUnavailable);
      }
    }
    clock_.advance_s(2);  // past down_retry: the dead node is tried (and fails fast) again
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0);
  EXPECT_GT(errors(1, "io") + errors(1, "connect"), 0u);
  EXPECT_GT(errors(1, "down"), 0u);  // calls in the down window skipped the node outright
  EXPECT_EQ(errors(0, "io") + errors(0, "connect") + errors(0, "timeout"), 0u);
  EXPECT_GT(metrics_.counter_value("ds41_kv_swa_misses_total", {{"backend", "redis"}}), 0u);
}

TEST_F(RedisPoolTest, SlowNodeTimesOutThenRecovers) {
  auto p = make();
  uint64_t k1 = 0;
  while (p->node_for(key(k1)) != 1) ++k1;
  ASSERT_TRUE(p->put(key(k1), value(k1)).ok());
  servers_[1].pause();  // SIGSTOP: connected but never answers
  // No wall-clock bounds (issue 9): the outcome is read from the per-reason error counters. The
  // call returning at all proves the timeout fired (a stopped server never answers).
  SwaBytes b = p->get(key(k1));
  EXPECT_FALSE(b);
  EXPECT_EQ(errors(1, "timeout"), 1u);
  EXPECT_EQ(errors(1, "down"), 0u);
  // Within the down window (the FakeClock has not moved) the node is skipped without a request:
  // counted as "down", no second timeout.
  EXPECT_FALSE(p->get(key(k1)));
  EXPECT_EQ(errors(1, "timeout"), 1u);
  EXPECT_EQ(errors(1, "down"), 1u);
  servers_[1].resume();
  clock_.advance_s(2);
  b = p->get(key(k1));
  ASSERT_TRUE(b);
  EXPECT_EQ(*b, value(k1));
}

TEST_F(RedisPoolTest, KvStoreWithRedisBackend) {
  testing::ScratchDir dir("redis-store");
  KvStoreConfig c;
  c.model_identity = "m";
  c.disk.dir = dir.sub("store");
  c.disk.capacity_bytes = 1 << 30;
  c.disk.sync = false;
  c.swa_backend = SwaBackend::kRedis;
  c.redis = config_;
  auto s = KvStore::open(c, PosixIo::instance(), clock_, metrics_);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto toks = testing::make_tokens(3, 1000);
  ASSERT_TRUE((*s)->put_swa(toks, value(5, 50000)).ok());
  auto snap = (*s)->get_swa(toks);
  ASSERT_TRUE(snap.has_value());
  auto want = value(5, 50000);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), snap->payload().begin(), snap->payload().end()));
  EXPECT_FALSE((*s)->get_swa(std::span(toks).first(999)).has_value());
  servers_[0].kill_now();
  servers_[1].kill_now();
  EXPECT_FALSE((*s)->get_swa(toks).has_value());  // all nodes gone: a miss, nothing else
  EXPECT_EQ((*s)->lookup(toks).cached_blocks, 0u);
}

}  // namespace
}  // namespace ds41::kvcache
