// ds41 kvcache: the in-process index of the persistent tier — per block its size, publish time
// and last use, split by retention (docs/formats/kv_block.md "Retention and eviction"): blocks
// younger than the retention period are never evicted (ordered by publish time); older ones are
// evictable in least-recently-used order. Keeps the byte total. No I/O, no clock and no lock of
// its own: DiskTier passes the time in and guards it with its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "kvcache/block_key.h"

namespace ds41::kvcache {

class BlockIndex {
 public:
  struct Entry {
    uint64_t bytes = 0;
    int64_t created_ns = 0;  // publish time (file mtime)
    int64_t access_ns = 0;   // last use (file atime, stamped explicitly)
    bool old = false;        // past retention (in the LRU set); set by the index
  };
  using Map = std::unordered_map<BlockKey, Entry, BlockKeyHash>;
  // (time, key) pairs: publish time for the retained set, last use for the LRU set.
  using TimeOrdered = std::set<std::pair<int64_t, BlockKey>, std::less<>>;

  explicit BlockIndex(int64_t retention_ns) : retention_ns_(retention_ns) {}

  // Replaces everything with `fresh`, keeping access times this index knows to be newer for
  // blocks whose publish time is unchanged (a throttled touch may not be on disk yet).
  void replace_all(Map fresh, int64_t now_ns);
  // Adds (or replaces) one block; `e.old` is derived from its publish time.
  void insert(const BlockKey& key, Entry e, int64_t now_ns);
  void remove(const BlockKey& key);  // no-op when absent
  void touch(const BlockKey& key, int64_t access_ns);
  // Moves blocks whose retention ended by `now_ns` into the LRU set.
  void promote_aged(int64_t now_ns);

  const Entry* find(const BlockKey& key) const;
  bool contains(const BlockKey& key) const { return map_.count(key) != 0; }
  size_t size() const { return map_.size(); }
  uint64_t used_bytes() const { return used_bytes_; }
  // The least recently used block past retention (the next eviction), if any.
  std::optional<BlockKey> lru_victim() const;

  const Map& entries() const { return map_; }
  const TimeOrdered& retained() const { return young_; }  // under retention, oldest first
  const TimeOrdered& lru() const { return old_lru_; }     // evictable, least recent first

 private:
  bool past_retention(int64_t created_ns, int64_t now_ns) const {
    return created_ns <= now_ns - retention_ns_;
  }

  int64_t retention_ns_;
  Map map_;
  TimeOrdered young_;
  TimeOrdered old_lru_;
  uint64_t used_bytes_ = 0;
};

}  // namespace ds41::kvcache
