// ds41 kvcache: DramSwaPool implementation (one mutex; values are shared_ptr so a get never
// copies the multi-megabyte snapshot and an eviction never invalidates a reader).
#include "kvcache/dram_swa_pool.h"

namespace ds41::kvcache {
namespace {
const MetricLabels kDram = {{"backend", "dram"}};
}

DramSwaPool::DramSwaPool(const DramSwaPoolConfig& config, uint64_t capacity, Clock& clock, MetricsRegistry& m)
    : config_(config),
      capacity_(capacity),
      clock_(clock),
      hits_(m.counter("ds41_kv_swa_hits_total", "SWA snapshot lookups that hit", kDram)),
      misses_(m.counter("ds41_kv_swa_misses_total", "SWA snapshot lookups that missed", kDram)),
      puts_(m.counter("ds41_kv_swa_puts_total", "SWA snapshots stored", kDram)),
      refused_(m.counter("ds41_kv_swa_put_errors_total", "SWA snapshot stores that failed", kDram)),
      evict_ttl_(m.counter("ds41_kv_swa_evictions_total", "SWA snapshots removed before a get",
                           {{"backend", "dram"}, {"reason", "ttl"}})),
      evict_lru_(m.counter("ds41_kv_swa_evictions_total", "SWA snapshots removed before a get",
                           {{"backend", "dram"}, {"reason", "lru"}})),
      bytes_(m.gauge("ds41_kv_swa_bytes", "Bytes charged to the SWA pool", kDram)),
      entries_(m.gauge("ds41_kv_swa_entries", "SWA snapshots held", kDram)),
      capacity_gauge_(m.gauge("ds41_kv_swa_capacity_bytes", "SWA pool byte cap", kDram)) {
  capacity_gauge_.set(static_cast<int64_t>(capacity_));
}

Result<std::unique_ptr<DramSwaPool>> DramSwaPool::create(const DramSwaPoolConfig& config, Clock& clock,
                                                         MetricsRegistry& metrics, uint64_t host_memory) {
  DS41_RETURN_IF_ERROR(config.validate());
  uint64_t cap = config.resolved_capacity(host_memory);
  if (cap == 0)
    return invalid_argument("kv swa pool: capacity resolves to 0 bytes (host memory " +
                            std::to_string(host_memory) + " x fraction " +
                            std::to_string(config.memory_fraction) + ")");
  return std::unique_ptr<DramSwaPool>(new DramSwaPool(config, cap, clock, metrics));
}

void DramSwaPool::remove_locked(std::unordered_map<BlockKey, Entry, BlockKeyHash>::iterator it) {
  used_ -= charge(it->second);
  lru_.erase(it->second.lru_it);
  by_expiry_.erase({it->second.expires_ns, it->first});
  map_.erase(it);
  bytes_.set(static_cast<int64_t>(used_));
  entries_.set(static_cast<int64_t>(map_.size()));
}

void DramSwaPool::reclaim_expired_locked(int64_t now) {
  while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
    auto it = map_.find(by_expiry_.begin()->second);
    remove_locked(it);
    evict_ttl_.inc();
  }
}

void DramSwaPool::reclaim_expired() {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_expired_locked(clock_.now_mono_ns());
}

Status DramSwaPool::check_fits(uint64_t bytes) {
  if (bytes + kEntryOverheadBytes <= capacity_) return ok_status();
  refused_.inc();
  return resource_exhausted("kv swa pool: snapshot of " + std::to_string(bytes) +
                            " bytes exceeds the pool capacity of " + std::to_string(capacity_) + " bytes");
}

Status DramSwaPool::put(const BlockKey& key, std::span<const uint8_t> value, int64_t ttl_ns) {
  if (ttl_ns < 0) return invalid_argument("kv swa pool: ttl must be >= 0");
  DS41_RETURN_IF_ERROR(check_fits(value.size()));  // before copying
  return put_owned(key, std::vector<uint8_t>(value.begin(), value.end()), ttl_ns);
}

Status DramSwaPool::put_owned(const BlockKey& key, std::vector<uint8_t> value, int64_t ttl_ns) {
  if (ttl_ns < 0) return invalid_argument("kv swa pool: ttl must be >= 0");
  const int64_t ttl = ttl_ns == 0 ? config_.ttl_ns : ttl_ns;
  const uint64_t need = value.capacity() + kEntryOverheadBytes;
  DS41_RETURN_IF_ERROR(check_fits(value.capacity()));
  // The buffer becomes the stored value (no copy); built outside the lock.
  auto bytes = std::make_shared<const std::vector<uint8_t>>(std::move(value));
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = clock_.now_mono_ns();
  reclaim_expired_locked(now);
  if (auto it = map_.find(key); it != map_.end()) remove_locked(it);
  while (used_ + need > capacity_) {
    auto victim = map_.find(lru_.back());
    remove_locked(victim);
    evict_lru_.inc();
  }
  lru_.push_front(key);
  Entry e{std::move(bytes), now + ttl, lru_.begin()};
  by_expiry_.emplace(e.expires_ns, key);
  used_ += charge(e);
  map_.emplace(key, std::move(e));
  puts_.inc();
  bytes_.set(static_cast<int64_t>(used_));
  entries_.set(static_cast<int64_t>(map_.size()));
  return ok_status();
}

SwaBytes DramSwaPool::get(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_expired_locked(clock_.now_mono_ns());
  auto it = map_.find(key);
  if (it == map_.end()) {
    misses_.inc();
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru_it);
  hits_.inc();
  return it->second.value;
}

bool DramSwaPool::contains(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_expired_locked(clock_.now_mono_ns());
  return map_.count(key) > 0;
}

Status DramSwaPool::erase(const BlockKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = map_.find(key); it != map_.end()) remove_locked(it);
  return ok_status();
}

uint64_t DramSwaPool::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

size_t DramSwaPool::entry_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

}  // namespace ds41::kvcache
