// Issue 16: prefix-cache block keys of prompts with images (docs/formats/kv_block.md "Prompts
// with images"). Image positions all carry the same id, so the keys must include the image
// content hash: two different images never share a cached block from the first image block on,
// nor an SWA snapshot key from the image's start on.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>

#include "kvcache/block_key.h"

namespace ds41::kvcache {
namespace {

TEST(ImageBlockKey, DifferentImagesNeverShareABlockKey) {
  auto h = BlockChainHasher::create("model-x", 16);
  ASSERT_TRUE(h.ok());
  // 80 tokens: text 0..19, an image span 20..61 (all the same id), text after.
  std::vector<int32_t> ids(80);
  for (int i = 0; i < 80; ++i) ids[i] = (i >= 20 && i < 62) ? 129264 : 1000 + i;
  const ImageSpanKey a{20, 42, 0x1111, 0x2222}, b{20, 42, 0x1111, 0x2223};
  const auto ka = h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&a, 1));
  const auto kb = h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&b, 1));
  const auto plain = h->chain_keys(ids);
  ASSERT_EQ(ka.size(), 5u);
  // Block 0 (positions 0..15) precedes the image: shared, and equal to the text-only key.
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[0], plain[0]);
  // From the block where the image starts on, no key is shared, nor equal to the id-only key.
  for (size_t i = 1; i < ka.size(); ++i) {
    EXPECT_NE(ka[i], kb[i]) << i;
    EXPECT_NE(ka[i], plain[i]) << i;
    for (size_t j = 0; j < kb.size(); ++j) EXPECT_NE(ka[i], kb[j]) << i << " vs " << j;
  }
}

TEST(ImageBlockKey, SameImageSameKeysAndTextOnlyUnchanged) {
  auto h = BlockChainHasher::create("model-x", 8);
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> ids(40, 7);
  const ImageSpanKey a{3, 10, 5, 6};
  EXPECT_EQ(h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&a, 1)),
            h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&a, 1)));
  EXPECT_EQ(h->chain_keys_with_images(ids, {}), h->chain_keys(ids));
  // The span position is part of the record: the same image elsewhere is another prefix.
  const ImageSpanKey moved{4, 10, 5, 6};
  EXPECT_NE(h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&a, 1)).back(),
            h->chain_keys_with_images(ids, std::span<const ImageSpanKey>(&moved, 1)).back());
}

// The documented stream rebuilt by hand (docs/formats/kv_block.md): preamble, then per block
// (the last one possibly partial, cut at L) its ids as u32 LE followed by the 40-byte record of
// every span starting inside it (a span running past L included).
BlockKey reference_prefix_key(const std::string& id, uint32_t block, const std::vector<int32_t>& toks,
                              size_t L, const std::vector<ImageSpanKey>& imgs) {
  std::vector<uint8_t> buf = {'d', 's', '4', '1', 'k', 'v', '1', 0};
  auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  u64(id.size());
  buf.insert(buf.end(), id.begin(), id.end());
  for (int i = 0; i < 4; ++i) buf.push_back(static_cast<uint8_t>(block >> (8 * i)));
  for (size_t b0 = 0; b0 < L; b0 += block) {
    const size_t b1 = std::min<size_t>(b0 + block, L);
    for (size_t t = b0; t < b1; ++t)
      for (int i = 0; i < 4; ++i)
        buf.push_back(static_cast<uint8_t>(static_cast<uint32_t>(toks[t]) >> (8 * i)));
    for (const ImageSpanKey& im : imgs) {
      if (im.start < static_cast<int64_t>(b0) || im.start >= static_cast<int64_t>(b1)) continue;
      const char tag[8] = {'d', 's', '4', '1', 'i', 'm', 'g', 0};
      buf.insert(buf.end(), tag, tag + 8);
      u64(static_cast<uint64_t>(im.start));
      u64(static_cast<uint64_t>(im.length));
      u64(im.hash_hi);
      u64(im.hash_lo);
    }
  }
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return BlockKey{h.high64, h.low64};
}

// SWA snapshot keys at any length (issue 16): the chain's stream cut at L, with the records of
// the spans that start before L (a span straddling L included) after the partial block's ids.
TEST(ImageBlockKey, PrefixKeysFollowTheDocumentedStreamAtAnyLength) {
  auto h = BlockChainHasher::create("model-x", 16);
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> ids(80);
  for (int i = 0; i < 80; ++i) ids[i] = (i >= 20 && i < 62) || (i >= 70 && i < 75) ? 129264 : 1000 + i;
  const std::vector<ImageSpanKey> imgs{{20, 42, 0x1111, 0x2222}, {70, 5, 0x3333, 0x4444}};
  const std::span<const int32_t> all(ids);
  for (size_t L = 1; L <= 80; ++L)
    ASSERT_EQ(h->prefix_key_with_images(all.first(L), imgs),
              reference_prefix_key("model-x", 16, ids, L, imgs))
        << L;
  // Block-aligned lengths: the chain keys.
  const auto chain = h->chain_keys_with_images(ids, imgs);
  for (size_t b = 1; b <= chain.size(); ++b)
    EXPECT_EQ(h->prefix_key_with_images(all.first(b * 16), imgs), chain[b - 1]) << b;
  // Without images, or before the first span starts (a span starting at L is not in [0, L)):
  // prefix_key.
  for (size_t L : {1, 5, 33, 50, 80})
    EXPECT_EQ(h->prefix_key_with_images(all.first(L), {}), h->prefix_key(all.first(L)));
  for (size_t L = 1; L <= 20; ++L)
    EXPECT_EQ(h->prefix_key_with_images(all.first(L), imgs), h->prefix_key(all.first(L))) << L;
  // From the span's start on, the image is part of every prefix key, also while the span
  // straddles L, and a different image with the same ids never gives the same key.
  std::vector<ImageSpanKey> other = imgs;
  other[0].hash_lo ^= 1;
  for (size_t L = 21; L <= 80; ++L) {
    const BlockKey k = h->prefix_key_with_images(all.first(L), imgs);
    EXPECT_NE(k, h->prefix_key(all.first(L))) << L;
    EXPECT_NE(k, h->prefix_key_with_images(all.first(L), other)) << L;
  }
  // The second span joins the key at L = 71 (it starts at 70), not before.
  const auto first_only = std::span<const ImageSpanKey>(imgs).first(1);
  EXPECT_EQ(h->prefix_key_with_images(all.first(70), imgs),
            h->prefix_key_with_images(all.first(70), first_only));
  EXPECT_NE(h->prefix_key_with_images(all.first(71), imgs),
            h->prefix_key_with_images(all.first(71), first_only));
}

}  // namespace
}  // namespace ds41::kvcache
