// ds41 engine: the bounded LRU of image span embeddings (see vision_feature_cache.h).
#include "engine/vision_feature_cache.h"

namespace ds41::engine {

SpanEmbeds VisionFeatureCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++st_.misses;
    return nullptr;
  }
  ++st_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void VisionFeatureCache::insert(const std::string& key, SpanEmbeds value) {
  if (!value) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    st_.bytes -= cost(it->second->second);
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (cost(value) > capacity_) return;
  lru_.emplace_front(key, std::move(value));
  index_[key] = lru_.begin();
  st_.bytes += cost(lru_.front().second);
  while (st_.bytes > capacity_ && !lru_.empty()) {
    st_.bytes -= cost(lru_.back().second);
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++st_.evictions;
  }
}

VisionCacheStats VisionFeatureCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  VisionCacheStats s = st_;
  s.entries = static_cast<int64_t>(index_.size());
  s.capacity_bytes = capacity_;
  return s;
}

}  // namespace ds41::engine
