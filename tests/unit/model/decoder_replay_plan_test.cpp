// MODEL_SPEC 4.4 decoder replay: the plan both engines share (model/decoder_replay_plan.h: cut,
// kept rows, floors, refusals) on every preset, and — on the CPU reference, bit for bit — the
// decomposition the GPU engine runs (gpu::CudaEngine::prefill_decoder_replay): (a) the rows before
// the last window through layers 0..cut only, in chunks; (b) the floors of the later layers raised
// to the first kept position; (c) an ordinary forward of the last window. It must leave exactly
// the state of the one-shot Model::prefill_decoder_replay (ForwardPass::keep_tail_rows) and
// continue with the same logits. Golden tiny model (window 8, top-k 8, pool 6 x 2, cut at layer
// 4), 299 tokens: past every limit, odd (a ratio-2 pending half pair), (a) cut into 37-token chunks
// (boundaries inside ratio-2 pairs and candidate blocks).
#include "model/decoder_replay_plan.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "golden/golden_arrays.h"
#include "model/checkpoint_maker.h"
#include "model/forward_pass.h"
#include "model/presets.h"

namespace ds41::testing {
namespace {

model::LayerSchedule schedule_of(const model::ModelConfig& c) {
  auto s = model::derive_layer_schedule(c);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : model::LayerSchedule{};
}

TEST(DecoderReplayPlan, CutsAtTheLastKvSourceOfEveryPreset) {
  struct Want {
    const char* preset;
    int64_t cut;
  };
  for (const Want& w :
       {Want{"tiny", 4}, Want{"small", 8}, Want{"v41-flash", 20}, Want{"v41-flash-slice", 4}}) {
    SCOPED_TRACE(w.preset);
    auto c = model::preset_config(w.preset);
    ASSERT_TRUE(c.ok());
    const int64_t W = c->sliding_window;
    for (int64_t n : {int64_t{1}, W - 1, W, W + 1, 3 * W + 5}) {
      auto p = model::plan_decoder_replay(*c, schedule_of(*c), n);
      ASSERT_TRUE(p.ok()) << p.status().message();
      EXPECT_EQ(p->cut, w.cut);
      EXPECT_EQ(p->keep, std::min(n, W));
      EXPECT_EQ(p->first_kept, n - std::min(n, W));
      EXPECT_EQ(p->tokens, n);
    }
  }
}

TEST(DecoderReplayPlan, FloorsRiseOnlyAfterTheCut) {
  auto c = model::preset_config("tiny");
  ASSERT_TRUE(c.ok());
  auto p = model::plan_decoder_replay(*c, schedule_of(*c), 100);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->first_kept, 92);
  EXPECT_EQ(p->floor_after(4, 0), 0);    // the cut runs on every row
  EXPECT_EQ(p->floor_after(3, 7), 7);    // an existing floor before the cut stays
  EXPECT_EQ(p->floor_after(5, 0), 92);   // after the cut: the first kept position
  EXPECT_EQ(p->floor_after(7, 50), 92);  // max with an existing floor
  EXPECT_EQ(p->floor_after(7, 120), 120);
  auto s = model::plan_decoder_replay(*c, schedule_of(*c), 5);  // shorter than the window
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->first_kept, 0);
  EXPECT_EQ(s->floor_after(6, 0), 0);
}

TEST(DecoderReplayPlan, RefusesAnEngramLayerAfterTheCutAndNoKvSource) {
  auto c = model::preset_config("tiny");
  ASSERT_TRUE(c.ok());
  c->engram_layer_ids = {1, 5};
  auto p = model::plan_decoder_replay(*c, schedule_of(*c), 100);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            "decoder replay: Engram layer 5 lies after the cut at layer 4 (MODEL_SPEC 4.4)");
  c->engram_layer_ids = {1, 4};  // at the cut: it runs on every row
  EXPECT_TRUE(model::plan_decoder_replay(*c, schedule_of(*c), 100).ok());
  auto none = model::plan_decoder_replay(*c, model::LayerSchedule{}, 100);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message(), "decoder replay: the model has no KV source");
}

// BOS then random ids of the tiny vocabulary.
std::vector<int32_t> prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 2047);
  std::vector<int32_t> v{0};
  while (static_cast<int64_t>(v.size()) < n) v.push_back(d(rng));
  return v;
}

class DecoderReplayDecomposition : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new TestModel(load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  // (a): layers 0..last only over `tokens` (no head), as GpuForwardOptions::last_layer.
  static void run_through(model::SequenceState& st, std::span<const int32_t> tokens, int64_t last) {
    model::ForwardOptions o;
    o.logits = model::LogitsRows::kNone;
    model::ForwardPass fp(*tm_->model, o);
    model::SequenceInput in{&st, tokens, {}};
    ASSERT_TRUE(fp.setup(std::span<const model::SequenceInput>(&in, 1)).ok());
    for (int64_t l = 0; l <= last; ++l) fp.run_layer(l);
    std::vector<model::SequenceOutput> out;
    fp.finish(&out);
  }
  static void expect_same_state(model::SequenceState& want, model::SequenceState& got) {
    const model::KvLayout& L = want.layout();
    EXPECT_EQ(want.position(), got.position());
    EXPECT_EQ(want.last_published_source, got.last_published_source);
    EXPECT_TRUE(want.engram_state().recent == got.engram_state().recent);
    EXPECT_EQ(want.engram_state().length, got.engram_state().length);
    for (int64_t l = 0; l < L.n_layers; ++l) {
      EXPECT_EQ(want.window_floor(l), got.window_floor(l)) << "floor of layer " << l;
      for (int64_t p = std::max<int64_t>(0, want.position() - L.window); p < want.position(); ++p)
        EXPECT_EQ(std::memcmp(want.window_row(l, p), got.window_row(l, p), L.window_row_bytes), 0)
            << "window row of layer " << l << " position " << p;
    }
    for (size_t j = 0; j < want.sources().size(); ++j) {
      const model::KvSourceState &a = want.sources()[j], &b = got.sources()[j];
      EXPECT_EQ(a.count, b.count) << "source " << a.layout.layer;
      EXPECT_TRUE(a.kv_rows == b.kv_rows) << "compressed rows of " << a.layout.layer;
      EXPECT_TRUE(a.key_rows == b.key_rows) << "index keys of " << a.layout.layer;
      EXPECT_TRUE(a.pend_filled == b.pend_filled) << "pending flags of " << a.layout.layer;
      EXPECT_TRUE(a.pend_a == b.pend_a && a.pend_b == b.pend_b) << "pending rows of " << a.layout.layer;
    }
  }
  static TestModel* tm_;
};
TestModel* DecoderReplayDecomposition::tm_ = nullptr;

// The config the GPU test GpuDecoderReplayRefusal.EngramLayerAfterTheCut uses (the tiny preset
// with Engram at layer 5 > cut 4) is a valid checkpoint: it loads, prefills exactly, and the
// reference refuses its decoder replay with the plan's message.
TEST(DecoderReplayRefusal, EngramLayerAfterTheCutLoadsAndIsRefused) {
  auto c = model::preset_config("tiny");
  ASSERT_TRUE(c.ok());
  c->engram_layer_ids = {1, 5};  // the table sizes depend on the number of Engram layers only
  ASSERT_TRUE(model::validate_model_config(*c).ok());
  const std::string dir = std::string(DS41_BINARY_DIR) + "/tests/unit/model/tiny-engram-after-cut";
  if (!std::filesystem::exists(dir + "/config.json")) {
    model::MakeCheckpointOptions mo;
    mo.seed = 43;
    auto made = model::make_checkpoint(dir, *c, mo);
    ASSERT_TRUE(made.ok()) << made.status().message();
  }
  TestModel tm = load_golden_model(2, dir);
  ASSERT_TRUE(tm.model);
  auto ids = prompt(40, 3);
  auto st = tm.model->new_sequence();
  auto r = tm.model->prefill_decoder_replay(*st, ids, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "decoder replay: Engram layer 5 lies after the cut at layer 4 (MODEL_SPEC 4.4)");
  EXPECT_EQ(st->position(), 0);
  EXPECT_TRUE(tm.model->prefill(*st, ids, 0, {}).ok());
}

TEST_F(DecoderReplayDecomposition, EqualsTheOneShotReplayBitForBit) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size, n = 299;
  auto ids = prompt(n + 10, 7);
  std::span<const int32_t> all(ids);
  const std::span<const int32_t> T = all.first(n);
  auto p = model::plan_decoder_replay(m.config(), m.schedule(), n);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->first_kept, n - m.config().sliding_window);
  // The oracle: one forward, keep_tail_rows after the cut.
  auto one = m.new_sequence();
  ASSERT_TRUE(m.prefill_decoder_replay(*one, T, {}).ok());
  // The GPU engine's decomposition.
  auto two = m.new_sequence();
  for (int64_t b = 0; b < p->first_kept; b += 37)
    run_through(*two, T.subspan(b, std::min<int64_t>(37, p->first_kept - b)), p->cut);
  ASSERT_EQ(two->position(), p->first_kept);
  for (int64_t l = 0; l < m.config().num_hidden_layers; ++l)
    two->set_window_floor(l, p->floor_after(l, two->window_floor(l)));
  ASSERT_TRUE(m.prefill(*two, T.subspan(p->first_kept), 0, {}).ok());
  expect_same_state(*one, *two);
  // And the continuation (the floors persist: the first decode steps still see them).
  for (int64_t t = n; t < n + 10; ++t) {
    auto a = m.decode_step(*one, ids[t], {});
    auto b = m.decode_step(*two, ids[t], {});
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->logits.size(), static_cast<size_t>(V));
    EXPECT_EQ(std::memcmp(a->logits.data(), b->logits.data(), V * sizeof(float)), 0) << "position " << t;
  }
  // The floors are what the replay must leave: a forward of the tail without them differs.
  auto three = m.new_sequence();
  run_through(*three, T.first(p->first_kept), p->cut);
  ASSERT_TRUE(m.prefill(*three, T.subspan(p->first_kept), 0, {}).ok());
  const model::KvLayout& L = one->layout();
  bool rings_differ = false;
  for (int64_t l = p->cut + 2; l < L.n_layers; ++l)
    for (int64_t q = p->first_kept; q < n; ++q)
      rings_differ = rings_differ ||
                     std::memcmp(one->window_row(l, q), three->window_row(l, q), L.window_row_bytes) != 0;
  EXPECT_TRUE(rings_differ) << "without the floors the layers after the cut read unwritten ring rows";
}

}  // namespace
}  // namespace ds41::testing
