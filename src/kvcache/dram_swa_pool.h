// ds41 kvcache: the embedded SWA pool — an in-process DRAM map capped at a byte budget (default
// 10 % of host memory), each entry with a TTL from the injectable Clock. Expired entries are
// reclaimed at the start of every operation (so their memory is free before any LRU decision)
// and by reclaim_expired(); among live entries the least recently used is evicted when full.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/clock.h"
#include "kvcache/metrics.h"
#include "kvcache/store_config.h"
#include "kvcache/swa_pool.h"

namespace ds41::kvcache {

class DramSwaPool final : public SwaPool {
 public:
  // Bookkeeping bytes charged per entry on top of its value (map node, LRU node, expiry node).
  static constexpr uint64_t kEntryOverheadBytes = 160;

  // capacity = config.resolved_capacity(host_memory); `clock`, `metrics` must outlive the pool.
  static Result<std::unique_ptr<DramSwaPool>> create(const DramSwaPoolConfig& config, Clock& clock,
                                                     MetricsRegistry& metrics,
                                                     uint64_t host_memory = host_memory_bytes());

  // kResourceExhausted when one entry is larger than the whole pool.
  Status put(const BlockKey& key, std::span<const uint8_t> value, int64_t ttl_ns = 0) override;
  Status put_owned(const BlockKey& key, std::vector<uint8_t> value, int64_t ttl_ns = 0) override;
  SwaBytes get(const BlockKey& key) override;
  bool contains(const BlockKey& key) override;
  Status erase(const BlockKey& key) override;
  const char* backend_name() const override { return "dram"; }

  // Drops every expired entry now.
  void reclaim_expired();
  uint64_t used_bytes() const;
  size_t entry_count() const;
  uint64_t capacity_bytes() const { return capacity_; }

 private:
  struct Entry {
    SwaBytes value;
    int64_t expires_ns;
    std::list<BlockKey>::iterator lru_it;  // position in lru_ (front = most recent)
  };
  DramSwaPool(const DramSwaPoolConfig& config, uint64_t capacity, Clock& clock, MetricsRegistry& m);
  void reclaim_expired_locked(int64_t now);
  void remove_locked(std::unordered_map<BlockKey, Entry, BlockKeyHash>::iterator it);
  // The buffer's capacity, not its size: an owned buffer may have spare room (put_owned).
  static uint64_t charge(const Entry& e) { return e.value->capacity() + kEntryOverheadBytes; }
  // kResourceExhausted (counted) when a value of `bytes` can never fit.
  Status check_fits(uint64_t bytes);

  DramSwaPoolConfig config_;
  uint64_t capacity_;
  Clock& clock_;
  mutable std::mutex mu_;  // guards everything below
  std::unordered_map<BlockKey, Entry, BlockKeyHash> map_;
  std::list<BlockKey> lru_;
  std::set<std::pair<int64_t, BlockKey>> by_expiry_;
  uint64_t used_ = 0;

  Counter& hits_;
  Counter& misses_;
  Counter& puts_;
  Counter& refused_;
  Counter& evict_ttl_;
  Counter& evict_lru_;
  Gauge& bytes_;
  Gauge& entries_;
  Gauge& capacity_gauge_;
};

}  // namespace ds41::kvcache
