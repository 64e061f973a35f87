// Chunked prefill, decode and batching are exact (MODEL_SPEC 4.2-4.3): the same logits as one
// exact prefill, for chunk boundaries anywhere (inside ratio-2 pairs, across the Engram
// look-back, the window and the candidate pool). Sequences of 300 tokens exceed the tiny
// config's window (8), top-k (8), ratio-2 pairing (150 pairs) and candidate pool (6 x 2).
#include <gtest/gtest.h>

#include <random>

#include "golden/golden_arrays.h"

namespace ds41::testing {
namespace {

constexpr double kTolExact = 1e-5;

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
    double e = max_row_error(ref.logits, got.logits, V);
    EXPECT_LE(e, kTolExact) << "chunk " << chunk;
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
  double w = row_error(&ref.logits[(P - 1) * V], pre->logits.data(), V);
  for (int64_t p = P; p < static_cast<int64_t>(ids.size()); ++p) {
    auto o = m.decode_step(*st, ids[p], opt);
    ASSERT_TRUE(o.ok());
    w = std::max(w, row_error(&ref.logits[p * V], o->logits.data(), V));
  }
  EXPECT_LE(w, kTolExact);
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
  EXPECT_LE(max_row_error(ra.logits, out[0].logits, V), kTolExact);
  std::vector<float> rb_tail(rb.logits.begin() + 40 * V, rb.logits.end());
  EXPECT_LE(max_row_error(rb_tail, out[1].logits, V), kTolExact);
  std::vector<float> rc_head(rc.logits.begin(), rc.logits.begin() + 200 * V);
  EXPECT_LE(max_row_error(rc_head, out[2].logits, V), kTolExact);
  // Step 2: a mixed batch — c finishes its prefill (3 rows) while a decodes one token.
  std::vector<int32_t> a_next = {c[5]};
  std::vector<model::SequenceInput> mixed = {{sc.get(), Cc.subspan(200), {}}, {sa.get(), a_next, {}}};
  ASSERT_TRUE(m.forward(mixed, opt, &out).ok());
  std::vector<float> rc_tail(rc.logits.begin() + 200 * V, rc.logits.end());
  EXPECT_LE(max_row_error(rc_tail, out[0].logits, V), kTolExact);
  std::vector<int32_t> a_ext = a;
  a_ext.push_back(c[5]);
  auto rae = run(a_ext, 0);
  std::vector<float> rae_last(rae.logits.end() - V, rae.logits.end());
  EXPECT_LE(max_row_error(rae_last, out[1].logits, V), kTolExact);
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
  // An approximation (docs/replay_drift.md has the measured drift): finite and not exact.
  double e = max_row_error(tail, rest->logits, V);
  EXPECT_TRUE(std::isfinite(e));
  EXPECT_GT(e, kTolExact);
  std::cout << "encoder replay max row error " << e << "\n";
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
  EXPECT_LE(max_row_error(tail, rest->logits, V), kTolExact);
  auto st2 = m.new_sequence();
  auto dr = m.prefill_decoder_replay(*st2, all.subspan(0, W), opt);
  ASSERT_TRUE(dr.ok());
  std::vector<float> head(ref.logits.begin(), ref.logits.begin() + W * V);
  EXPECT_LE(max_row_error(head, dr->logits, V), kTolExact);
  for (int64_t p = W; p < 20; ++p) {
    auto o = m.decode_step(*st2, ids[p], {});
    ASSERT_TRUE(o.ok());
    EXPECT_LE(row_error(&ref.logits[p * V], o->logits.data(), V), kTolExact) << "position " << p;
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
  double e_default = 0, e_stale = 0;
  for (int64_t p = 100; p < 140; ++p) {
    auto oa = m.decode_step(*a, ids[p], {});
    auto ob = m.decode_step(*b, ids[p], stale);
    ASSERT_TRUE(oa.ok() && ob.ok());
    e_default = std::max(e_default, row_error(&ref.logits[p * V], oa->logits.data(), V));
    e_stale = std::max(e_stale, row_error(&ref.logits[p * V], ob->logits.data(), V));
    for (float v : ob->logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_LE(e_default, kTolExact);
  EXPECT_GT(e_stale, kTolExact);  // the switch really changes the selection on this sequence
}

}  // namespace
}  // namespace ds41::testing
