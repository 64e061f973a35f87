// DSpark speculative decoding on the GPU engine (issue 17, MODEL_SPEC 3.10; docs/dspark.md):
//   - Lossless: greedy generation through CudaEngine::speculative_step equals plain greedy decode
//     token for token, on the DSpark golden tiny model (the golden prompt: 44 tokens with planted
//     bigrams, so candidates are accepted) and the `small` preset (long prompt, random draft), with
//     the verify length cycling over 0..B and a confidence threshold mixed in; afterwards the
//     sequence state (every full KV block and the SWA snapshot: rings, pending half pairs, entry
//     counts, Engram look-back, position) equals the plain decode's bit for bit. On the golden model
//     the walk (candidates, accepted lengths, bonus tokens) also matches walk.* where it overlaps.
//   - BatchOfSequencesLossless: three sequences in every speculative_step call (WideBatchLossless:
//     seven), the speculative engine with the side stream, the plain one in order on one stream;
//     BatchTokenBudgetIsRespectedAndLossless: the same under a batch token budget (MODEL_SPEC
//     3.10.9): each call verifies exactly min(budget, B x items) candidates, outputs unchanged;
//   - StateAfterEachVerifyLength: one speculative step per verify length 0..B, the state against the
//     plain decode's; SampledStepsKeepThePlainState: T > 0 steps (same seed, same tokens; the state
//     equals a plain decode of what was committed).
//   - The goldens: context features (the last forward's capture), the draft window rows of the
//     last W positions, the draft at the 8 golden anchors (candidates exact, confidences, base
//     logits, hidden and the block's KV rows within the README's tolerances, stage routers as sets), and the
//     same drafts from the CPU reference.
// Sizes: the real device runs the full lengths (past the window, top-k and candidate-pool limits
// of both configs, 200+ generated tokens); DS41_DSPARK_TEST_SMALL=1 shrinks the golden runs for the
// host emulator (scripts/cuda-host-emu/run_engine.sh) and skips the `small` preset there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "engine/dspark_decoder.h"
#include "gpu/engine/gpu_test_util.h"
#include "quant/fake_quant.h"

namespace ds41::testing {
namespace {

int32_t argmax_of(const float* z, int64_t V) {
  int32_t best = 0;
  for (int64_t i = 1; i < V; ++i)
    if (z[i] > z[best]) best = static_cast<int32_t>(i);
  return best;
}

// side: GpuLimits::side_stream (-1: the default, on).
std::unique_ptr<gpu::CudaEngine> spec_engine(const gpu::DeviceModel& m, bool spec, int64_t side = -1) {
  auto e = make_engine(m, 64, 4096, 512, 128, -1, side);
  if (e && spec) {
    Status st = e->enable_speculative();
    EXPECT_TRUE(st.ok()) << st.message();
  }
  return e;
}

// Plain greedy: prefill, then one decode step per token. Returns prompt continuation (n tokens).
std::vector<int32_t> plain_greedy(gpu::CudaEngine& e, engine::SeqId s, std::span<const int32_t> prompt, int64_t n) {
  const int64_t V = e.info().vocab_size;
  engine::StepItem it{s, prompt, true};
  engine::StepOutput so;
  Status st = e.step(std::span<const engine::StepItem>(&it, 1), &so);
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<int32_t> out{argmax_of(so.logits.data(), V)};
  while (static_cast<int64_t>(out.size()) < n) {
    engine::StepItem d{s, std::span<const int32_t>(&out.back(), 1), true};
    st = e.step(std::span<const engine::StepItem>(&d, 1), &so);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
    out.push_back(argmax_of(so.logits.data(), V));
  }
  return out;
}

struct SpecRun {
  std::vector<int32_t> tokens;  // the continuation (first = the prefill's argmax)
  std::vector<int64_t> accepted;
  std::vector<std::vector<int32_t>> step_tokens;
};

// Speculative greedy: prefill, then speculative steps (verify length cycling when `mix`) until n
// tokens; the last anchor is then run through a plain step so the state covers the same positions
// as plain_greedy's (which runs every token but the last).
SpecRun spec_greedy(gpu::CudaEngine& e, engine::SeqId s, std::span<const int32_t> prompt, int64_t n, bool mix) {
  const int64_t V = e.info().vocab_size, B = e.speculative_block();
  SpecRun r;
  engine::StepItem it{s, prompt, true};
  engine::StepOutput so;
  Status st = e.step(std::span<const engine::StepItem>(&it, 1), &so);
  EXPECT_TRUE(st.ok()) << st.message();
  r.tokens.push_back(argmax_of(so.logits.data(), V));
  for (int64_t step = 0; static_cast<int64_t>(r.tokens.size()) < n; ++step) {
    engine::SpecStepItem si;
    si.seq = s;
    si.anchor = r.tokens.back();
    if (mix) {
      si.verify_len = step % (B + 2) - 1;  // -1 (all), 0 (plain), 1 .. B
      if (step % 5 == 3) si.confidence_threshold = 0.3;
    }
    std::vector<engine::SpecStepResult> res;
    st = e.speculative_step(std::span<const engine::SpecStepItem>(&si, 1), engine::SpecBatchOptions{}, &res);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
    EXPECT_EQ(static_cast<int64_t>(res[0].tokens.size()), res[0].accepted + 1);
    r.accepted.push_back(res[0].accepted);
    r.step_tokens.push_back(res[0].tokens);
    for (int32_t t : res[0].tokens) r.tokens.push_back(t);
  }
  return r;
}

// The part of an SWA snapshot (docs/formats/kv_block.md) that byte `at` lies in.
std::string snapshot_section(const model::KvLayout& L, const model::ModelConfig& c, int64_t pos, int64_t kB,
                             size_t at) {
  size_t o = swa_snapshot_fixed_bytes(L);
  if (at < o) return "header / Engram look-back / floors / source table";
  const int64_t W = c.sliding_window, rows = std::min(pos, W);
  const size_t ring = static_cast<size_t>(L.n_layers * rows * L.window_row_bytes);
  if (at < o + ring) {
    const size_t r = (at - o) / static_cast<size_t>(L.window_row_bytes);
    return "window ring of layer " + std::to_string(r / rows) + ", position " +
           std::to_string(pos - rows + static_cast<int64_t>(r % rows));  // rows of one position
  }
  o += ring;
  for (const model::KvSourceLayout& s : L.sources) {
    const int64_t T = pos / s.ratio - (pos / kB) * kB / s.ratio;
    const size_t rows_b = static_cast<size_t>(T * (s.kv_row_bytes + s.key_row_bytes));
    if (at < o + rows_b) return "tail entries of source at layer " + std::to_string(s.layer);
    o += rows_b;
    if (s.ratio > 1) {
      const size_t flags = static_cast<size_t>(s.ratio), ab = static_cast<size_t>(s.ratio * c.head_dim * 4);
      if (at < o + flags) return "pending flags of source at layer " + std::to_string(s.layer);
      if (at < o + flags + ab)
        return "pending a of source at layer " + std::to_string(s.layer) + ", slot " +
               std::to_string((at - o - flags) / (c.head_dim * 4));
      if (at < o + flags + 2 * ab)
        return "pending b of source at layer " + std::to_string(s.layer) + ", slot " +
               std::to_string((at - o - flags - ab) / (c.head_dim * 4));
      o += flags + 2 * ab;
    }
  }
  return "beyond the layout";
}

// Every full KV block and the SWA snapshot of two sequences, bit for bit.
void expect_same_state(const gpu::DeviceModel& m, gpu::CudaEngine& a, engine::SeqId sa, gpu::CudaEngine& b,
                       engine::SeqId sb, int64_t kB) {
  auto pa = a.sequence_position(sa), pb = b.sequence_position(sb);
  ASSERT_TRUE(pa.ok() && pb.ok());
  ASSERT_EQ(*pa, *pb);
  for (int64_t i = 0; i < *pa / kB; ++i) {
    auto ba = a.export_kv_block(sa, i, kB), bb = b.export_kv_block(sb, i, kB);
    ASSERT_TRUE(ba.ok() && bb.ok());
    EXPECT_TRUE(*ba == *bb) << "KV block " << i << " differs";
  }
  auto na = a.export_swa_snapshot(sa, kB, false), nb = b.export_swa_snapshot(sb, kB, false);
  ASSERT_TRUE(na.ok() && nb.ok());
  EXPECT_EQ(na->size(), nb->size());
  std::map<std::string, int64_t> diffs;  // bytes that differ per section
  for (size_t i = 0; i < std::min(na->size(), nb->size()); ++i)
    if ((*na)[i] != (*nb)[i]) ++diffs[snapshot_section(m.kv_layout(), m.config(), *pa, kB, i)];
  for (const auto& [what, n] : diffs) ADD_FAILURE() << "SWA snapshot: " << n << " bytes differ in " << what;
}

void lossless(const std::string& dir, std::span<const int32_t> prompt, int64_t n, bool mix, int64_t kB,
              const GoldenFile* walk) {
  auto dev = load_device_model(dir);
  ASSERT_TRUE(dev);
  auto plain = spec_engine(*dev, false);
  auto spec = spec_engine(*dev, true);
  ASSERT_TRUE(plain && spec);
  ASSERT_GT(spec->speculative_block(), 0);
  auto sp = plain->create_sequence();
  auto ss = spec->create_sequence();
  ASSERT_TRUE(sp.ok() && ss.ok());
  SpecRun r = spec_greedy(*spec, *ss, prompt, n, mix);
  const std::vector<int32_t> want = plain_greedy(*plain, *sp, prompt, static_cast<int64_t>(r.tokens.size()));
  ASSERT_EQ(want.size(), r.tokens.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(want[i], r.tokens[i]) << "token " << i;
  int64_t acc = 0;
  std::vector<int64_t> hist(static_cast<size_t>(spec->speculative_block() + 1), 0);
  for (int64_t a : r.accepted) {
    acc += a;
    ++hist[static_cast<size_t>(a)];
  }
  std::cout << "lossless: " << r.tokens.size() << " tokens in " << r.accepted.size() << " speculative steps, "
            << acc << " accepted; histogram";
  for (int64_t h : hist) std::cout << " " << h;
  std::cout << "\n";
  // The plain sequence ran every token but its last; the speculative one has run every committed
  // token but the last anchor: the same positions.
  expect_same_state(*dev, *plain, *sp, *spec, *ss, kB);
  if (walk && !mix) {  // the golden walk (greedy, all B verified), where it overlaps
    auto acc_g = walk->get<int32_t>("walk.accepted");
    auto bonus_g = walk->get<int32_t>("walk.bonus");
    const size_t m = std::min(r.accepted.size(), acc_g.v.size());
    for (size_t i = 0; i < m; ++i) {
      EXPECT_EQ(r.accepted[i], acc_g.v[i]) << "walk step " << i;
      EXPECT_EQ(r.step_tokens[i].back(), bonus_g.v[i]) << "walk step " << i;
    }
    std::cout << "walk: " << m << " steps compared\n";
  }
}

std::vector<int32_t> golden_prompt(const GoldenFile& g) {
  auto ids = g.get<int32_t>("seq.input_ids");
  auto pl = g.get<int32_t>("seq.prompt_len");
  return std::vector<int32_t>(ids.v.begin(), ids.v.begin() + pl.v[0]);
}

TEST(GpuDspark, LosslessGreedyGoldenWalk) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  const std::vector<int32_t> prompt = golden_prompt(g);
  lossless(dspark_golden_dir(), prompt, emulator_sizes() ? 8 : 240, false, 16, &g);
}

TEST(GpuDspark, LosslessGreedyGoldenMixedVerifyLengths) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  const std::vector<int32_t> prompt = golden_prompt(g);
  lossless(dspark_golden_dir(), prompt, emulator_sizes() ? 10 : 240, true, 16, nullptr);
}

// One speculative step of each verify length after a short prompt (and a plain 2-token step as the
// control of the forward's own row-count invariance): the state equals the plain decode's.
TEST(GpuDspark, StateAfterEachVerifyLength) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  std::vector<int32_t> prompt = golden_prompt(g);
  prompt.resize(emulator_sizes() ? 13 : 44);
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  const int64_t B = dev->config().dspark_block_size, V = dev->config().vocab_size;
  const std::vector<int64_t> lens = emulator_sizes() ? std::vector<int64_t>{5} : std::vector<int64_t>{0, 1, 2, 3, 4, 5};
  for (int64_t vl : lens) {
    auto plain = spec_engine(*dev, false);
    auto spec = spec_engine(*dev, true);
    auto sp = plain->create_sequence();
    auto ss = spec->create_sequence();
    ASSERT_TRUE(sp.ok() && ss.ok());
    engine::StepItem it{*ss, prompt, true};
    engine::StepOutput so;
    ASSERT_TRUE(spec->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    engine::SpecStepItem si;
    si.seq = *ss;
    si.anchor = argmax_of(so.logits.data(), V);
    si.verify_len = vl;
    std::vector<engine::SpecStepResult> res;
    ASSERT_TRUE(spec->speculative_step(std::span<const engine::SpecStepItem>(&si, 1),
                                       engine::SpecBatchOptions{}, &res)
                    .ok());
    std::cout << "verify_len " << vl << ": accepted " << res[0].accepted << " of " << res[0].verified << "\n";
    // Plain: the prompt, then the anchor and the accepted candidates one token at a time.
    engine::StepItem pi{*sp, prompt, true};
    ASSERT_TRUE(plain->step(std::span<const engine::StepItem>(&pi, 1), &so).ok());
    std::vector<int32_t> run{si.anchor};
    run.insert(run.end(), res[0].tokens.begin(), res[0].tokens.end() - 1);
    for (size_t i = 0; i < run.size(); ++i) {
      engine::StepItem d{*sp, std::span<const int32_t>(&run[i], 1), true};
      ASSERT_TRUE(plain->step(std::span<const engine::StepItem>(&d, 1), &so).ok());
      if (i + 1 < run.size()) EXPECT_EQ(argmax_of(so.logits.data(), V), run[i + 1]);
    }
    EXPECT_EQ(argmax_of(so.logits.data(), V), res[0].tokens.back()) << "bonus token";
    expect_same_state(*dev, *plain, *sp, *spec, *ss, 16);
    if (vl == B && emulator_sizes()) {  // control: the same tokens as one plain step
      auto ctl = spec_engine(*dev, false);
      auto sc = ctl->create_sequence();
      std::vector<int32_t> all = prompt;
      engine::StepItem ci{*sc, all, true};
      ASSERT_TRUE(ctl->step(std::span<const engine::StepItem>(&ci, 1), &so).ok());
      engine::StepItem c2{*sc, run, true};
      ASSERT_TRUE(ctl->step(std::span<const engine::StepItem>(&c2, 1), &so).ok());
      std::cout << "control (the committed tokens as one " << run.size() << "-row plain step):\n";
      expect_same_state(*dev, *plain, *sp, *ctl, *sc, 16);
    }
  }
}

// Sampled speculative steps (T > 0: the draft sampled on the host from z_k / T, rejection sampling
// against the target, engine/speculative.h): whatever is committed, the state equals a plain
// decode of the committed tokens, and the same seed gives the same tokens on a second engine.
TEST(GpuDspark, SampledStepsKeepThePlainState) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  std::vector<int32_t> prompt = golden_prompt(g);
  if (emulator_sizes()) prompt.resize(11);
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  const int64_t V = dev->config().vocab_size, steps = emulator_sizes() ? 1 : 40;
  std::vector<int32_t> runs[2];
  for (int rep = 0; rep < 2; ++rep) {
    auto spec = spec_engine(*dev, true);
    auto ss = spec->create_sequence();
    ASSERT_TRUE(ss.ok());
    engine::StepItem it{*ss, prompt, true};
    engine::StepOutput so;
    ASSERT_TRUE(spec->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    std::vector<int32_t>& got = runs[rep];
    got.push_back(argmax_of(so.logits.data(), V));
    for (int64_t t = 0; t < steps; ++t) {
      engine::SpecStepItem si;
      si.seq = *ss;
      si.anchor = got.back();
      si.temperature = 0.8;
      si.seed = 1234;
      std::vector<engine::SpecStepResult> res;
      Status st = spec->speculative_step(std::span<const engine::SpecStepItem>(&si, 1),
                                         engine::SpecBatchOptions{}, &res);
      ASSERT_TRUE(st.ok()) << st.message();
      for (int32_t x : res[0].tokens) {
        EXPECT_GE(x, 0);
        EXPECT_LT(x, V);
        got.push_back(x);
      }
    }
    if (rep == 1) {
      EXPECT_EQ(runs[0], runs[1]) << "same seed, same tokens";
      auto plain = spec_engine(*dev, false);
      auto sp = plain->create_sequence();
      ASSERT_TRUE(sp.ok());
      engine::StepItem pi{*sp, prompt, false};
      ASSERT_TRUE(plain->step(std::span<const engine::StepItem>(&pi, 1), &so).ok());
      for (size_t i = 0; i + 1 < got.size(); ++i) {  // the last token is the next anchor
        engine::StepItem d{*sp, std::span<const int32_t>(&got[i], 1), false};
        ASSERT_TRUE(plain->step(std::span<const engine::StepItem>(&d, 1), &so).ok());
      }
      expect_same_state(*dev, *plain, *sp, *spec, *ss, 16);
    }
  }
}

// Three sequences (different prompt lengths, so different ring slots, pending halves and verify
// outcomes) in every speculative_step call: tokens and states equal per-sequence plain decodes.
// budget < 0: verify lengths mixed per item (2 or the whole block); budget >= 0 (MODEL_SPEC 3.10.9,
// SpecBatchOptions::verify_budget): every item asks for the whole block and each call verifies
// exactly min(budget, B x items) candidates, verified + budget_cut = B per item, and the budget cuts.
void batch_lossless(int64_t budget, std::vector<size_t> lens = {}) {
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  const std::vector<int32_t> full = golden_prompt(g);
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  const int64_t V = dev->config().vocab_size, n = emulator_sizes() ? 2 : 120;
  if (lens.empty()) lens = emulator_sizes() ? std::vector<size_t>{9, 12} : std::vector<size_t>{44, 31, 20};
  for (size_t& l : lens) l = std::min(l, full.size());
  // The plain engine enqueues every layer in order on one stream, the speculative one runs its
  // decode steps, verifications and drafts with the side stream: the tokens and the packed states
  // must still agree bit for bit.
  auto spec = spec_engine(*dev, true, 1);
  auto plain = spec_engine(*dev, false, 0);
  const int64_t B = spec->speculative_block();
  const size_t ns = lens.size();
  std::vector<engine::SeqId> ss(ns), sp(ns);
  std::vector<std::vector<int32_t>> got(ns), want(ns);
  for (size_t i = 0; i < ns; ++i) {
    ss[i] = *spec->create_sequence();
    sp[i] = *plain->create_sequence();
    const std::span<const int32_t> prompt(full.data(), lens[i]);
    engine::StepItem it{ss[i], prompt, true};
    engine::StepOutput so;
    ASSERT_TRUE(spec->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    got[i].push_back(argmax_of(so.logits.data(), V));
    want[i] = plain_greedy(*plain, sp[i], prompt, 1);
  }
  int64_t cut_calls = 0;
  for (int64_t step = 0;; ++step) {
    std::vector<engine::SpecStepItem> items;
    std::vector<size_t> which;
    for (size_t i = 0; i < ns; ++i)
      if (static_cast<int64_t>(got[i].size()) < n) {
        engine::SpecStepItem si;
        si.seq = ss[i];
        si.anchor = got[i].back();
        if (budget < 0) si.verify_len = (step + static_cast<int64_t>(i)) % 3 == 2 ? 2 : -1;
        items.push_back(si);
        which.push_back(i);
      }
    if (items.empty()) break;
    std::vector<engine::SpecStepResult> res;
    Status st = spec->speculative_step(items, engine::SpecBatchOptions{budget}, &res);
    ASSERT_TRUE(st.ok()) << st.message();
    int64_t verified = 0, cut = 0;
    for (size_t k = 0; k < which.size(); ++k) {
      verified += res[k].verified;
      cut += res[k].budget_cut;
      if (budget >= 0) EXPECT_EQ(res[k].verified + res[k].budget_cut, B) << "call " << step << " item " << k;
      for (int32_t t : res[k].tokens) got[which[k]].push_back(t);
    }
    if (budget >= 0)
      EXPECT_EQ(verified, std::min<int64_t>(budget, B * static_cast<int64_t>(items.size())))
          << "call " << step;
    else
      EXPECT_EQ(cut, 0);
    cut_calls += cut > 0;
  }
  if (budget >= 0) EXPECT_GT(cut_calls, 0) << "the budget should cut";
  for (size_t i = 0; i < ns; ++i) {
    // Plain: continue one token at a time to the same length (the last token is not run).
    while (want[i].size() < got[i].size()) {
      engine::StepItem d{sp[i], std::span<const int32_t>(&want[i].back(), 1), true};
      engine::StepOutput so;
      ASSERT_TRUE(plain->step(std::span<const engine::StepItem>(&d, 1), &so).ok());
      want[i].push_back(argmax_of(so.logits.data(), V));
    }
    EXPECT_EQ(want[i], got[i]) << "sequence " << i;
    expect_same_state(*dev, *plain, sp[i], *spec, ss[i], 16);
  }
}

TEST(GpuDspark, BatchOfSequencesLossless) {
  DS41_SKIP_WITHOUT_GPU();
  batch_lossless(-1);
}

// Seven sequences: a verification of up to 42 rows (past the 16 rows of the decode kernels' first
// launches and the 32 from which the indexer takes the tensor cores, several sequences per 16-row
// tile) must still give every row a one-row decode step's bits (row-invariant forwards).
TEST(GpuDspark, WideBatchLossless) {
  DS41_SKIP_WITHOUT_GPU();
  if (emulator_sizes()) GTEST_SKIP() << "seven sequences are too slow for the host emulator";
  batch_lossless(-1, {44, 31, 20, 38, 27, 50, 13});
}

// MODEL_SPEC 3.10.9 on the GPU engine: a budget below one block per sequence (3 sequences x 5
// candidates > 6; on the emulator 2 x 5 > 3).
TEST(GpuDspark, BatchTokenBudgetIsRespectedAndLossless) {
  DS41_SKIP_WITHOUT_GPU();
  batch_lossless(emulator_sizes() ? 3 : 6);
}

TEST(GpuDspark, LosslessGreedySmallPreset) {
  DS41_SKIP_WITHOUT_GPU();
  if (emulator_sizes()) GTEST_SKIP() << "the small preset is too slow for the host emulator";
  const std::string dir = small_model_dir();
  const std::vector<int32_t> prompt = seeded_tokens(300, 129280, 17);  // window 32, top-k 64, pool 128
  lossless(dir, prompt, 200, true, 128, nullptr);
}

// The context path and the draft against the goldens and the CPU reference.
TEST(GpuDspark, GoldenContextDraftAndCpu) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  auto e = spec_engine(*dev, true);
  ASSERT_TRUE(e);
  const model::ModelConfig& c = dev->config();
  const int64_t W = c.sliding_window, hd = c.head_dim, H = c.hidden_size, V = c.vocab_size;
  const int64_t B = c.dspark_block_size;
  auto ids = g.get<int32_t>("seq.input_ids");
  auto apos = g.get<int32_t>("draft.anchor_pos");
  auto atok = g.get<int32_t>("draft.anchor_token");
  auto cand = g.get<int32_t>("draft.candidates");
  auto conf = g.get<float>("draft.confidence");
  auto confl = g.get<float>("draft.confidence_logits");
  auto base = g.get<float>("draft.base_logits");
  auto hidden = g.get<float>("draft.hidden");
  auto feats = g.get<float>("context.features");
  const int64_t F = feats.row_size();
  std::vector<int64_t> anchors(apos.v.begin(), apos.v.end());
  int64_t n_anchors = static_cast<int64_t>(anchors.size());
  if (emulator_sizes()) n_anchors = std::min<int64_t>(n_anchors, 5);

  // CPU reference drafts at the same anchors (the oracle of the GPU draft).
  TestModel cpu = load_cpu_model(dspark_golden_dir(), 4);
  ASSERT_TRUE(cpu.model);
  auto dec = engine::DsparkDecoder::create(cpu.model.get());
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  auto cst = cpu.model->new_sequence();

  auto s = e->create_sequence();
  ASSERT_TRUE(s.ok());
  int64_t at = 0;
  int64_t flips = 0, rows = 0;
  for (int64_t a = 0; a < n_anchors; ++a) {
    const int64_t L = anchors[a];
    ASSERT_GE(L, at);
    if (L > at) {
      const std::span<const int32_t> chunk(ids.v.data() + at, static_cast<size_t>(L - at));
      engine::StepItem it{*s, chunk, false};
      engine::StepOutput so;
      ASSERT_TRUE(e->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
      // Context features of this chunk (the last forward's rows) against context.features.
      std::vector<float> f;
      ASSERT_TRUE(e->last_features(0, L - at, &f).ok());
      for (int64_t r = 0; r < L - at; ++r)
        EXPECT_LE(row_error(&feats.v[(at + r) * F], &f[r * F], F), 1e-3) << "context.features row " << at + r;
      auto cp = dec->prefill(*cst, chunk);
      ASSERT_TRUE(cp.ok()) << cp.status().message();
      at = L;
    }
    // Draft window rows of the last min(W, L) positions against stage{s}.window_kv.
    for (int64_t st = 0; st < static_cast<int64_t>(dev->weights().dspark->stages.size()); ++st) {
      auto wk = g.get<float>("stage" + std::to_string(st) + ".window_kv");
      const int64_t first = std::max<int64_t>(0, L - W);
      std::vector<uint8_t> packed;
      ASSERT_TRUE(e->draft_window_rows(*s, st, first, L - first, &packed).ok());
      const int64_t rb = static_cast<int64_t>(packed.size()) / std::max<int64_t>(1, L - first);
      std::vector<float> row(hd);
      for (int64_t p = first; p < L; ++p) {
        quant::q_win_decode(&packed[(p - first) * rb], hd, row.data());
        const double er = row_error(&wk.v[p * hd], row.data(), hd);
        EXPECT_LE(er, 0.5) << "stage" << st << ".window_kv row " << p;
        flips += er > 2e-3;
        ++rows;
      }
    }
    ASSERT_EQ(atok.v[a], ids.v[L]);
    auto d = e->draft(*s, atok.v[a], true);
    ASSERT_TRUE(d.ok()) << d.status().message();
    for (int64_t k = 0; k < B; ++k) {
      EXPECT_EQ(d->candidates[k], cand.v[a * B + k]) << "anchor " << L << " k " << k;
      EXPECT_NEAR(d->confidence[k], conf.v[a * B + k], 2e-3) << "anchor " << L << " k " << k;
      EXPECT_NEAR(d->confidence_logits[k], confl.v[a * B + k], 1e-2) << "anchor " << L << " k " << k;
      EXPECT_LE(row_error(&base.v[(a * B + k) * V], &d->base_logits[k * V], V), 5e-3) << "anchor " << L;
      EXPECT_LE(row_error(&hidden.v[(a * B + k) * H], &d->hidden[k * H], H), 1e-3) << "anchor " << L;
    }
    // The block's KV rows per stage (Q_win values: a row over 2e-3 is a rounding flip) and the
    // stage routers (sets).
    for (int64_t st = 0; st < static_cast<int64_t>(d->block_kv.size()); ++st) {
      auto bk = g.get<float>("draft.stage" + std::to_string(st) + ".block_kv");
      auto re = g.get<int32_t>("draft.stage" + std::to_string(st) + ".router_experts");
      const int64_t kd = c.dspark_num_experts_per_tok;
      for (int64_t k = 0; k < B; ++k) {
        const double er = row_error(&bk.v[(a * B + k) * hd], &d->block_kv[st][k * hd], hd);
        EXPECT_LE(er, 0.5) << "draft.stage" << st << ".block_kv anchor " << L << " k " << k;
        flips += er > 2e-3;
        ++rows;
        EXPECT_EQ(id_set(&re.v[(a * B + k) * kd], kd), id_set(&d->router_experts[st][k * kd], kd))
            << "draft.stage" << st << ".router_experts anchor " << L << " k " << k;
      }
    }
    // GPU vs CPU engine draft.
    model::DraftInput in{cst.get(), atok.v[a], L};
    std::vector<model::DraftOutput> cd;
    ASSERT_TRUE(dec->dspark().draft(std::span<const model::DraftInput>(&in, 1), model::DraftOptions{}, &cd).ok());
    for (int64_t k = 0; k < B; ++k) {
      EXPECT_EQ(d->candidates[k], cd[0].candidates[k]) << "GPU vs CPU anchor " << L << " k " << k;
      EXPECT_NEAR(d->confidence[k], cd[0].confidence[k], 2e-3) << "GPU vs CPU anchor " << L << " k " << k;
    }
  }
  std::cout << "window and block rows: " << rows << " compared, " << flips << " rounding flips\n";
  EXPECT_LE(flips, std::max<int64_t>(1, rows / 20));
}

}  // namespace
}  // namespace ds41::testing
