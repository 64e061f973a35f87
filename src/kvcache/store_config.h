// ds41 kvcache: typed configuration of the two-class KV store (persistent global-KV tier, async
// writer, SWA pools) with validation that names the offending field, plus the parsers for the
// flag spellings (`--kv-retention 72h`, `--kv-disk-capacity 500G`). Defaults follow the
// DeepSeek serving design: 128-token blocks, 72 h retention, SWA pool = 10 % of host memory,
// SWA TTL of minutes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds41::kvcache {

inline constexpr int64_t kNsPerSecond = 1'000'000'000LL;

struct DiskTierConfig {
  std::string dir;                                    // required; created if missing
  uint64_t capacity_bytes = 0;                        // required (> 0): --kv-disk-capacity
  int64_t retention_ns = 72LL * 3600 * kNsPerSecond;  // --kv-retention; never evict younger blocks
  uint64_t model_fingerprint = 0;  // stored in every header; blocks of another fingerprint are misses
  bool sync = true;                // fsync file + directory on publish (off only for benchmarks/tmpfs)
  // A read hit stamps the file's atime (the cross-process LRU clock) at most this often per block.
  int64_t touch_interval_ns = 60 * kNsPerSecond;
  // Temp files older than this (by mtime vs the clock) are removed at start-up (crashed writers).
  int64_t stale_tmp_age_ns = 3600 * kNsPerSecond;
  // Re-list the directory at most this often (other processes' writes/evictions); 0 = never.
  int64_t rescan_interval_ns = 600 * kNsPerSecond;
  // Threads listing/stat-ing the 256 block directories in parallel at open and rescan
  // (0 = min(16, hardware threads)); a million blocks are a million stat calls.
  int scan_threads = 0;
  Status validate() const;
};

struct AsyncWriterConfig {
  int threads = 8;                      // concurrent writers (fsync latency overlaps)
  size_t queue_blocks = 256;            // bounded queue: max pending blocks
  uint64_t queue_bytes = 256ULL << 20;  // and max pending payload bytes
  // Most blocks one writer thread publishes per group commit (its share of the queue, capped).
  size_t max_batch = 32;
  Status validate() const;
};

struct DramSwaPoolConfig {
  double memory_fraction = 0.10;  // of host memory, used when capacity_bytes == 0
  uint64_t capacity_bytes = 0;    // explicit cap (overrides the fraction)
  int64_t ttl_ns = 300 * kNsPerSecond;
  Status validate() const;
  // The byte cap for a host with `host_memory_bytes` of RAM.
  uint64_t resolved_capacity(uint64_t host_memory_bytes) const;
};

struct RedisSwaPoolConfig {
  std::vector<std::string> nodes;            // "host:port", >= 1 (sharded by key)
  int timeout_ms = 200;                      // connect and per-command timeout; a slower node is a miss
  int64_t ttl_ns = 300 * kNsPerSecond;       // native Redis expiry (SET PX)
  int64_t down_retry_ns = 1 * kNsPerSecond;  // after an error, skip the node this long
  int connections_per_node = 4;
  std::string key_prefix = "ds41:swa:";
  Status validate() const;
};

enum class SwaBackend { kDram, kRedis };

struct KvStoreConfig {
  std::string model_identity;      // hashed into every key (required)
  uint64_t model_fingerprint = 0;  // stored in every header
  uint32_t block_tokens = 128;
  DiskTierConfig disk;
  AsyncWriterConfig writer;
  SwaBackend swa_backend = SwaBackend::kDram;
  DramSwaPoolConfig dram;
  RedisSwaPoolConfig redis;
  Status validate() const;
};

// Physical memory of this host in bytes (sysconf).
uint64_t host_memory_bytes();
// "72h", "90m", "30s", "500ms", "3d", or a bare number of seconds -> ns.
Result<int64_t> parse_duration_ns(std::string_view text);
// "500G", "64M", "1T", "4096" (bytes; K/M/G/T are powers of 1024, optional trailing "B"/"iB").
Result<uint64_t> parse_byte_size(std::string_view text);
// "host:port" -> (host, port) with port in 1..65535.
Status parse_host_port(std::string_view text, std::string* host, int* port);

}  // namespace ds41::kvcache
