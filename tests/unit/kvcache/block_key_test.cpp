// Tests for kvcache/block_key: chain hashing against an independent rebuild of the documented
// byte layout (docs/formats/kv_block.md), prefix properties, and 128K-token chains.
#include "kvcache/block_key.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <unordered_set>

#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

// The documented hash input, rebuilt by hand: "ds41kv1\0", u64 LE identity length, identity,
// u32 LE block size, then every token as u32 LE.
BlockKey reference_key(const std::string& id, uint32_t block, const std::vector<int32_t>& toks, size_t n) {
  std::vector<uint8_t> buf = {'d', 's', '4', '1', 'k', 'v', '1', 0};
  for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(uint64_t(id.size()) >> (8 * i)));
  buf.insert(buf.end(), id.begin(), id.end());
  for (int i = 0; i < 4; ++i) buf.push_back(static_cast<uint8_t>(block >> (8 * i)));
  for (size_t t = 0; t < n; ++t)
    for (int i = 0; i < 4; ++i)
      buf.push_back(static_cast<uint8_t>(static_cast<uint32_t>(toks[t]) >> (8 * i)));
  XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return BlockKey{h.high64, h.low64};
}

TEST(BlockKey, MatchesDocumentedLayout) {
  auto h = BlockChainHasher::create("v4.1-flash:abc", 128);
  ASSERT_TRUE(h.ok());
  auto toks = testing::make_tokens(1, 128 * 5 + 77);
  toks[3] = -1;  // negative ids are hashed as their u32 bit pattern
  auto keys = h->chain_keys(toks);
  ASSERT_EQ(keys.size(), 5u);
  for (size_t b = 0; b < keys.size(); ++b)
    EXPECT_EQ(keys[b], reference_key("v4.1-flash:abc", 128, toks, (b + 1) * 128));
  EXPECT_EQ(h->prefix_key(std::span(toks).first(700)), reference_key("v4.1-flash:abc", 128, toks, 700));
}

TEST(BlockKey, ChainPropertiesAndInputsThatMustChangeTheKey) {
  auto h = *BlockChainHasher::create("model-a", 16);
  auto toks = testing::make_tokens(2, 16 * 8);
  auto keys = h.chain_keys(toks);
  ASSERT_EQ(keys.size(), 8u);
  // A block key names the whole prefix: editing block 2 changes keys 2.. and keeps 0,1.
  auto edited = toks;
  edited[2 * 16 + 5] ^= 1;
  auto keys2 = h.chain_keys(edited);
  EXPECT_EQ(keys2[0], keys[0]);
  EXPECT_EQ(keys2[1], keys[1]);
  for (size_t i = 2; i < 8; ++i) EXPECT_NE(keys2[i], keys[i]) << i;
  // Same tokens of block 3 after a different history -> different key.
  EXPECT_NE(h.chain_keys(std::span(toks).subspan(16))[2], keys[3]);
  // Model identity and block size are part of the key.
  auto other = *BlockChainHasher::create("model-b", 16);
  EXPECT_NE(other.chain_keys(toks)[0], keys[0]);
  auto h32 = *BlockChainHasher::create("model-a", 32);
  EXPECT_NE(h32.chain_keys(toks)[0], keys[1]);
  // prefix_key at a block boundary is the block key; unaligned lengths differ from neighbours.
  EXPECT_EQ(h.prefix_key(std::span(toks).first(48)), keys[2]);
  EXPECT_NE(h.prefix_key(std::span(toks).first(49)), keys[2]);
  EXPECT_NE(h.prefix_key(std::span(toks).first(47)), keys[2]);
  // Incomplete trailing block produces no key.
  EXPECT_EQ(h.chain_keys(std::span(toks).first(16 * 3 + 15)).size(), 3u);
  EXPECT_TRUE(h.chain_keys(std::span(toks).first(15)).empty());
}

TEST(BlockKey, LongChainHasNoDuplicates) {
  auto h = *BlockChainHasher::create("v4.1", 128);
  std::vector<int32_t> toks(131072, 7);  // a constant sequence: every block's own tokens equal
  auto keys = h.chain_keys(toks);
  ASSERT_EQ(keys.size(), 1024u);
  std::unordered_set<BlockKey, BlockKeyHash> seen(keys.begin(), keys.end());
  EXPECT_EQ(seen.size(), keys.size());
}

TEST(BlockKey, HexRoundTripAndRejectsBadInput) {
  BlockKey k{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(k.hex(), "0123456789abcdeffedcba9876543210");
  EXPECT_EQ(BlockKey::from_hex(k.hex()), k);
  EXPECT_FALSE(BlockKey::from_hex("0123").has_value());
  EXPECT_FALSE(BlockKey::from_hex("0123456789ABCDEFfedcba9876543210").has_value());  // upper case is not ours
  EXPECT_FALSE(BlockKey::from_hex("0123456789abcdeffedcba987654321g").has_value());
  EXPECT_FALSE(BlockChainHasher::create("m", 0).ok());
  EXPECT_FALSE(BlockChainHasher::create("", 128).ok());
}

}  // namespace
}  // namespace ds41::kvcache
