// DSpark speculative decoding on the CPU reference (issue 17, MODEL_SPEC 3.10.6-3.10.9), on the
// public DSpark golden model (tiny: window 8, top-k 8, ratio-2 pairs, candidate pool 6 x 2):
//   - lossless greedy: DSpark generation equals plain greedy generation token for token over
//     500 tokens, for prompts past every limit, with every verify policy (all 5, confidence
//     threshold, fixed lengths), and the final packed state (target rings, compressed / indexer
//     rows, half pair, Engram, position, draft rings) equals the plain decode's bit for bit;
//   - sampled mode: speculative rejection sampling reproduces the target distribution (chi-square
//     on a 6-token vocabulary with the pure rule, and on the tiny model's first committed token);
//   - confidence scheduling picks prefixes; under a batch token budget (CpuEngine and the engine
//     loop, SpecBatchOptions / LoopConfig::speculative_token_budget) no step verifies more than the
//     budget, the budget cuts, and greedy outputs are unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "core/clock.h"
#include "engine/cpu_engine.h"
#include "engine/dspark_decoder.h"
#include "engine/engine_loop.h"
#include "engine/forwarding_engine.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "golden/golden_arrays.h"
#include "kvcache/metrics.h"
#include "support/chi_square.h"
#include "support/state_compare.h"

namespace ds41::testing {
namespace {

class DsparkSpec : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tm_ = new TestModel(load_golden_model(2, dspark_golden_dir()));
    gold_ = new GoldenFile(dspark_golden_dir() + "/goldens.safetensors");
  }
  static void TearDownTestSuite() {
    delete tm_;
    delete gold_;
  }
  static std::vector<int32_t> golden_prompt() {
    auto ids = gold_->get<int32_t>("seq.input_ids").v;
    ids.resize(gold_->get<int32_t>("seq.prompt_len").v.at(0));
    return ids;
  }
  static std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(3, 2045);
    std::vector<int32_t> v{0};
    while (static_cast<int64_t>(v.size()) < n) v.push_back(d(rng));
    return v;
  }
  // Plain greedy: prefill, then one decode step per token. Returns the generated tokens.
  static std::vector<int32_t> plain_greedy(std::span<const int32_t> prompt, int64_t n,
                                           std::unique_ptr<model::SequenceState>* st_out) {
    model::Model& m = *tm_->model;
    auto st = m.new_sequence();
    model::ForwardOptions opt;
    auto o = m.prefill(*st, prompt, 0, opt);
    EXPECT_TRUE(o.ok());
    std::vector<int32_t> gen{engine::argmax_token(o->logits)};
    while (static_cast<int64_t>(gen.size()) < n) {
      auto d = m.decode_step(*st, gen.back(), opt);
      EXPECT_TRUE(d.ok());
      gen.push_back(engine::argmax_token(d->logits));
    }
    *st_out = std::move(st);
    return gen;
  }
  static TestModel* tm_;
  static GoldenFile* gold_;
};
TestModel* DsparkSpec::tm_ = nullptr;
GoldenFile* DsparkSpec::gold_ = nullptr;

struct SpecRun {
  std::vector<int32_t> tokens;
  engine::AcceptanceStats stats;
};

SpecRun spec_greedy(model::Model& m, std::span<const int32_t> prompt, int64_t n,
                    const engine::SpecStepOptions& so, std::unique_ptr<model::SequenceState>* st_out) {
  SpecRun r;
  auto dec = engine::DsparkDecoder::create(&m);
  EXPECT_TRUE(dec.ok()) << dec.status().message();
  auto st = m.new_sequence();
  auto last = dec->prefill(*st, prompt);
  EXPECT_TRUE(last.ok()) << last.status().message();
  r.tokens.push_back(engine::argmax_token(*last));
  while (static_cast<int64_t>(r.tokens.size()) < n) {
    auto s = dec->step(*st, r.tokens.back(), so);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) break;
    r.stats.add(s->accepted, m.config().dspark_block_size);
    r.tokens.insert(r.tokens.end(), s->tokens.begin(), s->tokens.end());
  }
  *st_out = std::move(st);
  return r;
}

TEST_F(DsparkSpec, LosslessGreedyAndStateEqualsPlainDecode) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t N = 500;
  struct Policy {
    const char* name;
    engine::SpecStepOptions o;
  };
  std::vector<Policy> policies(4);
  policies[0].name = "verify all 5";
  policies[1].name = "confidence threshold 0.3";
  policies[1].o.confidence_threshold = 0.3;
  policies[2].name = "verify 2";
  policies[2].o.verify_len = 2;
  policies[3].name = "verify 0 (plain steps through the driver)";
  policies[3].o.verify_len = 0;
  for (const auto& [pname, prompt] : std::vector<std::pair<std::string, std::vector<int32_t>>>{
           {"golden prompt", golden_prompt()}, {"random prompt 150", random_prompt(150, 5)}}) {
    std::unique_ptr<model::SequenceState> pst;
    const std::vector<int32_t> ref_all = plain_greedy(prompt, N, &pst);
    for (const Policy& p : policies) {
      // The full 500 tokens with every candidate verified; the other policies on a shorter run
      // (CI time: each run is ~500 draft + verification steps).
      const bool full = p.o.verify_len < 0 && p.o.confidence_threshold < 0;
      if (!full && pname != "golden prompt") continue;
      const int64_t n = full ? N : 150;
      const std::vector<int32_t> ref(ref_all.begin(), ref_all.begin() + n);
      SCOPED_TRACE(pname + ", " + p.name);
      std::unique_ptr<model::SequenceState> sst;
      SpecRun r = spec_greedy(m, prompt, n, p.o, &sst);
      ASSERT_GE(r.tokens.size(), ref.size());
      // Tokens beyond n come from the last step's block; compare the first n.
      r.tokens.resize(n);
      EXPECT_EQ(r.tokens, ref);
      std::string hist;
      for (int64_t c : r.stats.counts) hist += std::to_string(c) + " ";
      std::printf("[ dspark ] %s, %s: %lld steps, accepted histogram [ %s], mean accepted %.3f\n",
                  pname.c_str(), p.name, static_cast<long long>(r.stats.steps), hist.c_str(),
                  r.stats.mean_accepted());
      if (pname == "golden prompt" && p.o.verify_len != 0) {
        int64_t accepted_steps = r.stats.steps - r.stats.counts[0];
        EXPECT_GT(accepted_steps, 3) << "the planted bigrams should be accepted sometimes";
      }
      // The state of a plain (one-shot, exact) prefill of the committed tokens, draft rings included.
      // (the last committed token, the bonus, is not run yet: the state holds positions < pos).
      const int64_t pos = sst->position();
      std::vector<int32_t> seq = prompt;
      seq.insert(seq.end(), ref.begin(), ref.end());
      ASSERT_LE(pos, static_cast<int64_t>(seq.size()));
      auto st = m.new_sequence();
      engine::DsparkDecoder dec = *engine::DsparkDecoder::create(&m);
      ASSERT_TRUE(dec.prefill(*st, std::span<const int32_t>(seq).subspan(0, pos), 0).ok());
      expect_same_state(*st, *sst, "state after generation");
    }
  }
}

// The Engine interface: CpuEngine with speculative decoding gives the plain engine's greedy tokens,
// with two sequences stepped together (prefill chunks through step(), drafts through
// speculative_step()).
TEST_F(DsparkSpec, CpuEngineSpeculativeStepIsLossless) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t N = 120;
  const std::vector<std::vector<int32_t>> prompts = {golden_prompt(), random_prompt(70, 9)};
  std::vector<std::vector<int32_t>> ref;
  for (const auto& p : prompts) {
    std::unique_ptr<model::SequenceState> unused;
    ref.push_back(plain_greedy(p, N, &unused));
  }
  engine::CpuEngine eng(&m, "tiny");
  ASSERT_TRUE(eng.enable_speculative().ok());
  ASSERT_EQ(eng.speculative_block(), 5);
  std::vector<engine::SeqId> ids;
  std::vector<std::vector<int32_t>> gen(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(*eng.create_sequence());
    // Prefill in two chunks.
    const size_t h = prompts[i].size() / 2;
    engine::StepOutput o;
    std::vector<engine::StepItem> it = {{ids[i], std::span<const int32_t>(prompts[i]).subspan(0, h), false}};
    ASSERT_TRUE(eng.step(it, &o).ok());
    it = {{ids[i], std::span<const int32_t>(prompts[i]).subspan(h), true}};
    ASSERT_TRUE(eng.step(it, &o).ok());
    gen[i].push_back(engine::argmax_token(o.logits));
  }
  while (gen[0].size() < static_cast<size_t>(N) || gen[1].size() < static_cast<size_t>(N)) {
    std::vector<engine::SpecStepItem> items;
    for (size_t i = 0; i < prompts.size(); ++i) items.push_back({ids[i], gen[i].back()});
    std::vector<engine::SpecStepResult> res;
    ASSERT_TRUE(eng.speculative_step(items, engine::SpecBatchOptions{}, &res).ok());
    for (size_t i = 0; i < prompts.size(); ++i)
      gen[i].insert(gen[i].end(), res[i].tokens.begin(), res[i].tokens.end());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    gen[i].resize(N);
    EXPECT_EQ(gen[i], ref[i]) << "prompt " << i;
  }
}

// MODEL_SPEC 3.10.9 under a batch token budget, through the Engine interface: three sequences per
// speculative_step with a budget of 6 candidates (< 3 x 5): every call verifies exactly
// min(budget, sum of the caps) candidates, each item's verified + budget_cut is its block, the
// budget actually cuts, and the greedy tokens are still the plain engine's.
TEST_F(DsparkSpec, CpuEngineBatchBudgetCutsLengthsLosslessly) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t N = 60, budget = 6;
  const std::vector<std::vector<int32_t>> prompts = {golden_prompt(), random_prompt(70, 9),
                                                     random_prompt(50, 13)};
  engine::CpuEngine eng(&m, "tiny");
  ASSERT_TRUE(eng.enable_speculative().ok());
  const int64_t B = eng.speculative_block();
  ASSERT_EQ(B, 5);
  ASSERT_LT(budget, B * static_cast<int64_t>(prompts.size()));
  std::vector<engine::SeqId> ids;
  std::vector<std::vector<int32_t>> gen(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(*eng.create_sequence());
    engine::StepOutput o;
    std::vector<engine::StepItem> it = {{ids[i], prompts[i], true}};
    ASSERT_TRUE(eng.step(it, &o).ok());
    gen[i].push_back(engine::argmax_token(o.logits));
  }
  int64_t steps = 0, cut_steps = 0, uneven_steps = 0;
  for (;;) {
    std::vector<engine::SpecStepItem> items;
    std::vector<size_t> which;
    for (size_t i = 0; i < prompts.size(); ++i)
      if (static_cast<int64_t>(gen[i].size()) < N) {
        items.push_back({ids[i], gen[i].back()});
        which.push_back(i);
      }
    if (items.empty()) break;
    std::vector<engine::SpecStepResult> res;
    Status st = eng.speculative_step(items, engine::SpecBatchOptions{budget}, &res);
    ASSERT_TRUE(st.ok()) << st.message();
    int64_t verified = 0, cut = 0;
    std::set<int64_t> lens;
    for (size_t k = 0; k < items.size(); ++k) {
      EXPECT_EQ(res[k].verified + res[k].budget_cut, B) << "step " << steps << " item " << k;
      EXPECT_LE(res[k].accepted, res[k].verified);
      verified += res[k].verified;
      cut += res[k].budget_cut;
      lens.insert(res[k].verified);
      gen[which[k]].insert(gen[which[k]].end(), res[k].tokens.begin(), res[k].tokens.end());
    }
    EXPECT_EQ(verified, std::min<int64_t>(budget, B * static_cast<int64_t>(items.size())))
        << "step " << steps;
    cut_steps += cut > 0;
    uneven_steps += lens.size() > 1;
    ++steps;
  }
  std::printf("[ dspark ] budget %lld: %lld steps, %lld cut by the budget, %lld with unequal lengths\n",
              static_cast<long long>(budget), static_cast<long long>(steps),
              static_cast<long long>(cut_steps), static_cast<long long>(uneven_steps));
  EXPECT_GT(cut_steps, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::unique_ptr<model::SequenceState> unused;
    gen[i].resize(N);
    EXPECT_EQ(gen[i], plain_greedy(prompts[i], N, &unused)) << "prompt " << i;
  }
}

// An Engine that forwards to a CpuEngine and records, per speculative_step call, the candidates
// verified and the budget the loop passed.
class RecordingEngine : public engine::ForwardingEngine {
 public:
  explicit RecordingEngine(engine::Engine* inner) : engine::ForwardingEngine(inner) {}
  Status speculative_step(std::span<const engine::SpecStepItem> items, const engine::SpecBatchOptions& batch,
                          std::vector<engine::SpecStepResult>* out) override {
    Status st = inner()->speculative_step(items, batch, out);
    if (st.ok()) {
      Call c{static_cast<int64_t>(items.size()), batch.verify_budget, 0, 0};
      for (const auto& r : *out) {
        c.verified += r.verified;
        c.cut += r.budget_cut;
      }
      calls.push_back(c);
    }
    return st;
  }
  struct Call {
    int64_t items, budget, verified, cut;
  };
  std::vector<Call> calls;  // written by the loop thread; read after stop()
};

// The serving path: the engine loop passes LoopConfig::speculative_token_budget to every
// speculative_step; three greedy requests decode together under a budget of 4 candidates per
// step: no step verifies more, the budget cuts, /metrics' counters add up, and every request gets
// the plain greedy tokens.
TEST_F(DsparkSpec, EngineLoopTokenBudgetIsRespectedAndLossless) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const std::vector<std::vector<int32_t>> prompts = {golden_prompt(), random_prompt(60, 3),
                                                     random_prompt(40, 8)};
  const int64_t N = 40, budget = 4;
  engine::CpuEngine cpu(&m, "tiny");
  RecordingEngine eng(&cpu);
  ASSERT_TRUE(eng.enable_speculative().ok());
  engine::LoopConfig cfg;
  cfg.max_batch_tokens = 256;
  cfg.max_running = 4;
  cfg.speculative = true;
  cfg.speculative_token_budget = budget;
  engine::EngineLoop loop(&eng, cfg);
  ASSERT_TRUE(loop.start().ok());
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) {
    engine::GenerationRequest r;
    r.prompt = p;
    r.max_tokens = N;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    streams.push_back(*loop.submit(r));
  }
  for (size_t k = 0; k < streams.size(); ++k) {
    std::vector<engine::TokenEvent> evs;
    while (streams[k]->next(&evs, std::chrono::milliseconds(60000))) {
    }
    std::vector<int32_t> toks;
    for (const auto& e : evs)
      if (e.token >= 0) toks.push_back(e.token);
    std::unique_ptr<model::SequenceState> unused;
    EXPECT_EQ(toks, plain_greedy(prompts[k], N, &unused)) << "prompt " << k;
  }
  const engine::LoopStats st = loop.stats();
  loop.stop(std::chrono::milliseconds(1000));
  ASSERT_FALSE(eng.calls.empty());
  int64_t verified = 0, cut = 0, multi = 0;
  for (const auto& c : eng.calls) {
    EXPECT_EQ(c.budget, budget);
    EXPECT_LE(c.verified, budget) << "a step verified more candidates than the budget";
    verified += c.verified;
    cut += c.cut;
    multi += c.items > 1;
  }
  std::printf(
      "[ dspark ] loop budget %lld: %zu speculative calls (%lld with several sequences), %lld verified, "
      "%lld cut\n",
      static_cast<long long>(budget), eng.calls.size(), static_cast<long long>(multi),
      static_cast<long long>(verified), static_cast<long long>(cut));
  EXPECT_GT(multi, 0) << "the requests should decode together";
  EXPECT_GT(cut, 0) << "the budget should cut some blocks";
  EXPECT_EQ(st.spec_verified, verified);
  EXPECT_EQ(st.spec_budget_cut, cut);
}

// The engine loop with speculative decoding on: greedy requests (batched with a sampled one, which
// decodes plainly) get the plain greedy tokens; the acceptance histogram is counted.
TEST_F(DsparkSpec, EngineLoopSpeculativeGreedyIsLossless) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const std::vector<std::vector<int32_t>> prompts = {golden_prompt(), random_prompt(60, 3)};
  const int64_t N = 40;
  engine::CpuEngine eng(&m, "tiny");
  ASSERT_TRUE(eng.enable_speculative().ok());
  engine::LoopConfig cfg;
  cfg.max_batch_tokens = 32;
  cfg.max_running = 4;
  cfg.speculative = true;
  engine::EngineLoop loop(&eng, cfg);
  ASSERT_TRUE(loop.start().ok());
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const auto& p : prompts) {
    engine::GenerationRequest r;
    r.prompt = p;
    r.max_tokens = N;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    streams.push_back(*loop.submit(r));
  }
  engine::GenerationRequest sampled;
  sampled.prompt = random_prompt(30, 4);
  sampled.max_tokens = 10;
  sampled.ignore_eos = true;
  sampled.sampling.temperature = 0.7;
  sampled.sampling.seed = 5;
  streams.push_back(*loop.submit(sampled));
  for (size_t k = 0; k < streams.size(); ++k) {
    std::vector<engine::TokenEvent> evs;
    while (streams[k]->next(&evs, std::chrono::milliseconds(60000))) {
    }
    std::vector<int32_t> toks;
    for (const auto& e : evs)
      if (e.token >= 0) toks.push_back(e.token);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.back().finish, engine::FinishReason::kLength);
    if (k < prompts.size()) {
      std::unique_ptr<model::SequenceState> unused;
      EXPECT_EQ(toks, plain_greedy(prompts[k], N, &unused)) << "prompt " << k;
    } else {
      EXPECT_EQ(toks.size(), 10u);
    }
  }
  const engine::LoopStats st = loop.stats();
  loop.stop(std::chrono::milliseconds(1000));
  EXPECT_GT(st.spec_steps, 10);
  int64_t sum = 0;
  for (int64_t c : st.spec_accepted) sum += c;
  EXPECT_EQ(sum, st.spec_steps);
}

// Speculative decoding with the prefix cache (issue 13 x issue 17): a restored sequence's draft
// restarts with no context rows (SWA snapshots carry none) and a decoder-replay prefill leaves
// none either; the outputs stay those of the same loop without speculation. Turn 2 extends turn 1
// (prompt + answer + new tokens, past the window and the 128-token blocks): restored exactly from
// turn 1's end-of-output snapshot, then decoded speculatively.
TEST_F(DsparkSpec, EngineLoopSpeculativeWithThePrefixCacheIsLossless) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t N = 30;
  struct Turn {
    std::vector<int32_t> tokens;
    engine::TokenEvent last;
  };
  // One loop per call (fresh engine, the given cache), one request.
  auto run = [&](engine::CpuEngine& eng, engine::PrefixCache* pc, bool spec, bool decoder_replay,
                 std::vector<int32_t> prompt, engine::LoopStats* st) {
    engine::LoopConfig cfg;
    cfg.max_batch_tokens = 64;
    cfg.max_running = 4;
    cfg.speculative = spec;
    cfg.prefix_cache = pc;
    cfg.decoder_replay_prefill = decoder_replay;
    engine::EngineLoop loop(&eng, cfg);
    EXPECT_TRUE(loop.start().ok());
    engine::GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = N;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    auto s = loop.submit(r);
    EXPECT_TRUE(s.ok());
    Turn t;
    std::vector<engine::TokenEvent> evs;
    while ((*s)->next(&evs, std::chrono::milliseconds(60000))) {
    }
    for (const auto& e : evs) {
      if (e.token >= 0) t.tokens.push_back(e.token);
      if (e.finish != engine::FinishReason::kNone) t.last = e;
    }
    *st = loop.stats();
    loop.stop(std::chrono::milliseconds(1000));
    return t;
  };
  auto make_cache = [](FakeClock& clock, kvcache::MetricsRegistry& reg, bool decoder_replay) {
    engine::PrefixCacheConfig c;
    c.model_identity = "dspark-golden-test";
    c.dram_swa.capacity_bytes = 64ull << 20;
    c.decoder_replay_prefill = decoder_replay;
    auto pc = engine::PrefixCache::create(c, clock, reg);
    EXPECT_TRUE(pc.ok()) << pc.status().message();
    return std::move(*pc);
  };
  const std::vector<int32_t> p1 = random_prompt(200, 21);
  for (const bool decoder_replay : {false, true}) {
    SCOPED_TRACE(decoder_replay ? "decoder-replay prefill" : "exact prefill");
    // The same two turns with and without speculation, each against its own cache.
    std::vector<Turn> turns[2];
    engine::LoopStats spec_turn2{};
    for (const bool spec : {false, true}) {
      FakeClock clock;
      kvcache::MetricsRegistry reg;
      auto pc = make_cache(clock, reg, decoder_replay);
      engine::CpuEngine eng(&m, "tiny");
      if (spec) ASSERT_TRUE(eng.enable_speculative().ok());
      engine::LoopStats st;
      const Turn t1 = run(eng, pc.get(), spec, decoder_replay, p1, &st);
      std::vector<int32_t> p2 = p1;
      p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
      const std::vector<int32_t> extra = random_prompt(40, 22);
      p2.insert(p2.end(), extra.begin() + 1, extra.end());
      const Turn t2 = run(eng, pc.get(), spec, decoder_replay, p2, &st);
      EXPECT_EQ(t2.last.cached_tokens, 200 + N - 1) << "turn 2 restores turn 1's end-of-output snapshot";
      EXPECT_EQ(t2.last.cache.swa, "restored");
      if (spec) spec_turn2 = st;
      turns[spec] = {t1, t2};
    }
    ASSERT_EQ(turns[0].size(), 2u);
    ASSERT_EQ(turns[1].size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(turns[1][k].tokens, turns[0][k].tokens) << "turn " << k + 1;
      EXPECT_EQ(static_cast<int64_t>(turns[1][k].tokens.size()), N);
    }
    EXPECT_GT(spec_turn2.spec_steps, 3) << "turn 2 (restored) decoded speculatively";
    if (!decoder_replay) {
      std::unique_ptr<model::SequenceState> unused;
      EXPECT_EQ(turns[1][0].tokens, plain_greedy(p1, N, &unused)) << "exact prefill: plain greedy";
    }
  }
}

TEST(SpeculativeRules, RejectionSamplingMatchesTargetDistribution) {
  const int64_t V = 6, l = 3, n = 200000;
  std::mt19937_64 rng(1234);
  // A draft far from the target (rejections and residual draws) and the target rows.
  const std::vector<double> p = {0.5, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.6,
                                 0.1, 0.1, 0.1, 0.3, 0.3,  0.1,  0.1,  0.1,  0.1};
  const std::vector<double> P = {0.1,  0.3,  0.25, 0.05, 0.2, 0.1, 0.2,  0.2,  0.2, 0.2, 0.1,  0.1,
                                 0.05, 0.05, 0.1,  0.2,  0.3, 0.3, 0.15, 0.15, 0.2, 0.2, 0.15, 0.15};
  std::vector<int64_t> first(V, 0), second_given_accept(V, 0);
  int64_t accepted_first = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int32_t> c(l);
    for (int64_t k = 0; k < l; ++k) c[k] = engine::draw_from(std::span<const double>(&p[k * V], V), rng);
    engine::Acceptance a = engine::accept_sampled(c, p, P, V, rng);
    const int32_t t0 = a.accepted > 0 ? c[0] : a.bonus;
    ++first[t0];
    if (a.accepted > 0) {
      ++accepted_first;
      ++second_given_accept[a.accepted > 1 ? c[1] : a.bonus];
    }
  }
  auto [s1, df1] = chi2(first, std::vector<double>(P.begin(), P.begin() + V), n);
  EXPECT_LT(s1, chi2_crit(df1)) << "first token";
  // Given the first candidate was accepted, the second token follows target row 1.
  auto [s2, df2] =
      chi2(second_given_accept, std::vector<double>(P.begin() + V, P.begin() + 2 * V), accepted_first);
  EXPECT_LT(s2, chi2_crit(df2)) << "second token";
}

TEST_F(DsparkSpec, SampledFirstTokenFollowsTarget) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const int64_t V = m.config().vocab_size;
  auto dec = *engine::DsparkDecoder::create(&m);
  auto base = m.new_sequence();
  const std::vector<int32_t> prompt = golden_prompt();
  auto last = dec.prefill(*base, prompt);
  ASSERT_TRUE(last.ok());
  const int32_t anchor = engine::argmax_token(*last);
  // Target distribution of the token after the anchor, at the highest temperature that still
  // puts >= 5 expected draws on 3 tokens of the 2048 (the test needs bins, and the draft must be
  // both accepted and rejected).
  const int64_t runs = 400;
  std::vector<double> P;
  double T = 0;
  {
    model::SequenceState probe = *base;
    auto o = m.decode_step(probe, anchor, model::ForwardOptions{});
    ASSERT_TRUE(o.ok());
    for (double t : {1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07}) {
      P = engine::tempered_probs(o->logits, t);
      int64_t bins = 0;
      for (double v : P) bins += v * runs >= 5;
      T = t;
      if (bins >= 3) break;
    }
  }
  std::vector<int64_t> counts(V, 0);
  std::mt19937_64 rng(99);
  int64_t rejected = 0;
  for (int64_t i = 0; i < runs; ++i) {
    model::SequenceState st = *base;
    engine::SpecStepOptions so;
    so.temperature = T;
    so.rng = &rng;
    auto s = dec.step(st, anchor, so);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ++counts[s->tokens[0]];
    rejected += s->accepted == 0;
  }
  auto [stat, df] = chi2(counts, P, runs);
  std::printf(
      "[ dspark ] sampled T=%.2f: chi2 %.2f on %lld dof (crit %.2f), first candidate rejected %lld/%lld\n", T,
      stat, static_cast<long long>(df), chi2_crit(std::max<int64_t>(df, 1)), static_cast<long long>(rejected),
      static_cast<long long>(runs));
  ASSERT_GE(df, 2);
  EXPECT_LT(stat, chi2_crit(df));
  EXPECT_GT(rejected, 0);
  EXPECT_LT(rejected, runs);
}

TEST(SpeculativeRules, GreedyAcceptanceAndScheduling) {
  const int64_t V = 4;
  // Rows T_0..T_3 with argmax 2, 1, 3, 0.
  const std::vector<float> T = {0, 1, 5, 2, 0, 9, 1, 1, 0, 0, 0, 1, 7, 0, 0, 0};
  std::vector<int32_t> c = {2, 1, 0};
  engine::Acceptance a = engine::accept_greedy(c, T, V);
  EXPECT_EQ(a.accepted, 2);
  EXPECT_EQ(a.bonus, 3);
  c = {2, 1, 3};
  a = engine::accept_greedy(c, T, V);
  EXPECT_EQ(a.accepted, 3);
  EXPECT_EQ(a.bonus, 0);
  // The device-reduced rows give the same answer (GPU greedy verification), every prefix length.
  const std::vector<int32_t> amax = {2, 1, 3, 0};
  for (const std::vector<int32_t>& cc : {std::vector<int32_t>{0, 1, 3}, std::vector<int32_t>{2, 0, 3},
                                         std::vector<int32_t>{2, 1, 0}, std::vector<int32_t>{2, 1, 3},
                                         std::vector<int32_t>{2, 1}, std::vector<int32_t>{}}) {
    const std::span<const float> Tl(T.data(), (cc.size() + 1) * V);
    const engine::Acceptance want = engine::accept_greedy(cc, Tl, V);
    const engine::Acceptance got =
        engine::accept_greedy_argmax(cc, std::span<const int32_t>(amax).subspan(0, cc.size() + 1));
    EXPECT_EQ(got.accepted, want.accepted) << cc.size();
    EXPECT_EQ(got.bonus, want.bonus) << cc.size();
  }
  const std::vector<float> q = {0.9f, 0.5f, 0.9f, 0.2f, 0.9f};
  EXPECT_EQ(engine::verify_length(q, 0.3), 3);  // 0.9, 0.45, 0.405, 0.081, ...
  EXPECT_EQ(engine::verify_length(q, 0.95), 0);
  const auto lens = engine::schedule_verify_lengths(
      {engine::prefix_survival(q),
       engine::prefix_survival(std::vector<float>{0.99f, 0.99f, 0.1f, 0.9f, 0.9f})},
      4);
  EXPECT_EQ(lens, (std::vector<int64_t>{2, 2}));
  // With per-sequence caps (verify_len / threshold) and no draft (empty, cap 0).
  const std::vector<std::vector<float>> conf = {q, {0.99f, 0.99f, 0.1f, 0.9f, 0.9f}, {}};
  const std::vector<int64_t> cap = {5, 1, 0};
  EXPECT_EQ(engine::budget_verify_lengths(conf, cap, -1), cap);
  EXPECT_EQ(engine::budget_verify_lengths(conf, cap, 0), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(engine::budget_verify_lengths(conf, cap, 4), (std::vector<int64_t>{3, 1, 0}));  // .99 .9 .45 .405
  EXPECT_EQ(engine::budget_verify_lengths(conf, cap, 100), cap);
}

}  // namespace
}  // namespace ds41::testing
