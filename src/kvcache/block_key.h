// ds41 kvcache: content keys of cached prefixes. A cached prefix is a chain of fixed-size token
// blocks; the key of block i is XXH3-128 over (model identity, block size, every token id from
// position 0 up to and including block i), so a key names a whole prefix, not just one block's
// tokens. SWA snapshots use the same hash at their (possibly unaligned) prefix length, so the
// snapshot at a block boundary has exactly that block's key. Prompts with images add each image
// span's content hash to the stream (the *_with_images functions). Byte layout:
// docs/formats/kv_block.md.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds41::kvcache {

struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  auto operator<=>(const BlockKey&) const = default;
  bool operator==(const BlockKey&) const = default;
  // 32 lower-case hex digits, hi first (the on-disk file name stem).
  std::string hex() const;
  static std::optional<BlockKey> from_hex(std::string_view s);
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const {
    return static_cast<size_t>(k.lo ^ (k.hi * 0x9e3779b97f4a7c15ULL));
  }
};

// An image span of a prompt for key derivation (docs/formats/kv_block.md "Prompts with images"):
// its positions all carry the same token id, so the image's content hash joins the key.
struct ImageSpanKey {
  int64_t start = 0, length = 0;
  uint64_t hash_hi = 0, hash_lo = 0;  // XXH3-128 of the encoded image bytes
};

// Hashes token prefixes for one (model identity, block size). Stateless apart from config;
// thread-safe.
class BlockChainHasher {
 public:
  // model_identity: any stable string naming the model + KV layout (e.g. checkpoint hash);
  // block_tokens > 0 (checked by create()).
  static Result<BlockChainHasher> create(std::string model_identity, uint32_t block_tokens);

  uint32_t block_tokens() const { return block_tokens_; }
  const std::string& model_identity() const { return model_identity_; }

  // Keys of every complete block of `tokens` (tokens.size() / block_tokens keys, in order).
  std::vector<BlockKey> chain_keys(std::span<const int32_t> tokens) const;
  // Key of the prefix tokens[0, tokens.size()) of any length (SWA snapshot key). For a
  // block-aligned length it equals the last chain key.
  BlockKey prefix_key(std::span<const int32_t> tokens) const;
  // chain_keys with image spans (sorted by start): after each block's ids, a record of every span
  // starting in that block. Without images it equals chain_keys.
  std::vector<BlockKey> chain_keys_with_images(std::span<const int32_t> tokens,
                                               std::span<const ImageSpanKey> images) const;
  // prefix_key with image spans (sorted by start): the same stream, with the partial last
  // block's records (spans starting inside it, one running past the prefix end included) after
  // its ids. Spans starting at or after tokens.size() are not part of the prefix. For a
  // block-aligned length it equals the last chain_keys_with_images key; without images it
  // equals prefix_key.
  BlockKey prefix_key_with_images(std::span<const int32_t> tokens,
                                  std::span<const ImageSpanKey> images) const;

 private:
  BlockChainHasher(std::string id, uint32_t b) : model_identity_(std::move(id)), block_tokens_(b) {}
  std::string model_identity_;
  uint32_t block_tokens_;
};

}  // namespace ds41::kvcache
