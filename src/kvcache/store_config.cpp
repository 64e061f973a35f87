// ds41 kvcache: config validation and flag-value parsers.
#include "kvcache/store_config.h"

#include <unistd.h>

#include <charconv>
#include <cmath>

namespace ds41::kvcache {
namespace {

// Parses a non-negative decimal (integer or fraction) prefix; returns chars consumed or 0.
size_t parse_number(std::string_view s, double* out) {
  size_t i = 0;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
  if (i == 0) return 0;
  std::string tmp(s.substr(0, i));
  char* end = nullptr;
  *out = std::strtod(tmp.c_str(), &end);
  if (end != tmp.c_str() + tmp.size()) return 0;
  return i;
}

}  // namespace

Status DiskTierConfig::validate() const {
  if (dir.empty()) return invalid_argument("kv disk tier: dir (--kv-dir) must be set");
  if (capacity_bytes == 0)
    return invalid_argument("kv disk tier: capacity_bytes (--kv-disk-capacity) must be > 0");
  if (retention_ns < 0) return invalid_argument("kv disk tier: retention (--kv-retention) must be >= 0");
  if (touch_interval_ns < 0) return invalid_argument("kv disk tier: touch_interval must be >= 0");
  if (stale_tmp_age_ns <= 0) return invalid_argument("kv disk tier: stale_tmp_age must be > 0");
  if (rescan_interval_ns < 0) return invalid_argument("kv disk tier: rescan_interval must be >= 0");
  if (scan_threads < 0 || scan_threads > 256)
    return invalid_argument("kv disk tier: scan_threads must be in 0..256, got " +
                            std::to_string(scan_threads));
  return ok_status();
}

Status AsyncWriterConfig::validate() const {
  if (threads < 1 || threads > 256)
    return invalid_argument("kv async writer: threads must be in [1, 256], got " + std::to_string(threads));
  if (queue_blocks < 1) return invalid_argument("kv async writer: queue_blocks must be >= 1");
  if (queue_bytes < 1) return invalid_argument("kv async writer: queue_bytes must be >= 1");
  if (max_batch < 1 || max_batch > 4096)
    return invalid_argument("kv async writer: max_batch must be in [1, 4096], got " +
                            std::to_string(max_batch));
  return ok_status();
}

Status DramSwaPoolConfig::validate() const {
  if (capacity_bytes == 0 && !(memory_fraction > 0.0 && memory_fraction <= 0.9))
    return invalid_argument("kv swa pool: memory_fraction must be in (0, 0.9], got " +
                            std::to_string(memory_fraction));
  if (ttl_ns <= 0) return invalid_argument("kv swa pool: ttl must be > 0");
  return ok_status();
}

uint64_t DramSwaPoolConfig::resolved_capacity(uint64_t host_memory) const {
  if (capacity_bytes > 0) return capacity_bytes;
  return static_cast<uint64_t>(std::floor(static_cast<double>(host_memory) * memory_fraction));
}

Status RedisSwaPoolConfig::validate() const {
  if (nodes.empty()) return invalid_argument("kv redis swa pool: at least one node (host:port) is required");
  for (const auto& n : nodes) {
    std::string h;
    int p;
    DS41_RETURN_IF_ERROR(parse_host_port(n, &h, &p).with_context("kv redis swa pool: node"));
  }
  if (timeout_ms < 1 || timeout_ms > 60000)
    return invalid_argument("kv redis swa pool: timeout_ms must be in [1, 60000], got " +
                            std::to_string(timeout_ms));
  if (ttl_ns < 1'000'000) return invalid_argument("kv redis swa pool: ttl must be >= 1 ms");
  if (down_retry_ns < 0) return invalid_argument("kv redis swa pool: down_retry must be >= 0");
  if (connections_per_node < 1 || connections_per_node > 64)
    return invalid_argument("kv redis swa pool: connections_per_node must be in [1, 64]");
  return ok_status();
}

Status KvStoreConfig::validate() const {
  if (model_identity.empty()) return invalid_argument("kv store: model_identity must be set");
  if (block_tokens == 0 || block_tokens > (1u << 20))
    return invalid_argument("kv store: block_tokens must be in [1, 1048576], got " +
                            std::to_string(block_tokens));
  DS41_RETURN_IF_ERROR(disk.validate());
  DS41_RETURN_IF_ERROR(writer.validate());
  if (swa_backend == SwaBackend::kDram) DS41_RETURN_IF_ERROR(dram.validate());
  if (swa_backend == SwaBackend::kRedis) DS41_RETURN_IF_ERROR(redis.validate());
  return ok_status();
}

uint64_t host_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

Result<int64_t> parse_duration_ns(std::string_view text) {
  double v;
  size_t n = parse_number(text, &v);
  if (n == 0)
    return invalid_argument("duration '" + std::string(text) + "': expected e.g. 72h, 90m, 30s, 500ms");
  std::string_view unit = text.substr(n);
  double mult;
  if (unit.empty() || unit == "s")
    mult = 1e9;
  else if (unit == "ms")
    mult = 1e6;
  else if (unit == "m" || unit == "min")
    mult = 60e9;
  else if (unit == "h")
    mult = 3600e9;
  else if (unit == "d")
    mult = 86400e9;
  else
    return invalid_argument("duration '" + std::string(text) + "': unknown unit '" + std::string(unit) + "'");
  double ns = v * mult;
  if (ns > 9.2e18) return out_of_range("duration '" + std::string(text) + "' is too large");
  return static_cast<int64_t>(ns);
}

Result<uint64_t> parse_byte_size(std::string_view text) {
  double v;
  size_t n = parse_number(text, &v);
  if (n == 0) return invalid_argument("size '" + std::string(text) + "': expected e.g. 500G, 64M, 4096");
  std::string_view unit = text.substr(n);
  if (unit.ends_with("iB"))
    unit.remove_suffix(2);
  else if (unit.ends_with("B"))
    unit.remove_suffix(1);
  double mult;
  if (unit.empty())
    mult = 1;
  else if (unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return invalid_argument("size '" + std::string(text) + "': unknown unit '" + std::string(unit) + "'");
  double b = v * mult;
  if (b > 1.8e19) return out_of_range("size '" + std::string(text) + "' is too large");
  return static_cast<uint64_t>(b);
}

Status parse_host_port(std::string_view text, std::string* host, int* port) {
  size_t c = text.rfind(':');
  if (c == std::string_view::npos || c == 0 || c + 1 == text.size())
    return invalid_argument("'" + std::string(text) + "' is not host:port");
  int p = 0;
  auto r = std::from_chars(text.data() + c + 1, text.data() + text.size(), p);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || p < 1 || p > 65535)
    return invalid_argument("'" + std::string(text) + "': port must be 1..65535");
  *host = std::string(text.substr(0, c));
  *port = p;
  return ok_status();
}

}  // namespace ds41::kvcache
