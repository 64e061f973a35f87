// Chunked prefill, decode and batching are exact (MODEL_SPEC 4.2-4.3): the same logits as one
// exact prefill, for chunk boundaries anywhere (inside ratio-2 pairs, across the Engram
// look-back, the window and the candidate pool). Sequences of 300 tokens exceed the tiny
// config's window (8), top-k (8), ratio-2 pairing (150 pairs) and candidate pool (6 x 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "golden/golden_arrays.h"

namespace ds41::testing {
namespace {

// Chunked prefill, decode, batching and replays that forget nothing run the same float
// operations in the same order as the one-shot prefill, so their logits are bitwise equal;
// they are compared for equality (a change that loses exactness must fail, not pass a
// tolerance). kTolExact only marks the lower bound of "not exact" for the approximations.
constexpr double kTolExact = 1e-5;
// Encoder replay (docs/replay_drift.md) is an approximation. On the test's sequence today: mean
// KL 0.025, top-1 agreement 0.92 (max row error 1.7, too noisy to bound). A replay of half the
// window (4 of 8 rows) measured mean KL 0.10 and top-1 0.79: the bounds sit between, with 2x
// margin on the KL. Off-by-one replay windows are caught bitwise by
// EncoderReplayIsTheSpecDefinition.
constexpr double kMaxEncoderReplayMeanKl = 0.05;
constexpr double kMinEncoderReplayTop1 = 0.85;

class ForwardState : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new TestModel(load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  static std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(3, 2047);
    std::vector<int32_t> v{0};
    while (static_cast<int64_t>(v.size()) < n) {
      // Repeated spans so Engram n-grams and attention patterns recur.
      if (v.size() > 20 && rng() % 5 == 0) {
        size_t b = rng() % (v.size() - 10);
        for (size_t i = 0; i < 6 && static_cast<int64_t>(v.size()) < n; ++i) v.push_back(v[b + i]);
      } else {
        v.push_back(d(rng));
      }
    }
    return v;
  }
  static model::SequenceOutput run(std::span<const int32_t> ids, int64_t chunk) {
    auto st = tm_->model->new_sequence();
    model::ForwardOptions opt;
    opt.logits = model::LogitsRows::kAll;
    auto out = tm_->model->prefill(*st, ids, chunk, opt);
    EXPECT_TRUE(out.ok()) << out.status().message();
    return out.ok() ? std::move(out).value() : model::SequenceOutput{};
  }
  // Bitwise equality of logits; reports the first differing index and the worst row error.
  static void expect_bitwise_equal(const std::vector<float>& ref, const std::vector<float>& got, int64_t V,
                                   const std::string& what) {
    ASSERT_EQ(ref.size(), got.size()) << what;
    if (std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)) == 0) return;
    size_t i = 0;
    while (i < ref.size() && std::memcmp(&ref[i], &got[i], sizeof(float)) == 0) ++i;
    ADD_FAILURE() << what << ": logits differ first at index " << i << " (row " << i / V << "): " << ref[i]
                  << " vs " << got[i] << ", max row error " << max_row_error(ref, got, V);
  }
  static std::vector<float> slice(const std::vector<float>& v, int64_t begin, int64_t end) {
    return std::vector<float>(v.begin() + begin, v.begin() + end);
  }
  struct ReplayDrift {
    double mean_kl = 0, max_kl = 0, top1 = 0, max_row_error = 0;
  };
  // KL(softmax(ref) || softmax(got)) per row (fp64), its mean and max, and the fraction of rows
  // whose argmax agrees.
  static ReplayDrift replay_drift(const std::vector<float>& ref, const std::vector<float>& got, int64_t V) {
    ReplayDrift d;
    const int64_t rows = static_cast<int64_t>(ref.size()) / V;
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = &ref[r * V];
      const float* b = &got[r * V];
      const double ma = *std::max_element(a, a + V), mb = *std::max_element(b, b + V);
      double za = 0, zb = 0;
      for (int64_t j = 0; j < V; ++j) {
        za += std::exp(a[j] - ma);
        zb += std::exp(b[j] - mb);
      }
      double kl = 0;
      for (int64_t j = 0; j < V; ++j) {
        const double lpa = a[j] - ma - std::log(za), lpb = b[j] - mb - std::log(zb);
        kl += std::exp(lpa) * (lpa - lpb);
      }
      d.mean_kl += kl / rows;
      d.max_kl = std::max(d.max_kl, kl);
      d.top1 += (std::max_element(a, a + V) - a == std::max_element(b, b + V) - b) ? 1.0 / rows : 0.0;
      d.max_row_error = std::max(d.max_row_error, row_error(a, b, V));
    }
    return d;
  }
  static double max_row_error(const std::vector<float>& ref, const std::vector<float>& got, int64_t V) {
    EXPECT_EQ(ref.size(), got.size());
    double w = 0;
    for (size_t r = 0; r * V < std::min(ref.size(), got.size()); ++r)
      w = std::max(w, row_error(&ref[r * V], &got[r * V], V));
    return w;
  }
  static TestModel* tm_;
};
TestModel* ForwardState::tm_ = nullptr;

TEST_F(ForwardState, ChunkedPrefillEqualsOneShot) {
  ASSERT_TRUE(tm_->model);
  const int64_t V = tm_->model->config().vocab_size;
  auto ids = random_prompt(300, 7);
  auto ref = run(ids, 0);
  ASSERT_EQ(static_cast<int64_t>(ref.positions.size()), 300);
  for (int64_t chunk : {1, 3, 7, 64}) {
    auto got = run(ids, chunk);
    expect_bitwise_equal(ref.logits, got.logits, V, "chunk " + std::to_string(chunk));
  }
}

TEST_F(ForwardState, DecodeAfterPrefillEqualsPrefillOfExtendedSequence) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size;
  auto ids = random_prompt(261, 11);  // odd length: the decode starts inside a ratio-2 pair
  auto ref = run(ids, 0);
  const int64_t P = 241;
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  auto pre = m.prefill(*st, std::span<const int32_t>(ids).subspan(0, P), 0, opt);
  ASSERT_TRUE(pre.ok());
  expect_bitwise_equal(slice(ref.logits, (P - 1) * V, P * V), pre->logits, V, "prefill last row");
  for (int64_t p = P; p < static_cast<int64_t>(ids.size()); ++p) {
    auto o = m.decode_step(*st, ids[p], opt);
    ASSERT_TRUE(o.ok());
    expect_bitwise_equal(slice(ref.logits, p * V, (p + 1) * V), o->logits, V,
                         "decode position " + std::to_string(p));
  }
  EXPECT_EQ(st->position(), static_cast<int64_t>(ids.size()));
}

TEST_F(ForwardState, BatchOfIndependentSequencesEqualsSeparateRuns) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size;
  auto a = random_prompt(120, 21), b = random_prompt(77, 22), c = random_prompt(203, 23);
  auto ra = run(a, 0), rb = run(b, 0), rc = run(c, 0);
  // Step 1: prefill a and b together (b in two calls: first 40 alone, rest batched).
  auto sa = m.new_sequence(), sb = m.new_sequence(), sc = m.new_sequence();
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  std::vector<model::SequenceOutput> out;
  std::span<const int32_t> A(a), B(b), Cc(c);
  model::SequenceInput first{sb.get(), B.subspan(0, 40), {}};
  ASSERT_TRUE(m.forward(std::span<const model::SequenceInput>(&first, 1), opt, &out).ok());
  std::vector<model::SequenceInput> batch = {
      {sa.get(), A, {}}, {sb.get(), B.subspan(40), {}}, {sc.get(), Cc.subspan(0, 200), {}}};
  ASSERT_TRUE(m.forward(batch, opt, &out).ok());
  ASSERT_EQ(out.size(), 3u);
  expect_bitwise_equal(ra.logits, out[0].logits, V, "a");
  std::vector<float> rb_tail(rb.logits.begin() + 40 * V, rb.logits.end());
  expect_bitwise_equal(rb_tail, out[1].logits, V, "b tail");
  std::vector<float> rc_head(rc.logits.begin(), rc.logits.begin() + 200 * V);
  expect_bitwise_equal(rc_head, out[2].logits, V, "c head");
  // Step 2: a mixed batch — c finishes its prefill (3 rows) while a decodes one token.
  std::vector<int32_t> a_next = {c[5]};
  std::vector<model::SequenceInput> mixed = {{sc.get(), Cc.subspan(200), {}}, {sa.get(), a_next, {}}};
  ASSERT_TRUE(m.forward(mixed, opt, &out).ok());
  std::vector<float> rc_tail(rc.logits.begin() + 200 * V, rc.logits.end());
  expect_bitwise_equal(rc_tail, out[0].logits, V, "c tail");
  std::vector<int32_t> a_ext = a;
  a_ext.push_back(c[5]);
  auto rae = run(a_ext, 0);
  std::vector<float> rae_last(rae.logits.end() - V, rae.logits.end());
  expect_bitwise_equal(rae_last, out[1].logits, V, "a decode");
}

TEST_F(ForwardState, SelectionsAreNotSaturated) {
  // The test sequences must exercise top-k, the window and the candidate pool.
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const auto& c = m.config();
  auto ids = random_prompt(300, 7);
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  opt.record = true;
  auto out = m.prefill(*st, ids, 0, opt);
  ASSERT_TRUE(out.ok());
  const int64_t last = 299;
  // The last row sees 150 ratio-2 entries / 300 ratio-1 entries but selects only index_topk.
  for (auto& [l, sel] : out->record.topk) {
    int n = 0;
    for (int64_t j = 0; j < c.index_topk; ++j) n += sel[last * c.index_topk + j] >= 0;
    EXPECT_EQ(n, c.index_topk) << "layer " << l;
  }
  const int64_t cand = c.candidate_source_layer_id;
  ASSERT_TRUE(out->record.cand_blocks.count(cand));
  EXPECT_LT(c.candidate_topk_blocks * c.candidate_block_size, 300);
  EXPECT_GT(300, c.sliding_window * 10);
  EXPECT_EQ(st->source(2)->count, 150);
  EXPECT_EQ(st->source(cand)->count, 300);
}

TEST_F(ForwardState, GlobalKvBytesMatchTheLayout) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  auto ids = random_prompt(301, 5);
  auto st = m.new_sequence();
  ASSERT_TRUE(m.prefill(*st, ids, 64, {}).ok());
  int64_t expect = 0;
  for (const auto& s : m.kv_layout().sources) expect += (301 / s.ratio) * s.entry_bytes();
  EXPECT_EQ(st->global_kv_bytes(), expect);
  // Tiny config: head_dim 128 -> 64 + 8 B main row, index 128 -> 64 + 4 B key row.
  EXPECT_NEAR(m.kv_layout().global_bytes_per_token(), (72 + 68) / 2.0 + (72 + 68), 1e-9);
}

TEST_F(ForwardState, BadInputIsAnError) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  auto st = m.new_sequence();
  std::vector<int32_t> bad = {0, 5, 4096};
  auto r = m.prefill(*st, bad, 0, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("4096"), std::string::npos) << r.status().message();
  EXPECT_EQ(st->position(), 0);
  std::vector<int32_t> empty;
  EXPECT_FALSE(m.prefill(*st, empty, 0, {}).ok());
}

TEST_F(ForwardState, EncoderReplayKeepsCompressedRowsAndIsClose) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size;
  auto ids = random_prompt(240, 31);
  auto ref = run(ids, 0);
  const int64_t Hp = 201;
  std::span<const int32_t> all(ids);
  auto st = m.new_sequence();
  ASSERT_TRUE(m.prefill(*st, all.subspan(0, Hp), 0, {}).ok());
  std::vector<std::vector<uint8_t>> before;
  for (auto& s : st->sources()) before.push_back(s.kv_rows);
  auto rep = m.encoder_replay(*st, all.subspan(0, Hp), {});
  ASSERT_TRUE(rep.ok()) << rep.status().message();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(st->sources()[i].kv_rows, before[i]) << "source " << i;
  EXPECT_EQ(st->position(), Hp);
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  auto rest = m.prefill(*st, all.subspan(Hp), 0, opt);
  ASSERT_TRUE(rest.ok());
  std::vector<float> tail(ref.logits.begin() + Hp * V, ref.logits.end());
  // An approximation (docs/replay_drift.md has the measured drift): close, finite, not exact.
  // Closeness is the mean KL(exact || replay) of the next-token distributions and the top-1
  // agreement over the 39 rows after the replay (the max row error alone is noisy: one row
  // near a tie decides it).
  ASSERT_EQ(rest->logits.size(), tail.size());
  const ReplayDrift d = replay_drift(tail, rest->logits, V);
  std::cout << "encoder replay: mean KL " << d.mean_kl << ", max KL " << d.max_kl << ", top-1 agreement "
            << d.top1 << ", max row error " << d.max_row_error << "\n";
  EXPECT_TRUE(std::isfinite(d.max_row_error));
  EXPECT_GT(d.max_row_error, kTolExact);
  EXPECT_LE(d.mean_kl, kMaxEncoderReplayMeanKl);
  EXPECT_GE(d.top1, kMinEncoderReplayTop1);
}

TEST_F(ForwardState, EncoderReplayIsTheSpecDefinition) {
  // MODEL_SPEC 4.5 restated through the state's public API: with b = H - W, every window floored
  // at b, the pending ratio>1 groups dropped, the Engram look-back rebuilt from tokens [0, b),
  // positions [b, H) recomputed. The continuation must be bitwise equal to encoder_replay's (a
  // replay window longer or shorter by one row differs).
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size, W = m.config().sliding_window;
  auto ids = random_prompt(240, 31);
  std::span<const int32_t> all(ids);
  const int64_t Hp = 201, b = Hp - W;
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  auto a = m.new_sequence(), s = m.new_sequence();
  ASSERT_TRUE(m.prefill(*a, all.subspan(0, Hp), 0, {}).ok());
  ASSERT_TRUE(m.prefill(*s, all.subspan(0, Hp), 0, {}).ok());
  ASSERT_TRUE(m.encoder_replay(*a, all.subspan(0, Hp), {}).ok());
  for (int64_t l = 0; l < m.config().num_hidden_layers; ++l) s->set_window_floor(l, b);
  for (auto& src : s->sources()) std::fill(src.pend_filled.begin(), src.pend_filled.end(), 0);
  ASSERT_NE(m.hasher(), nullptr);
  engram::EngramHashState hs = m.hasher()->new_state();
  ASSERT_TRUE(m.hasher()->append(hs, all.subspan(0, b), {}, {}).ok());
  s->engram_state() = hs;
  s->set_position(b);
  ASSERT_TRUE(m.prefill(*s, all.subspan(b, W), 0, {}).ok());
  auto ra = m.prefill(*a, all.subspan(Hp), 0, opt);
  auto rs = m.prefill(*s, all.subspan(Hp), 0, opt);
  ASSERT_TRUE(ra.ok() && rs.ok());
  expect_bitwise_equal(rs->logits, ra->logits, V, "encoder replay vs MODEL_SPEC 4.5");
}

TEST_F(ForwardState, ReplaysAreExactWhenNothingIsForgotten) {
  // A prefix no longer than the window loses nothing: both replays must equal the exact path.
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size, W = m.config().sliding_window;
  auto ids = random_prompt(60, 51);
  auto ref = run(ids, 0);
  std::span<const int32_t> all(ids);
  auto st = m.new_sequence();
  ASSERT_TRUE(m.prefill(*st, all.subspan(0, W - 1), 0, {}).ok());
  ASSERT_TRUE(m.encoder_replay(*st, all.subspan(0, W - 1), {}).ok());
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  auto rest = m.prefill(*st, all.subspan(W - 1), 7, opt);
  ASSERT_TRUE(rest.ok());
  std::vector<float> tail(ref.logits.begin() + (W - 1) * V, ref.logits.end());
  expect_bitwise_equal(tail, rest->logits, V, "encoder replay tail");
  auto st2 = m.new_sequence();
  auto dr = m.prefill_decoder_replay(*st2, all.subspan(0, W), opt);
  ASSERT_TRUE(dr.ok());
  std::vector<float> head(ref.logits.begin(), ref.logits.begin() + W * V);
  expect_bitwise_equal(head, dr->logits, V, "decoder replay head");
  for (int64_t p = W; p < 20; ++p) {
    auto o = m.decode_step(*st2, ids[p], {});
    ASSERT_TRUE(o.ok());
    expect_bitwise_equal(slice(ref.logits, p * V, (p + 1) * V), o->logits, V,
                         "position " + std::to_string(p));
  }
}

TEST_F(ForwardState, DecoderReplayComputesOnlyTheTail) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  auto ids = random_prompt(200, 41);
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  auto out = m.prefill_decoder_replay(*st, ids, opt);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(static_cast<int64_t>(out->positions.size()), m.config().sliding_window);
  EXPECT_EQ(out->positions.front(), 200 - m.config().sliding_window);
  EXPECT_EQ(st->position(), 200);
  // The global KV of the last source is complete.
  EXPECT_EQ(st->source(m.schedule().kv_sources.back())->count, 200);
  auto again = m.new_sequence();
  EXPECT_FALSE(m.prefill_decoder_replay(*st, ids, opt).ok());  // needs a fresh state
}

TEST_F(ForwardState, DumpReceivesNamedIntermediatesPerLayer) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const auto& c = m.config();
  std::map<std::string, std::vector<int64_t>> seen;
  model::DumpFn fn = [&](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    ASSERT_NE(data, nullptr);
    seen[name] = shape;
  };
  model::ForwardOptions opt;
  opt.dump = &fn;
  auto ids = random_prompt(30, 61);
  auto st = m.new_sequence();
  ASSERT_TRUE(m.prefill(*st, ids, 0, opt).ok());
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = "layer" + std::to_string(l) + ".";
    for (const char* what : {"attn_in", "attn_out", "ffn_in", "ffn_out", "streams_after_attn",
                             "streams_after_ffn", "hc_attn_pre", "hc_ffn_comb", "window_kv"})
      EXPECT_TRUE(seen.count(L + what)) << L + what;
  }
  EXPECT_EQ(seen.at("layer3.engram_out"), (std::vector<int64_t>{30, c.hc_mult, c.hidden_size}));
  EXPECT_EQ(seen.at("layer2.compressed_kv"), (std::vector<int64_t>{15, c.head_dim}));
  EXPECT_EQ(seen.at("layer4.index_keys"), (std::vector<int64_t>{30, c.index_head_dim}));
  EXPECT_EQ(seen.at("final_hidden"), (std::vector<int64_t>{1, c.hidden_size}));
  EXPECT_FALSE(seen.count("layer0.engram_out"));
}

TEST_F(ForwardState, StaleIndexKeysSwitch) {
  // MODEL_SPEC 7.21: off by default (owner's keys, = exact prefill); on, decode steps with an
  // incomplete ratio-2 pair score against the most recently published keys and may differ.
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size;
  auto ids = random_prompt(140, 71);
  auto ref = run(ids, 0);
  std::span<const int32_t> all(ids);
  auto a = m.new_sequence(), b = m.new_sequence();
  ASSERT_TRUE(m.prefill(*a, all.subspan(0, 100), 0, {}).ok());
  ASSERT_TRUE(m.prefill(*b, all.subspan(0, 100), 0, {}).ok());
  model::ForwardOptions stale;
  stale.stale_index_keys = true;
  double e_stale = 0;
  for (int64_t p = 100; p < 140; ++p) {
    auto oa = m.decode_step(*a, ids[p], {});
    auto ob = m.decode_step(*b, ids[p], stale);
    ASSERT_TRUE(oa.ok() && ob.ok());
    expect_bitwise_equal(slice(ref.logits, p * V, (p + 1) * V), oa->logits, V,
                         "default position " + std::to_string(p));
    e_stale = std::max(e_stale, row_error(&ref.logits[p * V], ob->logits.data(), V));
    for (float v : ob->logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_GT(e_stale, kTolExact);  // the switch really changes the selection on this sequence
}

}  // namespace
}  // namespace ds41::testing
