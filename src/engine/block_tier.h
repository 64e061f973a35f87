// ds41 engine: BlockTier — one in-memory tier of the prefix cache (the engine's own memory, or
// the host DRAM tier): global-KV block payloads by chain key, capped at a byte budget, with pins.
// A pinned block (in use by a running or preempted sequence) is never evicted; among unpinned
// blocks the least recently used goes first. Eviction hands the block to a callback (the engine
// tier demotes to the DRAM tier). Payloads are shared immutable buffers, so a block present in two
// tiers or handed to the disk writer is not copied.
//
// Thread model: used by the engine loop thread only, except the byte/block counts (atomics read
// by metrics).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kvcache/block_key.h"

namespace ds41::engine {

using BlockBytes = std::shared_ptr<const std::vector<uint8_t>>;

class BlockTier {
 public:
  using EvictFn = std::function<void(const kvcache::BlockKey&, BlockBytes)>;
  // capacity_bytes: payload bytes kept unpinned at most (pins may push the total past it: a
  // running sequence's blocks are never dropped). 0: the tier holds pinned blocks only.
  explicit BlockTier(uint64_t capacity_bytes, EvictFn on_evict = {});

  // Inserts (or refreshes as most recent) and evicts LRU unpinned blocks down to the capacity.
  void put(const kvcache::BlockKey& key, BlockBytes bytes);
  // The block (marked most recently used), or nullptr.
  BlockBytes get(const kvcache::BlockKey& key);
  bool contains(const kvcache::BlockKey& key) const { return map_.count(key) != 0; }
  // Pins count: a block stays while pinned >= 1. pin() of an absent block is a no-op returning
  // false.
  bool pin(const kvcache::BlockKey& key);
  void unpin(const kvcache::BlockKey& key);
  void erase(const kvcache::BlockKey& key);

  uint64_t bytes() const { return bytes_.load(); }
  uint64_t blocks() const { return blocks_.load(); }
  uint64_t pinned_blocks() const;
  uint64_t evictions() const { return evictions_.load(); }
  uint64_t capacity() const { return capacity_; }

 private:
  struct Entry {
    BlockBytes bytes;
    int pins = 0;
    std::list<kvcache::BlockKey>::iterator lru;  // front = most recent
  };
  void evict_to_capacity();

  uint64_t capacity_;
  EvictFn on_evict_;
  std::unordered_map<kvcache::BlockKey, Entry, kvcache::BlockKeyHash> map_;
  std::list<kvcache::BlockKey> lru_;
  std::atomic<uint64_t> bytes_{0}, blocks_{0}, evictions_{0};
};

}  // namespace ds41::engine
