// ds41 kvcache: BlockIndex — retention split and LRU order of the persistent tier's blocks.
#include "kvcache/block_index.h"

#include <algorithm>
#include <vector>

namespace ds41::kvcache {

void BlockIndex::replace_all(Map fresh, int64_t now_ns) {
  if (!map_.empty()) {
    for (auto& [k, e] : fresh) {
      auto it = map_.find(k);
      if (it != map_.end() && it->second.created_ns == e.created_ns)
        e.access_ns = std::max(e.access_ns, it->second.access_ns);
    }
  }
  // Bulk build of the two ordered sets: sort once, then append with an end() hint (linear)
  // instead of a million tree searches.
  std::vector<std::pair<int64_t, BlockKey>> young, old;
  uint64_t used = 0;
  for (auto& [k, e] : fresh) {
    e.old = past_retention(e.created_ns, now_ns);
    if (e.old)
      old.emplace_back(e.access_ns, k);
    else
      young.emplace_back(e.created_ns, k);
    used += e.bytes;
  }
  std::sort(young.begin(), young.end());
  std::sort(old.begin(), old.end());
  young_.clear();
  old_lru_.clear();
  for (const auto& p : young) young_.emplace_hint(young_.end(), p);
  for (const auto& p : old) old_lru_.emplace_hint(old_lru_.end(), p);
  map_ = std::move(fresh);
  used_bytes_ = used;
}

void BlockIndex::insert(const BlockKey& key, Entry e, int64_t now_ns) {
  remove(key);
  e.old = past_retention(e.created_ns, now_ns);
  if (e.old)
    old_lru_.emplace(e.access_ns, key);
  else
    young_.emplace(e.created_ns, key);
  map_[key] = e;
  used_bytes_ += e.bytes;
}

void BlockIndex::remove(const BlockKey& key) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  const Entry& e = it->second;
  if (e.old)
    old_lru_.erase({e.access_ns, key});
  else
    young_.erase({e.created_ns, key});
  used_bytes_ -= e.bytes;
  map_.erase(it);
}

void BlockIndex::touch(const BlockKey& key, int64_t access_ns) {
  auto it = map_.find(key);
  if (it == map_.end()) return;
  Entry& e = it->second;
  if (e.old) {
    old_lru_.erase({e.access_ns, key});
    old_lru_.emplace(access_ns, key);
  }
  e.access_ns = access_ns;
}

void BlockIndex::promote_aged(int64_t now_ns) {
  while (!young_.empty() && past_retention(young_.begin()->first, now_ns)) {
    BlockKey k = young_.begin()->second;
    young_.erase(young_.begin());
    Entry& e = map_.at(k);
    e.old = true;
    old_lru_.emplace(e.access_ns, k);
  }
}

const BlockIndex::Entry* BlockIndex::find(const BlockKey& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

std::optional<BlockKey> BlockIndex::lru_victim() const {
  if (old_lru_.empty()) return std::nullopt;
  return old_lru_.begin()->second;
}

}  // namespace ds41::kvcache
