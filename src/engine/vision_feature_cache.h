// ds41 engine: VisionFeatureCache — the image span embeddings (aligner outputs laid out with the
// delimiters, MODEL_SPEC 3.11) of recently seen images, keyed by the image bytes' hash and the
// vision config, in a bounded host-memory LRU. An agent that resends the same screenshot every
// turn pays the tower once. It is the hand-off point an encoder process would fill under
// Encoder-Prefill-Decode disaggregation (docs/vision.md). Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ds41::engine {

using SpanEmbeds = std::shared_ptr<const std::vector<float>>;

struct VisionCacheStats {
  int64_t hits = 0, misses = 0, entries = 0, bytes = 0, capacity_bytes = 0, evictions = 0;
};

class VisionFeatureCache {
 public:
  explicit VisionFeatureCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The entry for key (moved to most recent), or null; counts a hit or a miss.
  SpanEmbeds find(const std::string& key);
  // Inserts (or replaces) key, then evicts least-recent entries over capacity. An entry larger
  // than the whole capacity is not kept.
  void insert(const std::string& key, SpanEmbeds value);
  VisionCacheStats stats() const;

 private:
  using Lru = std::list<std::pair<std::string, SpanEmbeds>>;
  static int64_t cost(const SpanEmbeds& v) { return static_cast<int64_t>(v->size() * sizeof(float)); }

  const int64_t capacity_;
  mutable std::mutex mu_;  // guards everything below
  Lru lru_;                // front = most recent
  std::unordered_map<std::string, Lru::iterator> index_;
  VisionCacheStats st_;
};

}  // namespace ds41::engine
