// Streaming detokenization: never a partial UTF-8 sequence, and the stream equals decode().
#include "text/incremental_decoder.h"

#include <gtest/gtest.h>

#include "text/byte_level.h"
#include "text/synthetic_text.h"
#include "text/utf8.h"
#include "text_test_util.h"

namespace ds41::text {
namespace {

using testing::v41_tokenizer;

TEST(IncrementalDecoder, HoldsBackPartialCharacters) {
  const Tokenizer& t = v41_tokenizer();
  // "你" = E4 BD A0, fed as three single-byte tokens.
  IncrementalDecoder d(t);
  std::vector<int32_t> ids;
  for (uint8_t b : {0xE4, 0xBD, 0xA0}) {
    auto id = t.token_to_id(std::string(ByteLevel::instance().byte_to_utf8(b)));
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  EXPECT_EQ(*d.push(ids[0]), "");
  EXPECT_EQ(d.pending_bytes(), 1u);
  EXPECT_EQ(*d.push(ids[1]), "");
  EXPECT_EQ(*d.push(ids[2]), "你");
  EXPECT_EQ(d.pending_bytes(), 0u);
  // A dangling lead byte at the end of the stream becomes one U+FFFD.
  EXPECT_EQ(*d.push(ids[0]), "");
  EXPECT_EQ(d.flush(), "\uFFFD");
  // A lead byte followed by ASCII can never complete: U+FFFD then the ASCII at once.
  auto a = t.token_to_id("a");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(*d.push(ids[0]), "");
  EXPECT_EQ(*d.push(*a), "\uFFFDa");
  EXPECT_FALSE(d.push(129280).ok());
}

TEST(IncrementalDecoder, StreamEqualsDecodeOnRandomIds) {
  const Tokenizer& t = v41_tokenizer();
  SyntheticText g(11);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    if (round % 2 == 0) {
      ids = t.encode(g.make(static_cast<TextKind>(round % static_cast<int>(TextKind::kCount)), 80));
    } else {  // arbitrary ids, including byte tokens that make invalid UTF-8
      const int n = 1 + static_cast<int>(g.below(60));
      for (int k = 0; k < n; ++k)
        ids.push_back(static_cast<int32_t>(g.below(4) ? g.below(256) + 0 : g.below(t.id_end())));
    }
    for (bool skip : {false, true}) {
      IncrementalDecoder d(t, skip);
      std::string streamed;
      for (int32_t id : ids) {
        auto chunk = d.push(id);
        ASSERT_TRUE(chunk.ok());
        EXPECT_TRUE(utf8_is_valid(*chunk));
        streamed += *chunk;
      }
      streamed += d.flush();
      EXPECT_EQ(streamed, *t.decode(ids, skip)) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace ds41::text
