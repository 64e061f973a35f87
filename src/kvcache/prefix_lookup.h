// ds41 kvcache: longest-cached-prefix lookup over both tiers. Given a token sequence, walks its
// block chain through the persistent tier until the first missing block, then asks the SWA pool
// whether a snapshot exists at exactly that prefix length. The answer is advisory (another
// process may evict a block before it is read); restore paths must handle a miss.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/block_key.h"
#include "kvcache/disk_tier.h"
#include "kvcache/swa_pool.h"

namespace ds41::kvcache {

struct PrefixLookupResult {
  size_t cached_blocks = 0;          // leading blocks present in the global tier
  size_t cached_tokens = 0;          // cached_blocks * block_tokens
  std::vector<BlockKey> block_keys;  // keys of those blocks, in order
  bool swa_snapshot = false;         // an SWA snapshot exists at exactly cached_tokens
  BlockKey swa_key;                  // its key (valid when cached_blocks > 0)
};

// `swa` may be null (no SWA pool). Only complete blocks count; max_tokens (0 = no limit) caps
// the walk, e.g. to leave the last prompt token uncached.
PrefixLookupResult lookup_longest_prefix(const BlockChainHasher& hasher, DiskTier& disk, SwaPool* swa,
                                         std::span<const int32_t> tokens, size_t max_tokens = 0);

}  // namespace ds41::kvcache
