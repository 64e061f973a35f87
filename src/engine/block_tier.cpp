// ds41 engine: BlockTier (block_tier.h).
#include "engine/block_tier.h"

namespace ds41::engine {

BlockTier::BlockTier(uint64_t capacity_bytes, EvictFn on_evict)
    : capacity_(capacity_bytes), on_evict_(std::move(on_evict)) {}

void BlockTier::put(const kvcache::BlockKey& key, BlockBytes bytes) {
  auto it = map_.find(key);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;  // content address: same key, same bytes
  }
  lru_.push_front(key);
  bytes_ += bytes->size();
  ++blocks_;
  map_.emplace(key, Entry{std::move(bytes), 0, lru_.begin()});
  evict_to_capacity();
}

BlockBytes BlockTier::get(const kvcache::BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.bytes;
}

bool BlockTier::pin(const kvcache::BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  ++it->second.pins;
  return true;
}

void BlockTier::unpin(const kvcache::BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end() || it->second.pins == 0) return;
  --it->second.pins;
  if (it->second.pins == 0) evict_to_capacity();
}

void BlockTier::erase(const kvcache::BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  bytes_ -= it->second.bytes->size();
  --blocks_;
  lru_.erase(it->second.lru);
  map_.erase(it);
}

uint64_t BlockTier::pinned_blocks() const {
  uint64_t n = 0;
  for (const auto& [k, e] : map_) n += e.pins > 0;
  return n;
}

void BlockTier::evict_to_capacity() {
  // Walk from the least recent end, skipping pinned blocks.
  for (auto it = lru_.end(); bytes_.load() > capacity_ && it != lru_.begin();) {
    --it;
    auto m = map_.find(*it);
    if (m->second.pins > 0) continue;
    kvcache::BlockKey key = *it;
    BlockBytes b = std::move(m->second.bytes);
    bytes_ -= b->size();
    --blocks_;
    ++evictions_;
    it = lru_.erase(it);
    map_.erase(m);
    if (on_evict_) on_evict_(key, std::move(b));
  }
}

}  // namespace ds41::engine
