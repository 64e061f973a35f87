// ds41 engine: CacheKeyInput — what every prefix-cache key is derived from (issues 13 + 16): a
// sequence's token ids and, for a prompt with images, its image spans with their content hashes
// (docs/formats/kv_block.md "Prompts with images"). Every image-span position carries the same
// token id, so ids alone would give two different images the same keys. Text-only input (no
// spans) keys exactly as the token ids alone; a bare token span converts implicitly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "kvcache/block_key.h"

namespace ds41::engine {

struct CacheKeyInput {
  std::span<const int32_t> tokens;
  std::span<const kvcache::ImageSpanKey> images;  // sorted by start, disjoint; may reach past tokens

  CacheKeyInput(std::span<const int32_t> t, std::span<const kvcache::ImageSpanKey> i = {})  // NOLINT
      : tokens(t), images(i) {}
  CacheKeyInput(const std::vector<int32_t>& t) : tokens(t) {}  // NOLINT: text-only callers

  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  // The first n tokens (the spans stay: a key counts only those starting before its end).
  CacheKeyInput first(int64_t n) const { return CacheKeyInput(tokens.first(static_cast<size_t>(n)), images); }
  // Whether an image-span position lies in [begin, end).
  bool has_image_in(int64_t begin, int64_t end) const;

  // Keys of every full block (BlockChainHasher::chain_keys_with_images).
  std::vector<kvcache::BlockKey> chain_keys(const kvcache::BlockChainHasher& h) const {
    return h.chain_keys_with_images(tokens, images);
  }
  // Key of the whole prefix (BlockChainHasher::prefix_key_with_images): SWA snapshots.
  kvcache::BlockKey prefix_key(const kvcache::BlockChainHasher& h) const {
    return h.prefix_key_with_images(tokens, images);
  }
};

// The key spans of a request's images (in prompt order, as EngineLoop::submit checks them), or
// nullopt when an image has no content hash: such a request must not use the prefix cache.
std::optional<std::vector<kvcache::ImageSpanKey>> image_span_keys(const std::vector<RequestImage>& images);

}  // namespace ds41::engine
