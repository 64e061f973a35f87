// MODEL_SPEC 4.4 decoder SWA bounded replay on the GPU engine (issue 13,
// gpu::CudaEngine::prefill_decoder_replay) against the CPU engine's (the oracle:
// model::Model::prefill_decoder_replay, ForwardPass::keep_tail_rows), on the golden tiny model
// (window 8, top-k 8, pool 6 x 2; cut at the last KV source, layer 4; layers 5-7 after it, 6 a
// Reindex layer restricted to layer 4's candidates) and the generated `small` model (window 32,
// top-k 64, pool 16 x 8; cut at layer 8; layers 9-15 after it, Reindex 10 / 12 / 14). Prompts of
// 297 / 301 tokens: past every limit of both configs, odd (a ratio-2 pending half pair). Two GPU
// engines: `one_` runs the first pass (the rows before the last window, layers 0..cut) in one
// forward with tensor-core linears; `chunked_` in 48-token forwards with the GEMV / tile kernels
// only (so the first pass is chunked and the two differ in every summation order).
//   - Bit for bit on the GPU: the replay's layers 0..cut equal an exact prefill split at the first
//     kept position on the same engine (the same forwards): every global-KV entry, the pending
//     groups, the window rings of layers 0..cut (and of layer cut+1, computed from layer cut's
//     output), the Engram look-back; floors at the first kept position for the layers after the cut.
//   - Against the CPU engine: position, sequence bytes and the snapshot header (position, Engram
//     look-back, window floors, source counts) equal; the decode continuation within kTolGpuLogits
//     on its first rows (golden: 8 of 12; both engines start from states that differ by the float
//     noise of a ~300-row prefill, see the parity test). The small model (random weights) flips
//     within a few rows from such noise (gpu_test_util.h flip_free_rows): its rows are printed.
//   - The kept rows' logits (CudaEngine::decoder_replay, `score --replay decoder`): the CPU's
//     positions, e_r printed.
//   - A prompt no longer than the window: the replay is the exact prefill (bit-identical state).
//   - Errors as the CPU engine's (empty prompt, vocabulary, context, non-fresh sequence); an Engram
//     layer after the cut refused with the CPU's message; a failure after the first pass committed
//     leaves the sequence fresh and every page free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "engine/cpu_engine.h"
#include "engine/state_codec.h"
#include "gpu/engine/gpu_test_util.h"
#include "model/decoder_replay_plan.h"

namespace ds41::testing {
namespace {

struct ReplayCase {
  const char* name;
  bool small;
};

using Blocks = std::vector<std::vector<uint8_t>>;

class GpuDecoderReplay : public ::testing::TestWithParam<ReplayCase> {
 protected:
  void SetUp() override {
    DS41_SKIP_WITHOUT_GPU();
    const std::string dir = GetParam().small ? small_model_dir() : golden_dir();
    cpu_model_ = load_cpu_model(dir, 8);
    ASSERT_TRUE(cpu_model_.model);
    cpu_ = std::make_unique<engine::CpuEngine>(cpu_model_.model.get(), "test");
    dev_ = load_device_model(dir);
    ASSERT_TRUE(dev_);
    one_ = make_engine(*dev_, 64);
    chunked_ = make_engine(*dev_, 64, 4096, /*step_tokens=*/48, /*tensor_core_min_rows=*/0);
    ASSERT_TRUE(one_ && chunked_);
    V_ = dev_->config().vocab_size;
    len_ = GetParam().small ? 301 : 297;
    auto p = model::plan_decoder_replay(dev_->config(), dev_->schedule(), len_);
    ASSERT_TRUE(p.ok()) << p.status().message();
    plan_ = *p;
    std::cout << GetParam().name << ": " << len_ << "-token prompt, cut at layer " << plan_.cut << ", "
              << plan_.keep << " kept rows from position " << plan_.first_kept << "\n";
  }
  std::vector<int32_t> tokens(int64_t n, uint64_t seed) { return seeded_tokens(n, V_, seed); }

  // An exact prefill (no logits) through Engine::step.
  void prefill(engine::Engine& e, engine::SeqId s, std::span<const int32_t> t) {
    engine::StepItem it{s, t, false};
    engine::StepOutput so;
    Status st = e.step(std::span<const engine::StepItem>(&it, 1), &so);
    ASSERT_TRUE(st.ok()) << st.message();
  }
  // Blocks of B tokens for every full block, and the SWA snapshot at the position.
  void export_state(const engine::Engine& e, engine::SeqId s, int64_t B, Blocks* blocks,
                    std::vector<uint8_t>* snap) {
    const int64_t pos = *e.sequence_position(s);
    blocks->clear();
    for (int64_t i = 0; i < pos / B; ++i) {
      auto b = e.export_kv_block(s, i, B);
      ASSERT_TRUE(b.ok()) << b.status().message();
      blocks->push_back(std::move(*b));
    }
    auto sn = e.export_swa_snapshot(s, B, true);
    ASSERT_TRUE(sn.ok()) << sn.status().message();
    *snap = std::move(*sn);
  }
  void expect_header_equal(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                           const std::string& what) {
    const size_t fixed = swa_snapshot_fixed_bytes(dev_->kv_layout());
    ASSERT_GE(want.size(), fixed) << what;
    ASSERT_EQ(want.size(), got.size()) << what;
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + fixed, got.begin()))
        << what << ": the state after the replay (position, Engram look-back, window floors, counts) differs";
  }

  TestModel cpu_model_;
  std::unique_ptr<engine::CpuEngine> cpu_;
  std::unique_ptr<gpu::DeviceModel> dev_;
  std::unique_ptr<gpu::CudaEngine> one_, chunked_;
  model::DecoderReplayPlan plan_;
  int64_t V_ = 0, len_ = 0;
};

TEST_P(GpuDecoderReplay, MatchesTheCpuEngine) {
  auto t = tokens(len_ + 12, 61);
  std::span<const int32_t> T(t);
  const std::span<const int32_t> prompt = T.first(len_), next = T.subspan(len_);
  auto c = cpu_->create_sequence();
  ASSERT_TRUE(c.ok());
  Status st = cpu_->prefill_decoder_replay(*c, prompt);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<uint8_t> csnap;
  {
    auto s = cpu_->export_swa_snapshot(*c, 128, true);
    ASSERT_TRUE(s.ok()) << s.status().message();
    csnap = std::move(*s);
  }
  std::vector<float> got[2];
  gpu::CudaEngine* engines[2] = {one_.get(), chunked_.get()};
  const char* names[2] = {"one forward, tensor cores", "48-token forwards, GEMV"};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(names[i]);
    gpu::CudaEngine& e = *engines[i];
    auto g = e.create_sequence();
    ASSERT_TRUE(g.ok());
    st = e.prefill_decoder_replay(*g, prompt);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(*e.sequence_position(*g), len_);
    EXPECT_EQ(*e.sequence_bytes(*g), *cpu_->sequence_bytes(*c)) << "entry counts differ from the CPU's";
    auto gs = e.export_swa_snapshot(*g, 128, true);
    ASSERT_TRUE(gs.ok()) << gs.status().message();
    expect_header_equal(csnap, *gs, std::string(GetParam().name) + " " + names[i]);
    got[i] = decode_rows(e, *g, next, V_);
  }
  const std::vector<float> want = decode_rows(*cpu_, *c, next, V_);
  ASSERT_EQ(want.size(), got[0].size());
  ASSERT_EQ(want.size(), got[1].size());
  const int64_t rows = static_cast<int64_t>(next.size());
  // The same prompt prefilled EXACTLY on both engines, then the same continuation: the rows over
  // which the two exact engines agree bound what the replay can be held to (a fake-quant midpoint
  // or top-k tie flipped by the engines' summation orders inside the ~300-row prompt parts them at
  // the same row with or without a replay: measured on the H200, both GPU replays parted from the
  // CPU's at row 4 with e_r 0.025 and agreed with each other on all 12 rows).
  std::vector<float> exact_cpu, exact_gpu;
  {
    auto ce = cpu_->create_sequence();
    auto ge = one_->create_sequence();
    ASSERT_TRUE(ce.ok() && ge.ok());
    prefill(*cpu_, *ce, prompt);
    prefill(*one_, *ge, prompt);
    exact_cpu = decode_rows(*cpu_, *ce, next, V_);
    exact_gpu = decode_rows(*one_, *ge, next, V_);
  }
  const int64_t exact_agree = flip_free_rows(exact_cpu, exact_gpu, V_, kTolGpuLogits);
  std::cout << GetParam().name << " exact prefill, GPU vs CPU: continuation agrees on the first " << exact_agree
            << " of " << next.size() << " rows\n";
  // Strict rows: the golden model's first 8 continuation rows, or fewer where the exact engines
  // already part (a replay bug — a wrong floor, a missed ring row, a stale candidate mask — moves the
  // first rows by far more than 5e-3). None for the small model (see the file comment).
  const int64_t strict = GetParam().small ? 0 : std::min<int64_t>(8, exact_agree);
  for (int i = 0; i < 2; ++i) {
    if (strict > 0)
      expect_rows_close(
          first_logit_rows(want, strict, V_), first_logit_rows(got[i], strict, V_), V_, kTolGpuLogits,
          std::string(GetParam().name) + " decoder replay (" + names[i] + ") vs CPU, strict rows");
    std::cout << GetParam().name << " " << names[i] << " vs CPU, per row e_r:";
    for (int64_t r = 0; r < rows; ++r) std::cout << " " << row_error(&want[r * V_], &got[i][r * V_], V_);
    std::cout << "\n";
  }
  std::cout << GetParam().name
            << " GPU one-forward vs GPU chunked continuation agree within tol on the first "
            << flip_free_rows(got[0], got[1], V_, kTolGpuLogits) << " of " << rows << " rows\n";
}

// CudaEngine::decoder_replay with the kept rows' logits (`ds41 score --device cuda --replay
// decoder`) against Model::prefill_decoder_replay's: the same positions; the rows' e_r printed
// (they are prompt rows ~300 deep, past the GPU's own flip point in the parity test: the replay's
// correctness is held bit for bit by the other tests of this file).
TEST_P(GpuDecoderReplay, KeptRowsLogits) {
  auto t = tokens(len_, 67);
  auto st = cpu_model_.model->new_sequence();
  model::ForwardOptions o;
  o.logits = model::LogitsRows::kAll;
  auto want = cpu_model_.model->prefill_decoder_replay(*st, t, o);
  ASSERT_TRUE(want.ok()) << want.status().message();
  for (gpu::CudaEngine* e : {one_.get(), chunked_.get()}) {
    auto g = e->create_sequence();
    ASSERT_TRUE(g.ok());
    model::SequenceOutput got;
    Status s = e->decoder_replay(*g, t, model::LogitsRows::kAll, &got);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(got.positions, want->positions);
    ASSERT_EQ(got.logits.size(), want->logits.size());
    ASSERT_EQ(static_cast<int64_t>(got.positions.size()), plan_.keep);
    EXPECT_EQ(got.positions.front(), plan_.first_kept);
    std::cout << GetParam().name << (e == one_.get() ? " one forward" : " 48-token forwards")
              << ": kept rows vs CPU e_r:";
    for (int64_t r = 0; r < plan_.keep; ++r)
      std::cout << " " << row_error(&want->logits[r * V_], &got.logits[r * V_], V_);
    std::cout << "\n";
    EXPECT_EQ(*e->sequence_position(*g), len_);
    ASSERT_TRUE(e->free_sequence(*g).ok());
  }
}

TEST_P(GpuDecoderReplay, LayersUpToTheCutEqualASplitExactPrefillBitForBit) {
  auto t = tokens(len_, 71);
  const std::span<const int32_t> prompt(t);
  const model::KvLayout& L = dev_->kv_layout();
  const int64_t B = 2;  // every source's ratio divides it: the blocks hold every complete entry
  for (gpu::CudaEngine* e : {one_.get(), chunked_.get()}) {
    SCOPED_TRACE(e == one_.get() ? "one forward" : "48-token forwards");
    auto dr = e->create_sequence(), ex = e->create_sequence();
    ASSERT_TRUE(dr.ok() && ex.ok());
    Status st = e->prefill_decoder_replay(*dr, prompt);
    ASSERT_TRUE(st.ok()) << st.message();
    // The same forwards as the replay's two passes, every layer in both.
    prefill(*e, *ex, prompt.first(plan_.first_kept));
    prefill(*e, *ex, prompt.subspan(plan_.first_kept));
    Blocks bd, be;
    std::vector<uint8_t> sd, se;
    export_state(*e, *dr, B, &bd, &sd);
    export_state(*e, *ex, B, &be, &se);
    ASSERT_EQ(bd.size(), be.size());
    int64_t differ = 0;
    for (size_t i = 0; i < bd.size(); ++i) differ += bd[i] != be[i];
    EXPECT_EQ(differ, 0) << differ << " of " << bd.size() << " global-KV blocks of " << B
                         << " tokens differ from the exact prefill's";
    std::vector<std::span<const uint8_t>> sbd(bd.begin(), bd.end()), sbe(be.begin(), be.end());
    auto pd = engine::parse_state(L, 0, sbd, sd, B);
    auto pe = engine::parse_state(L, 0, sbe, se, B);
    ASSERT_TRUE(pd.ok()) << pd.status().message();
    ASSERT_TRUE(pe.ok()) << pe.status().message();
    EXPECT_EQ(pd->position, len_);
    EXPECT_EQ(pd->last_published_source, pe->last_published_source);
    EXPECT_TRUE(pd->engram.recent == pe->engram.recent && pd->engram.length == pe->engram.length)
        << "Engram look-back";
    for (size_t j = 0; j < L.sources.size(); ++j) {
      const model::KvSourceLayout& sl = L.sources[j];
      const engine::ParsedSource &a = pd->sources[j], &b = pe->sources[j];
      ASSERT_EQ(a.count, b.count) << "source " << sl.layer;
      ASSERT_EQ(a.tail, b.tail) << "source " << sl.layer;
      EXPECT_EQ(std::memcmp(a.tail_kv, b.tail_kv, a.tail * sl.kv_row_bytes), 0)
          << "tail entries of " << sl.layer;
      EXPECT_EQ(std::memcmp(a.tail_key, b.tail_key, a.tail * sl.key_row_bytes), 0)
          << "tail keys of " << sl.layer;
      if (sl.ratio > 1) {
        ASSERT_TRUE(a.pend_filled && b.pend_filled);
        EXPECT_EQ(std::memcmp(a.pend_filled, b.pend_filled, sl.ratio), 0) << "pending flags of " << sl.layer;
        // The filled rows (a row not filled holds whatever its slot held before: not state).
        const size_t rb = static_cast<size_t>(sl.kv_dim) * sizeof(float);
        for (int64_t i = 0; i < sl.ratio; ++i) {
          if (!a.pend_filled[i]) continue;
          EXPECT_EQ(std::memcmp(a.pend_a + i * rb, b.pend_a + i * rb, rb), 0) << "pending a of " << sl.layer;
          EXPECT_EQ(std::memcmp(a.pend_b + i * rb, b.pend_b + i * rb, rb), 0) << "pending b of " << sl.layer;
        }
      }
    }
    const int64_t ring_bytes = std::min(len_, L.window) * L.window_row_bytes;
    for (int64_t l = 0; l < L.n_layers; ++l) {
      const bool same = std::memcmp(pd->rings[l], pe->rings[l], static_cast<size_t>(ring_bytes)) == 0;
      // Layers 0..cut: the same rows; layer cut + 1: its window rows come from layer cut's output.
      if (l <= plan_.cut + 1) EXPECT_TRUE(same) << "window ring of layer " << l;
      EXPECT_EQ(pd->window_floors[l], l > plan_.cut ? plan_.first_kept : 0) << "window floor of layer " << l;
      EXPECT_EQ(pe->window_floors[l], 0);
    }
    ASSERT_TRUE(e->free_sequence(*dr).ok());
    ASSERT_TRUE(e->free_sequence(*ex).ok());
    EXPECT_EQ(e->pool().pages().used_pages(), 0);
  }
}

TEST_P(GpuDecoderReplay, PromptWithinTheWindowIsTheExactPrefill) {
  const int64_t W = dev_->config().sliding_window;
  for (int64_t n : {W - 1, W}) {
    SCOPED_TRACE(std::to_string(n) + " tokens");
    auto t = tokens(n + 6, 81 + n);
    std::span<const int32_t> T(t);
    auto dr = one_->create_sequence(), ex = one_->create_sequence();
    ASSERT_TRUE(dr.ok() && ex.ok());
    Status st = one_->prefill_decoder_replay(*dr, T.first(n));
    ASSERT_TRUE(st.ok()) << st.message();
    prefill(*one_, *ex, T.first(n));
    auto sd = one_->export_swa_snapshot(*dr, 128, true), se = one_->export_swa_snapshot(*ex, 128, true);
    ASSERT_TRUE(sd.ok() && se.ok());
    // Header and window rings (the payload up to the partial block's rows): nothing is dropped, the
    // state must be the exact prefill's; the rest of the state shows in the continuation.
    const model::KvLayout& L = dev_->kv_layout();
    const size_t upto =
        swa_snapshot_fixed_bytes(L) + static_cast<size_t>(L.n_layers * n * L.window_row_bytes);
    ASSERT_EQ(sd->size(), se->size());
    ASSERT_GE(sd->size(), upto);
    EXPECT_TRUE(std::equal(sd->begin(), sd->begin() + upto, se->begin()))
        << "nothing is dropped: the state must be the exact prefill's";
    const auto a = decode_rows(*one_, *dr, T.subspan(n), V_), b = decode_rows(*one_, *ex, T.subspan(n), V_);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    ASSERT_TRUE(one_->free_sequence(*dr).ok());
    ASSERT_TRUE(one_->free_sequence(*ex).ok());
  }
}

TEST_P(GpuDecoderReplay, ErrorsAsTheCpuEngineLeaveTheSequenceUnchanged) {
  auto t = tokens(len_, 91);
  std::span<const int32_t> T(t);
  auto check = [&](engine::Engine& ce, engine::SeqId cs, gpu::CudaEngine& ge, engine::SeqId gs,
                   std::span<const int32_t> toks, StatusCode code, const std::string& what) {
    const int64_t pos = *ge.sequence_position(gs), bytes = *ge.sequence_bytes(gs);
    const int64_t free_pages = ge.pool().pages().free_pages();
    Status c = ce.prefill_decoder_replay(cs, toks), g = ge.prefill_decoder_replay(gs, toks);
    std::cout << what << ": GPU \"" << g.message() << "\", CPU \"" << c.message() << "\"\n";
    EXPECT_EQ(g.code(), code) << what;
    EXPECT_EQ(g.code(), c.code()) << what;
    EXPECT_EQ(g.message(), c.message()) << what;
    EXPECT_EQ(*ge.sequence_position(gs), pos) << what;
    EXPECT_EQ(*ge.sequence_bytes(gs), bytes) << what;
    EXPECT_EQ(ge.pool().pages().free_pages(), free_pages) << what;
  };
  auto c = cpu_->create_sequence();
  auto g = one_->create_sequence();
  ASSERT_TRUE(c.ok() && g.ok());
  check(*cpu_, *c, *one_, *g, T.first(0), StatusCode::kInvalidArgument, "empty prompt");
  std::vector<int32_t> bad(t.begin(), t.begin() + 20);
  bad[7] = static_cast<int32_t>(V_);
  check(*cpu_, *c, *one_, *g, bad, StatusCode::kInvalidArgument, "token outside the vocabulary");
  {  // Past the context of both engines (256 positions).
    engine::CpuEngine cpu256(cpu_model_.model.get(), "test", 256);
    auto g256 = make_engine(*dev_, 64, 256);
    ASSERT_TRUE(g256);
    auto c2 = cpu256.create_sequence();
    auto g2 = g256->create_sequence();
    ASSERT_TRUE(c2.ok() && g2.ok());
    check(cpu256, *c2, *g256, *g2, T, StatusCode::kOutOfRange, "prompt past the context");
  }
  // A sequence that already holds positions.
  prefill(*cpu_, *c, T.first(10));
  prefill(*one_, *g, T.first(10));
  check(*cpu_, *c, *one_, *g, T.subspan(10), StatusCode::kFailedPrecondition, "non-fresh sequence");
}

// A failure in the second pass (every layer over the last window), after the first pass (layers
// 0..cut over the rows before it) committed: an engine whose index-key workspace holds the keys
// of the first pass but not of the whole prompt (max_step_key_rows = first_kept; the last KV source
// has ratio 1 on both models). The sequence must be fresh again: position 0, no page, floors 0,
// and it must compute exactly like a new sequence.
TEST_P(GpuDecoderReplay, FailureAfterTheFirstPassLeavesTheSequenceFresh) {
  ASSERT_EQ(dev_->schedule().layers[plan_.cut].ratio, 1);
  gpu::CudaEngineOptions o;
  o.model_name = "test";
  o.limits.max_step_tokens = 64;
  o.limits.max_step_seqs = 2;
  o.limits.max_logit_rows = 2;
  o.limits.max_context = 4096;
  o.limits.max_step_key_rows = plan_.first_kept;
  o.max_sequences = 4;
  o.kv_bytes = int64_t{64} << 20;
  auto made = gpu::CudaEngine::create(dev_.get(), o);
  ASSERT_TRUE(made.ok()) << made.status().message();
  gpu::CudaEngine& e = **made;
  auto t = tokens(len_, 101);
  std::span<const int32_t> T(t);
  auto g = e.create_sequence(), fresh = e.create_sequence();
  ASSERT_TRUE(g.ok() && fresh.ok());
  const int64_t bytes0 = *e.sequence_bytes(*g);
  auto snap0 = e.export_swa_snapshot(*fresh, 128, true);
  ASSERT_TRUE(snap0.ok()) << snap0.status().message();
  Status st = e.prefill_decoder_replay(*g, T);
  std::cout << GetParam().name << ": " << st.message() << "\n";
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("max_step_key_rows"), std::string::npos) << st.message();
  EXPECT_EQ(*e.sequence_position(*g), 0);
  EXPECT_EQ(*e.sequence_bytes(*g), bytes0);
  EXPECT_EQ(e.pool().pages().used_pages(), 0) << "pages of the committed first pass must be released";
  auto snap1 = e.export_swa_snapshot(*g, 128, true);
  ASSERT_TRUE(snap1.ok()) << snap1.status().message();
  // The header (position, Engram look-back, floors, counts); the pending rows that follow are
  // whatever the two slots held (none is filled at position 0).
  expect_header_equal(*snap0, *snap1, "the failed sequence vs a new one");
  // It computes like a new sequence: a prefill that fits, then decode steps, bit for bit.
  const int64_t n = plan_.first_kept / 2;
  prefill(e, *g, T.first(n));
  prefill(e, *fresh, T.first(n));
  const auto a = decode_rows(e, *g, T.subspan(n, 6), V_), b = decode_rows(e, *fresh, T.subspan(n, 6), V_);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuDecoderReplay,
                         ::testing::Values(ReplayCase{"golden", false}, ReplayCase{"small", true}),
                         [](const auto& info) { return std::string(info.param.name); });

// The tiny preset with its second Engram layer moved after the last KV source (layer 4 -> 5): the
// GPU engine refuses the replay with the CPU engine's message and the sequence stays fresh.
TEST(GpuDecoderReplayRefusal, EngramLayerAfterTheCut) {
  DS41_SKIP_WITHOUT_GPU();
  const std::string dir = std::string(DS41_BINARY_DIR) + "/tests/gpu/engine/tiny-engram-after-cut";
  if (!std::filesystem::exists(dir + "/config.json")) {
    auto c = model::preset_config("tiny");
    ASSERT_TRUE(c.ok());
    c->engram_layer_ids = {1, 5};  // the table sizes depend on the number of Engram layers only
    model::MakeCheckpointOptions mo;
    mo.seed = 43;
    auto made = model::make_checkpoint(dir, *c, mo);
    ASSERT_TRUE(made.ok()) << made.status().message();
  }
  TestModel cpu = load_cpu_model(dir, 2);
  ASSERT_TRUE(cpu.model);
  engine::CpuEngine ce(cpu.model.get(), "test");
  auto dev = load_device_model(dir);
  ASSERT_TRUE(dev);
  auto ge = make_engine(*dev, 8);
  ASSERT_TRUE(ge);
  auto t = seeded_tokens(40, dev->config().vocab_size, 7);
  auto c = ce.create_sequence();
  auto g = ge->create_sequence();
  ASSERT_TRUE(c.ok() && g.ok());
  Status cs = ce.prefill_decoder_replay(*c, t), gs = ge->prefill_decoder_replay(*g, t);
  std::cout << "Engram after the cut: GPU \"" << gs.message() << "\"\n";
  EXPECT_EQ(gs.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(gs.message(), cs.message());
  EXPECT_NE(gs.message().find("Engram layer 5"), std::string::npos);
  EXPECT_EQ(*ge->sequence_position(*g), 0);
  EXPECT_EQ(ge->pool().pages().used_pages(), 0);
  // The exact path still serves it.
  engine::StepItem it{*g, t, true};
  engine::StepOutput so;
  Status st = ge->step(std::span<const engine::StepItem>(&it, 1), &so);
  EXPECT_TRUE(st.ok()) << st.message();
}

}  // namespace
}  // namespace ds41::testing
