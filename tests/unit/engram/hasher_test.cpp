// Tests for src/engram/hasher.*: the golden hash ids of the tiny public model (3 prompts of 5,
// 40 and 297 tokens, goldens.safetensors), the released config on real token ids (fixture from
// make_goldens.engram_hash_ids plus a DEAD-mask variant of the same loop), chunked and
// token-by-token equality, sticky blocking at DEAD positions against a from-the-spec reference,
// and error handling.
#include "engram/hasher.h"

#include <gtest/gtest.h>

#include <random>

#include "unit/engram/engram_test_util.h"

namespace ds41::engram {
namespace {

EngramHasher make_hasher(const EngramConfig& cfg) {
  auto c = compute_engram_hash_constants(cfg);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  auto h = EngramHasher::create(*c, testing::v41_compressed_vocab(), cfg.pad_token_id);
  EXPECT_TRUE(h.ok()) << h.status().to_string();
  return std::move(h).value();
}

EngramConfig tiny_config() {
  auto cfg = engram_config_from_text_config(
      testing::load_json(testing::shared_path("golden/v41-tiny-public/config.json")));
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  return *cfg;
}

EngramConfig released_config() {
  auto cfg = engram_config_from_text_config(
      testing::load_json(testing::fixture_path("released_hash.json"))["config"]);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  return *cfg;
}

// Feeds ids in chunks of the given sizes (cycled) and returns the concatenated row ids.
std::vector<int32_t> chunked(const EngramHasher& h, const std::vector<int32_t>& ids,
                             const std::vector<uint8_t>& dead, const std::vector<size_t>& sizes) {
  std::vector<int32_t> out(ids.size() * static_cast<size_t>(h.ids_per_token()));
  EngramHashState st = h.new_state();
  size_t pos = 0, k = 0;
  while (pos < ids.size()) {
    const size_t n = std::min(sizes[k++ % sizes.size()], ids.size() - pos);
    const std::span<const uint8_t> d =
        dead.empty() ? std::span<const uint8_t>() : std::span(dead).subspan(pos, n);
    const Status s = h.append(st, std::span(ids).subspan(pos, n), d,
                              std::span(out).subspan(pos * static_cast<size_t>(h.ids_per_token()),
                                                     n * static_cast<size_t>(h.ids_per_token())));
    EXPECT_TRUE(s.ok()) << s.to_string();
    pos += n;
  }
  EXPECT_EQ(st.length, static_cast<int64_t>(ids.size()));
  return out;
}

// MODEL_SPEC 3.2.3 written out over the full history (no incremental state).
std::vector<int32_t> reference_hash(const EngramHasher& h, const std::vector<int32_t>& ids,
                                    const std::vector<uint8_t>& dead) {
  const EngramHashConstants& c = h.constants();
  const auto& map = h.vocab().map;
  const int64_t pad = map[2];
  std::vector<int32_t> out;
  for (int64_t p = 0; p < static_cast<int64_t>(ids.size()); ++p) {
    std::vector<int64_t> t(static_cast<size_t>(c.max_ngram));
    bool blocked = false;
    for (int64_t j = 0; j < c.max_ngram; ++j) {
      blocked = blocked || p - j < 0 || dead[static_cast<size_t>(p - j)];
      t[static_cast<size_t>(j)] = blocked ? pad : map[static_cast<size_t>(ids[static_cast<size_t>(p - j)])];
    }
    for (int l = 0; l < c.n_layers; ++l) {
      int64_t r = t[0] * c.multiplier(l, 0);
      for (int n = 2; n <= c.max_ngram; ++n) {
        r ^= t[static_cast<size_t>(n - 1)] * c.multiplier(l, n - 1);
        for (int hd = 0; hd < c.n_heads; ++hd) {
          const int col = (n - 2) * c.n_heads + hd;
          out.push_back(static_cast<int32_t>(r % c.prime(l, col) + c.offset(l, col)));
        }
      }
    }
  }
  return out;
}

TEST(EngramHasher, TinyGoldenPromptsExact) {
  const EngramHasher h = make_hasher(tiny_config());
  ASSERT_EQ(h.ids_per_token(), 12);
  testing::MiniSafetensors st;
  ASSERT_TRUE(st.open(testing::shared_path("golden/v41-tiny-public/goldens.safetensors")));
  const auto manifest = testing::load_json(testing::shared_path("golden/v41-tiny-public/manifest.json"));
  size_t total = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string p = "prompt" + std::to_string(i);
    const std::vector<int32_t> ids = st.i32(p + ".input_ids");
    EXPECT_EQ(ids, manifest["prompts"][p].get<std::vector<int32_t>>()) << p;
    std::vector<int64_t> shape;
    const std::vector<int32_t> want = st.i32(p + ".engram_hash_ids", &shape);
    ASSERT_EQ(shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), 2, 6})) << p;
    auto got = h.hash_ids(ids);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ((*got)[k], want[k]) << p << " position " << k / 12 << " layer " << (k % 12) / 6 << " column "
                                    << k % 6;
    }
    // Chunked prefill and token-by-token decode give the same ids.
    EXPECT_EQ(chunked(h, ids, {}, {1}), want) << p;
    EXPECT_EQ(chunked(h, ids, {}, {3, 1, 7, 2, 64}), want) << p;
    total += ids.size();
  }
  EXPECT_EQ(total, 5u + 40u + 297u);
}

TEST(EngramHasher, ReleasedConfigMatchesPythonSpec) {
  const auto fx = testing::load_json(testing::fixture_path("released_hash.json"));
  const EngramHasher h = make_hasher(released_config());
  ASSERT_EQ(h.ids_per_token(), 48);
  const auto ids = fx["input_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 96u);
  std::vector<int32_t> want, want_dead;
  for (const auto& row : fx["hash_ids"])
    for (const auto& v : row) want.push_back(v.get<int32_t>());
  for (const auto& row : fx["hash_ids_dead"])
    for (const auto& v : row) want_dead.push_back(v.get<int32_t>());
  std::vector<uint8_t> dead(ids.size(), 0);
  for (const auto& d : fx["dead_positions"]) dead[d.get<size_t>()] = 1;

  auto got = h.hash_ids(ids);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, want);
  auto got_dead = h.hash_ids(ids, dead);
  ASSERT_TRUE(got_dead.ok());
  EXPECT_EQ(*got_dead, want_dead);
  EXPECT_NE(want, want_dead);
  EXPECT_EQ(chunked(h, ids, dead, {5, 1, 13}), want_dead);
  EXPECT_EQ(reference_hash(h, ids, dead), want_dead);
  // Row ids stay inside each layer's table.
  for (size_t k = 0; k < want.size(); ++k) {
    const int layer = static_cast<int>((k % 48) / 24);
    EXPECT_GE(want[k], 0);
    EXPECT_LT(want[k], h.constants().table_rows[static_cast<size_t>(layer)]);
  }
}

TEST(EngramHasher, DeadPositionsBlockStickilyAndChunkingIsExact) {
  const EngramHasher h = make_hasher(released_config());
  const size_t per = static_cast<size_t>(h.ids_per_token());
  std::mt19937 rng(7);
  const size_t S = 700;  // far longer than the 4-token window
  std::vector<int32_t> ids(S);
  std::vector<uint8_t> dead(S, 0);
  for (auto& x : ids) x = static_cast<int32_t>(rng() % 129280);
  // DEAD runs of several lengths, including one at position 0 and one at the very end.
  for (size_t p : {0, 1, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 200, 202, 204, 300, 699}) dead[p] = 1;
  for (size_t p = 400; p < 656; ++p) dead[p] = 1;         // an image span of 256 positions
  for (size_t p : {0, 1, 50, 200, 400}) ids[p] = 129264;  // DEAD ids are not looked up

  std::vector<int32_t> ref = reference_hash(h, ids, dead);
  auto one = h.hash_ids(ids, dead);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, ref);
  EXPECT_EQ(chunked(h, ids, dead, {1}), ref);
  EXPECT_EQ(chunked(h, ids, dead, {2, 3, 5, 7, 11, 13, 17, 19, 23, 29}), ref);
  EXPECT_EQ(chunked(h, ids, dead, {256}), ref);

  // Stickiness: right after a DEAD position the window restarts as at the sequence start, so
  // position p (p-1 DEAD) hashes like position 0 of a fresh sequence [ids[p]], and p+1 like
  // position 1 of [ids[p], ids[p+1]].
  for (size_t p : {size_t{60}, size_t{205}, size_t{656}}) {
    ASSERT_TRUE(dead[p - 1] && !dead[p] && !dead[p + 1]);
    auto fresh = h.hash_ids(std::vector<int32_t>{ids[p], ids[p + 1]});
    ASSERT_TRUE(fresh.ok());
    EXPECT_TRUE(std::equal(fresh->begin(), fresh->end(), one->begin() + static_cast<std::ptrdiff_t>(p * per)))
        << "position " << p;
  }
  // A DEAD position itself hashes like an all-pad n-gram (pad* = map[2]).
  auto pads = h.hash_ids(std::vector<int32_t>{2, 2, 2, 2});
  ASSERT_TRUE(pads.ok());
  // Position 3 of [2,2,2,2] has t_0..t_3 = pad*, exactly the DEAD case.
  EXPECT_TRUE(std::equal(pads->begin() + static_cast<std::ptrdiff_t>(3 * per), pads->end(),
                         one->begin() + static_cast<std::ptrdiff_t>(300 * per)));
  // A position two after a DEAD one differs from the undead sequence (the mask matters).
  auto undead = h.hash_ids(ids);
  ASSERT_TRUE(undead.ok());
  EXPECT_FALSE(std::equal(undead->begin() + static_cast<std::ptrdiff_t>(61 * per),
                          undead->begin() + static_cast<std::ptrdiff_t>(62 * per),
                          one->begin() + static_cast<std::ptrdiff_t>(61 * per)));
}

TEST(EngramHasher, AdvanceWithoutOutputThenContinue) {
  const EngramHasher h = make_hasher(tiny_config());
  std::vector<int32_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back((i * 37) % 2048);
  auto full = h.hash_ids(ids);
  ASSERT_TRUE(full.ok());
  EngramHashState st = h.new_state();
  ASSERT_TRUE(h.append(st, std::span(ids).first(30), {}, {}).ok());  // e.g. a prefix-cache hit
  EXPECT_EQ(st.length, 30);
  std::vector<int32_t> rest(20 * static_cast<size_t>(h.ids_per_token()));
  ASSERT_TRUE(h.append(st, std::span(ids).subspan(30), {}, rest).ok());
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), full->begin() + 30 * h.ids_per_token()));
  // A copied state forks the sequence.
  EngramHashState fork = st;
  std::vector<int32_t> a(static_cast<size_t>(h.ids_per_token())), b(a.size());
  const int32_t next[1] = {7};
  ASSERT_TRUE(h.append(st, next, {}, a).ok());
  ASSERT_TRUE(h.append(fork, next, {}, b).ok());
  EXPECT_EQ(a, b);
}

TEST(EngramHasher, BadInputIsAnErrorAndLeavesStateUnchanged) {
  const EngramHasher h = make_hasher(tiny_config());
  EngramHashState st = h.new_state();
  const int32_t ok_ids[3] = {0, 5, 9};
  std::vector<int32_t> out(3 * static_cast<size_t>(h.ids_per_token()));
  ASSERT_TRUE(h.append(st, ok_ids, {}, out).ok());
  const EngramHashState before = st;

  const int32_t too_big[2] = {4, 129280};
  Status s = h.append(st, too_big, {}, std::span(out).first(2 * static_cast<size_t>(h.ids_per_token())));
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("129280"), std::string::npos) << s.message();
  const int32_t negative[1] = {-1};
  EXPECT_FALSE(h.append(st, negative, {}, std::span(out).first(static_cast<size_t>(h.ids_per_token()))).ok());
  const uint8_t flags[2] = {0, 0};
  EXPECT_EQ(h.append(st, ok_ids, flags, out).code(), StatusCode::kInvalidArgument);  // 2 flags, 3 ids
  EXPECT_EQ(h.append(st, ok_ids, {}, std::span(out).first(5)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.length, before.length);
  EXPECT_EQ(st.recent, before.recent);
  // A negative id is fine at a DEAD position (its id is never read).
  const uint8_t dead1[1] = {1};
  EXPECT_TRUE(
      h.append(st, negative, dead1, std::span(out).first(static_cast<size_t>(h.ids_per_token()))).ok());
}

TEST(EngramHasher, CreateRejectsMismatchedInputs) {
  auto c = compute_engram_hash_constants(released_config());
  ASSERT_TRUE(c.ok());
  CompressedVocab small;
  small.map = {0, 1, 2};
  small.size = 3;
  EXPECT_EQ(EngramHasher::create(*c, small, 3).status().code(), StatusCode::kOutOfRange);  // pad outside map
  EXPECT_TRUE(EngramHasher::create(*c, small, 2).ok());
  CompressedVocab huge = small;
  huge.map[1] = 2000000;  // 2e6 * 8.3e13 > 2^63: products could overflow
  EXPECT_EQ(EngramHasher::create(*c, huge, 2).status().code(), StatusCode::kInvalidArgument);
  EngramHashConstants broken = *c;
  broken.primes.pop_back();
  EXPECT_FALSE(EngramHasher::create(broken, small, 2).ok());
}

TEST(EngramHasher, MakeFromConfigAndTokenizerFile) {
  // The load-time entry point: both checks (row totals, compressed vocabulary size) and the
  // golden ids of prompt1.
  const EngramConfig cfg = tiny_config();
  auto h = make_engram_hasher(cfg, testing::tokenizer_path());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->vocab().size, 99092);
  EXPECT_EQ(h->pad_compressed_id(), h->vocab().map[2]);
  testing::MiniSafetensors st;
  ASSERT_TRUE(st.open(testing::shared_path("golden/v41-tiny-public/goldens.safetensors")));
  auto got = h->hash_ids(st.i32("prompt1.input_ids"));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, st.i32("prompt1.engram_hash_ids"));

  EngramConfig wrong_vocab = cfg;
  wrong_vocab.compressed_vocab_size = 99093;
  auto a = make_engram_hasher(wrong_vocab, testing::tokenizer_path());
  EXPECT_EQ(a.status().code(), StatusCode::kFailedPrecondition);
  EngramConfig wrong_rows = cfg;
  wrong_rows.num_embeddings[0] = 3689;
  auto b = make_engram_hasher(wrong_rows, testing::tokenizer_path());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("3688"), std::string::npos) << b.status().message();
}

}  // namespace
}  // namespace ds41::engram
