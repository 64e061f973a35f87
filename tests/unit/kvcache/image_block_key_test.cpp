// Issue 16: prefix-cache block keys of prompts with images (docs/formats/kv_block.md "Prompts
// with images"). Image positions all carry the same id, so the keys must include the image
// content hash: two different images never share a cached block from the first image block on.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ds41::kvcache
