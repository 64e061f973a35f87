// ds41 kvcache: longest-prefix lookup (chain keys in one hashing pass, then a linear walk: block
// i's key names the whole prefix, so a present block after a missing one cannot be used).
#include "kvcache/prefix_lookup.h"

namespace ds41::kvcache {

PrefixLookupResult lookup_longest_prefix(const BlockChainHasher& hasher, DiskTier& disk, SwaPool* swa,
                                         std::span<const int32_t> tokens, size_t max_tokens) {
  if (max_tokens > 0 && tokens.size() > max_tokens) tokens = tokens.first(max_tokens);
  std::vector<BlockKey> keys = hasher.chain_keys(tokens);
  PrefixLookupResult r;
  for (const BlockKey& k : keys) {
    if (!disk.contains(k)) break;
    r.block_keys.push_back(k);
  }
  r.cached_blocks = r.block_keys.size();
  r.cached_tokens = r.cached_blocks * hasher.block_tokens();
  if (r.cached_blocks > 0) {
    r.swa_key = r.block_keys.back();
    r.swa_snapshot = swa != nullptr && swa->contains(r.swa_key);
  }
  return r;
}

}  // namespace ds41::kvcache
