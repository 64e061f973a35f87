// Tests for src/engram/compressed_vocab.*: the full V4.1 map against the Python executable spec
// (fixtures/compressed_map.json: sha256 of all 129,280 entries, per-4096-block sha256 to localise
// a mismatch, sampled entries), the checked loader, and the fallback rules on small vocabularies.
#include "engram/compressed_vocab.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engram/engram_normalize.h"
#include "text/byte_level.h"
#include "unit/engram/engram_test_util.h"

namespace ds41::engram {
namespace {

using testing::load_json;

TEST(EngramCompressedVocab, FullV41MapEqualsPythonSpec) {
  const auto fx = load_json(testing::fixture_path("compressed_map.json"));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = load_compressed_vocab(testing::tokenizer_path(), fx["size"].get<int64_t>());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const CompressedVocab& cv = *r;
  std::printf("compressed map: %zu ids -> %d keys in %.3f s (read + build)\n", cv.map.size(), cv.size, secs);
  EXPECT_EQ(cv.size, 99092);  // MODEL_SPEC 3.2.1
  ASSERT_EQ(cv.map.size(), fx["n_ids"].get<size_t>());
  ASSERT_EQ(cv.map.size(), 129280u);

  // Sampled entries first: they name the failing id.
  for (const auto& s : fx["samples"]) {
    const auto id = s[0].get<size_t>();
    EXPECT_EQ(cv.map[id], s[1].get<int32_t>()) << "token id " << id;
  }
  const size_t block = fx["block_size"].get<size_t>();
  const auto& blocks = fx["block_sha256"];
  ASSERT_EQ(blocks.size(), (cv.map.size() + block - 1) / block);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const size_t begin = b * block, n = std::min(block, cv.map.size() - begin);
    const std::string bytes = testing::int32_le_bytes(cv.map.data() + begin, n);
    EXPECT_EQ(testing::sha256_hex(bytes.data(), bytes.size()), blocks[b].get<std::string>())
        << "token ids " << begin << ".." << begin + n - 1;
  }
  const std::string all = testing::int32_le_bytes(cv.map.data(), cv.map.size());
  EXPECT_EQ(testing::sha256_hex(all.data(), all.size()), fx["sha256_int32le"].get<std::string>());
  // First-appearance order: every id is at most one above the running maximum.
  int32_t next = 0;
  for (size_t v = 0; v < cv.map.size(); ++v) {
    ASSERT_LE(cv.map[v], next) << v;
    if (cv.map[v] == next) ++next;
  }
  EXPECT_EQ(next, cv.size);
}

TEST(EngramCompressedVocab, Sha256HelperIsRight) {
  EXPECT_EQ(testing::sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(testing::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string m(1000, 'a');  // crosses block boundaries
  EXPECT_EQ(testing::sha256_hex(m.data(), m.size()),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(EngramCompressedVocab, CheckedLoaderRejectsWrongCount) {
  auto r = load_compressed_vocab(testing::tokenizer_path(), 99091);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("99092"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("99091"), std::string::npos) << r.status().message();
  auto missing = load_compressed_vocab(testing::tokenizer_path() + ".does-not-exist", 99092);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// ByteLevel spelling of raw bytes.
std::string bl(const std::string& bytes) { return text::ByteLevel::instance().encode(bytes); }

TEST(EngramCompressedVocab, FallbackRulesOnASmallVocabulary) {
  nlohmann::json doc;
  doc["model"]["vocab"] = {
      {bl("Hello"), 0},
      {bl(" hello"), 1},
      {bl("HELLO"), 2},
      {bl("\xC3"), 3},          // half a UTF-8 sequence -> U+FFFD -> raw key
      {bl("\xEF\xBF\xBD"), 4},  // a literal U+FFFD -> raw key as well
      {bl("\xCC\x81"), 5},      // lone combining mark: normalises to "" -> text itself
      {bl("\xE1\x9A\x80"), 6},  // U+1680 (White_Space, no NFKC mapping): "" -> text itself
      {bl(" "), 7},
      {bl("\t\t"), 8},  // both become " "
      {bl("Caf\xC3\xA9"), 9},
      {bl("cafe"), 10},
      {"x\xE2\x80\x83", 11},   // U+2003 is not a ByteLevel character: raw string is the text
      {bl("\xC3") + "!", 12},  // Ã + '!' spelled in ByteLevel chars: bytes C3 21 -> invalid
  };
  doc["added_tokens"] = {{{"id", 13}, {"content", "<|User|>"}},
                         {{"id", 14}, {"content", "HELLO"}},
                         {{"id", 15}, {"content", "\xEF\xBF\xBD"}}};
  auto v = text::tokenizer_vocab_from_json(doc);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(compressed_key(v->pieces[3], false), bl("\xC3"));
  EXPECT_EQ(compressed_key(v->pieces[4], false), bl("\xEF\xBF\xBD"));
  EXPECT_EQ(compressed_key(v->pieces[5], false), "\xCC\x81");
  EXPECT_EQ(compressed_key(v->pieces[6], false), "\xE1\x9A\x80");
  EXPECT_EQ(compressed_key(v->pieces[11], false), "x");
  EXPECT_EQ(compressed_key(v->pieces[12], false), bl("\xC3") + "!");
  EXPECT_EQ(compressed_key(v->pieces[13], true), "<|user|>");
  EXPECT_EQ(compressed_key(v->pieces[15], true), "\xEF\xBF\xBD");

  const CompressedVocab cv = build_compressed_vocab(*v);
  const std::vector<int32_t> want = {0, 0, 0, 1, 2, 3, 4, 5, 5, 6, 6, 7, 8, 9, 0, 10};
  EXPECT_EQ(cv.map, want);
  EXPECT_EQ(cv.size, 11);
  auto bad = build_compressed_vocab_checked(*v, 12);
  EXPECT_FALSE(bad.ok());
}

TEST(EngramCompressedVocab, MalformedTokenizerJsonIsAnError) {
  nlohmann::json gap;
  gap["model"]["vocab"] = {{"a", 0}, {"b", 2}};
  auto r = text::tokenizer_vocab_from_json(gap);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token id 1"), std::string::npos) << r.status().message();

  nlohmann::json dup;
  dup["model"]["vocab"] = {{"a", 0}, {"b", 0}};
  EXPECT_FALSE(text::tokenizer_vocab_from_json(dup).ok());

  nlohmann::json neg;
  neg["model"]["vocab"] = {{"a", 0}, {"b", -1}};
  EXPECT_FALSE(text::tokenizer_vocab_from_json(neg).ok());

  nlohmann::json no_model = {{"added_tokens", nlohmann::json::array()}};
  EXPECT_EQ(text::tokenizer_vocab_from_json(no_model).status().code(), StatusCode::kNotFound);

  nlohmann::json bad_added;
  bad_added["model"]["vocab"] = {{"a", 0}};
  bad_added["added_tokens"] = {{{"id", 1}}};
  EXPECT_FALSE(text::tokenizer_vocab_from_json(bad_added).ok());

  // An added token fills an id gap and overrides a model.vocab id.
  nlohmann::json ok;
  ok["model"]["vocab"] = {{"a", 0}, {"c", 2}};
  ok["added_tokens"] = {{{"id", 1}, {"content", "B"}}, {{"id", 2}, {"content", "Z"}}};
  auto v = text::tokenizer_vocab_from_json(ok);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->pieces[1], "B");
  EXPECT_EQ(v->pieces[2], "Z");
  EXPECT_EQ(v->is_added[2], 1);
}

TEST(EngramCompressedVocab, StreamingReaderEqualsDomReader) {
  // read_tokenizer_vocab streams the file (SAX, skipping merges); tokenizer_vocab_from_json takes
  // a parsed document. Both must give the same table for the real tokenizer.
  auto streamed = text::read_tokenizer_vocab(testing::tokenizer_path());
  ASSERT_TRUE(streamed.ok()) << streamed.status().to_string();
  auto dom = text::tokenizer_vocab_from_json(load_json(testing::tokenizer_path()));
  ASSERT_TRUE(dom.ok()) << dom.status().to_string();
  ASSERT_EQ(streamed->size(), 129280u);
  EXPECT_EQ(streamed->pieces, dom->pieces);
  EXPECT_EQ(streamed->is_added, dom->is_added);
  EXPECT_EQ(std::count(streamed->is_added.begin(), streamed->is_added.end(), 1), 1283);
}

TEST(EngramCompressedVocab, StreamingReaderRejectsMalformedFiles) {
  auto read_text = [](const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "/engram_vocab_" + name + ".json";
    std::ofstream(path, std::ios::binary) << text;
    return text::read_tokenizer_vocab(path);
  };
  const auto good =
      read_text("good", R"({"added_tokens":[{"id":2,"content":"<x>","special":true,"extra":{"a":[1]}}],)"
                        R"("model":{"type":"BPE","merges":[["a","b"]],"vocab":{"a":0,"b":1,"c":2}}})");
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(good->pieces, (std::vector<std::string>{"a", "b", "<x>"}));
  EXPECT_EQ(good->is_added, (std::vector<uint8_t>{0, 0, 1}));

  struct Case {
    const char* name;
    const char* text;
    const char* needle;
  };
  const Case cases[] = {
      {"truncated", R"({"model":{"vocab":{"a":0)", "JSON"},
      {"no_model", R"({"added_tokens":[]})", "'model'"},
      {"model_list", R"({"model":[1]})", "'model'"},
      {"no_vocab", R"({"model":{"merges":[]}})", "model.vocab"},
      {"vocab_list", R"({"model":{"vocab":["a"]}})", "model.vocab"},
      {"float_id", R"({"model":{"vocab":{"a":0.5}}})", "non-integer"},
      {"negative_id", R"({"model":{"vocab":{"a":0,"b":-3}}})", "out of range"},
      {"huge_id", R"({"model":{"vocab":{"a":18446744073709551615}}})", "out of range"},
      {"gap", R"({"model":{"vocab":{"a":0,"b":2}}})", "token id 1"},
      {"added_no_content", R"({"model":{"vocab":{"a":0}},"added_tokens":[{"id":1}]})", "content"},
      {"added_not_list", R"({"model":{"vocab":{"a":0}},"added_tokens":{"id":1}})", "added_tokens"},
  };
  for (const Case& c : cases) {
    auto r = read_text(c.name, c.text);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << c.name << ": " << r.status().message();
  }
}

}  // namespace
}  // namespace ds41::engram
