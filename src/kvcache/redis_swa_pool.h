// ds41 kvcache: the distributed SWA pool — snapshots in Redis, sharded over the configured nodes
// by key (jump consistent hash of the key), TTL by native Redis expiry (SET ... PX). Every call is
// bounded by the configured timeout (connect and each socket read/write); a node that errors or
// times out is skipped for down_retry so later calls miss at once instead of waiting again. Any
// failure is a miss plus a metric (ds41_kv_swa_redis_errors_total{node,reason}); nothing throws.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "kvcache/metrics.h"
#include "kvcache/store_config.h"
#include "kvcache/swa_pool.h"

struct redisContext;
struct redisReply;

namespace ds41::kvcache {

class RedisSwaPool final : public SwaPool {
 public:
  // Does not connect yet (nodes may come up later). `clock` (for the down-retry window) and
  // `metrics` must outlive the pool.
  static Result<std::unique_ptr<RedisSwaPool>> create(const RedisSwaPoolConfig& config, Clock& clock,
                                                      MetricsRegistry& metrics);
  ~RedisSwaPool() override;

  Status put(const BlockKey& key, std::span<const uint8_t> value, int64_t ttl_ns = 0) override;
  SwaBytes get(const BlockKey& key) override;
  bool contains(const BlockKey& key) override;
  Status erase(const BlockKey& key) override;
  const char* backend_name() const override { return "redis"; }

  // Which node (index into config.nodes) owns `key`.
  size_t node_for(const BlockKey& key) const;
  // Remaining TTL of a key in ms as Redis reports it (PTTL): -2 absent, -1 no expiry.
  Result<int64_t> pttl_ms(const BlockKey& key);
  std::string redis_key(const BlockKey& key) const { return config_.key_prefix + key.hex(); }

 private:
  struct Slot;
  struct Node;
  struct ReplyDeleter {
    void operator()(redisReply* r) const;
  };
  using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

  RedisSwaPool(const RedisSwaPoolConfig& config, Clock& clock, MetricsRegistry& metrics);
  // Runs one command on the node owning `key`; unavailable() on any transport error or timeout.
  Result<ReplyPtr> command(const BlockKey& key, std::vector<std::string_view> argv);

  RedisSwaPoolConfig config_;
  Clock& clock_;
  std::vector<std::unique_ptr<Node>> nodes_;
  MetricsRegistry& metrics_;
  Counter& hits_;
  Counter& misses_;
  Counter& puts_;
  Counter& put_errors_;
};

}  // namespace ds41::kvcache
