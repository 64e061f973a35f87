// CpuEngine over the public golden tiny model (v41-tiny-public): a sequence's logits do not
// depend on what it is batched with (bitwise), chunked prefill through step() equals one shot,
// fork continues identically, state bytes match bytes_for_tokens exactly, and every step error
// leaves all sequences unchanged. Sequences of 150+ tokens exceed the tiny config's window (8),
// top-k (8), ratio-2 pairing and candidate pool (MODEL_SPEC 7).
#include "engine/cpu_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine_loop.h"
#include "golden/golden_arrays.h"
#include "unit/engine/loop_test_util.h"

namespace ds41::engine {
namespace {

class CpuEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new ds41::testing::TestModel(ds41::testing::load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  void SetUp() override {
    ASSERT_TRUE(tm_->model);
    eng_ = std::make_unique<CpuEngine>(tm_->model.get(), "tiny");
    V_ = eng_->info().vocab_size;
  }
  // Runs items; returns each wanted row (empty for rows not wanted).
  std::vector<std::vector<float>> step(std::vector<StepItem> items) {
    StepOutput out;
    Status s = eng_->step(items, &out);
    EXPECT_TRUE(s.ok()) << s.message();
    std::vector<std::vector<float>> rows(items.size());
    for (size_t i = 0; i < items.size(); ++i)
      if (s.ok() && out.row[i] >= 0)
        rows[i].assign(out.logits.begin() + out.row[i] * V_, out.logits.begin() + (out.row[i] + 1) * V_);
    return rows;
  }
  static bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && !a.empty() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  SeqId make() { return *eng_->create_sequence(); }
  static ds41::testing::TestModel* tm_;
  std::unique_ptr<CpuEngine> eng_;
  int64_t V_ = 0;
};
ds41::testing::TestModel* CpuEngineTest::tm_ = nullptr;

TEST_F(CpuEngineTest, InfoFromTheConfig) {
  EXPECT_EQ(eng_->info().vocab_size, tm_->model->config().vocab_size);
  EXPECT_EQ(eng_->info().max_context, tm_->model->config().max_position_embeddings);
  EXPECT_EQ(eng_->info().eos_token_id, tm_->model->config().eos_token_id);
  EXPECT_EQ(eng_->info().device, "cpu");
  EXPECT_EQ(CpuEngine(tm_->model.get(), "x", 300).info().max_context, 300);
}

TEST_F(CpuEngineTest, LogitsDoNotDependOnTheBatchBitwise) {
  auto a = looptest::random_prompt_with_repeats(160, 1), b = looptest::random_prompt_with_repeats(95, 2), c = looptest::random_prompt_with_repeats(210, 3);
  std::span<const int32_t> A(a), B(b), C(c);
  // Alone: a in two chunks, then two decodes.
  const SeqId alone = make();
  step({{alone, A.subspan(0, 101), false}});
  auto ref_prefill = step({{alone, A.subspan(101), true}})[0];
  std::vector<int32_t> d1 = {17}, d2 = {1900};
  auto ref_d1 = step({{alone, d1, true}})[0];
  auto ref_d2 = step({{alone, d2, true}})[0];
  // Batched: the same chunks of a beside other sequences' prefill chunks and decodes, in
  // different batch positions each step.
  const SeqId sa = make(), sb = make(), sc = make();
  step({{sb, B.subspan(0, 40), false}, {sa, A.subspan(0, 101), false}, {sc, C.subspan(0, 7), true}});
  auto r = step({{sc, C.subspan(7, 150), true}, {sb, B.subspan(40), true}, {sa, A.subspan(101), true}});
  EXPECT_TRUE(bitwise_equal(r[2], ref_prefill));
  std::vector<int32_t> bd = {5};
  r = step({{sa, d1, true}, {sb, bd, true}, {sc, C.subspan(157), true}});
  EXPECT_TRUE(bitwise_equal(r[0], ref_d1));
  r = step({{sb, bd, true}, {sa, d2, true}});
  EXPECT_TRUE(bitwise_equal(r[1], ref_d2));
}

TEST_F(CpuEngineTest, ChunkedPrefillThroughStepEqualsOneShot) {
  auto a = looptest::random_prompt_with_repeats(230, 4);
  std::span<const int32_t> A(a);
  const SeqId one = make();
  auto ref = step({{one, A, true}})[0];
  for (int64_t chunk : {1, 7, 64}) {
    const SeqId s = make();
    std::vector<float> last;
    for (int64_t p = 0; p < static_cast<int64_t>(a.size()); p += chunk) {
      const int64_t n = std::min<int64_t>(chunk, a.size() - p);
      const bool end = p + n == static_cast<int64_t>(a.size());
      auto rows = step({{s, A.subspan(p, n), end}});
      if (end) last = rows[0];
    }
    EXPECT_TRUE(bitwise_equal(last, ref))
        << "chunk " << chunk << " row error " << ds41::testing::row_error(ref.data(), last.data(), V_);
    EXPECT_EQ(*eng_->sequence_position(s), static_cast<int64_t>(a.size()));
    ASSERT_TRUE(eng_->free_sequence(s).ok());
  }
}

TEST_F(CpuEngineTest, ForkContinuesIdentically) {
  auto a = looptest::random_prompt_with_repeats(180, 5);
  std::span<const int32_t> A(a);
  const SeqId s = make();
  step({{s, A.subspan(0, 151), false}});
  auto f = eng_->fork_sequence(s);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*eng_->sequence_position(*f), 151);
  EXPECT_EQ(*eng_->sequence_bytes(*f), *eng_->sequence_bytes(s));
  auto r = step({{s, A.subspan(151), true}, {*f, A.subspan(151), true}});
  EXPECT_TRUE(bitwise_equal(r[0], r[1]));
  // Diverging continuations do not leak into each other.
  std::vector<int32_t> x = {9}, y = {10};
  auto rs = step({{s, x, true}, {*f, y, true}});
  auto g = eng_->fork_sequence(s);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(eng_->free_sequence(s).ok());  // the fork outlives its source
  auto rg = step({{*g, y, true}});
  const SeqId t = make();
  std::vector<int32_t> ext(a.begin(), a.end());
  ext.push_back(9);
  ext.push_back(10);
  auto rt = step({{t, ext, true}})[0];
  EXPECT_TRUE(bitwise_equal(rg[0], rt));
  EXPECT_FALSE(bitwise_equal(rs[0], rs[1]));
}

TEST_F(CpuEngineTest, StateBytesMatchBytesForTokensExactly) {
  auto a = looptest::random_prompt_with_repeats(203, 6);
  std::span<const int32_t> A(a);
  const SeqId s = make();
  EXPECT_EQ(*eng_->sequence_bytes(s), eng_->bytes_for_tokens(0));
  int64_t pos = 0;
  for (int64_t n : {1, 1, 1, 10, 37, 100, 53}) {
    step({{s, A.subspan(pos, n), false}});
    pos += n;
    EXPECT_EQ(*eng_->sequence_bytes(s), eng_->bytes_for_tokens(pos)) << "at " << pos << " tokens";
  }
  EXPECT_GT(eng_->bytes_for_tokens(1000), eng_->bytes_for_tokens(100));
}

TEST_F(CpuEngineTest, ErrorsLeaveEverySequenceUnchanged) {
  CpuEngine eng(tm_->model.get(), "tiny", 160);  // a context we can reach
  auto a = looptest::random_prompt_with_repeats(150, 7), b = looptest::random_prompt_with_repeats(60, 8);
  std::span<const int32_t> A(a), B(b);
  const SeqId sa = *eng.create_sequence(), sb = *eng.create_sequence(), ref = *eng.create_sequence();
  StepOutput out;
  std::vector<StepItem> first = {
      {sa, A.subspan(0, 140), false}, {sb, B.subspan(0, 30), false}, {ref, A.subspan(0, 140), false}};
  ASSERT_TRUE(eng.step(first, &out).ok());
  const int64_t bytes_a = *eng.sequence_bytes(sa), bytes_b = *eng.sequence_bytes(sb);
  std::vector<int32_t> empty, bad_id = {3, static_cast<int32_t>(V_)}, too_many(21, 5), ok_tokens = {4, 5};
  struct Case {
    std::vector<StepItem> items;
    StatusCode code;
    std::string needle;
  };
  std::vector<Case> cases = {
      {{{sb, B.subspan(30), true}, {999, ok_tokens, true}}, StatusCode::kNotFound, "999"},
      {{{sa, ok_tokens, true}, {sb, B.subspan(30), true}, {sa, ok_tokens, true}},
       StatusCode::kInvalidArgument,
       "twice"},
      {{{sb, B.subspan(30), true}, {sa, empty, true}}, StatusCode::kInvalidArgument, "no tokens"},
      {{{sb, B.subspan(30), true}, {sa, bad_id, true}},
       StatusCode::kInvalidArgument,
       "outside the vocabulary"},
      {{{sb, B.subspan(30), true}, {sa, too_many, true}}, StatusCode::kOutOfRange, "161"},
  };
  for (const Case& c : cases) {
    Status s = eng.step(c.items, &out);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), c.code) << s.message();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(*eng.sequence_position(sa), 140);
    EXPECT_EQ(*eng.sequence_position(sb), 30);
    EXPECT_EQ(*eng.sequence_bytes(sa), bytes_a);
    EXPECT_EQ(*eng.sequence_bytes(sb), bytes_b);
  }
  // sa continues exactly like the reference that saw no failed steps.
  std::vector<StepItem> cont = {{sa, A.subspan(140), true}, {ref, A.subspan(140), true}};
  ASSERT_TRUE(eng.step(cont, &out).ok());
  EXPECT_EQ(std::memcmp(out.logits.data(), out.logits.data() + V_, V_ * sizeof(float)), 0);
  EXPECT_EQ(eng.free_sequence(12345).code(), StatusCode::kNotFound);
  EXPECT_EQ(eng.live_sequences(), 3);
}

TEST_F(CpuEngineTest, LoopOutputEqualsEachRequestAlone) {
  // Seeded sampling through the loop, with chunked prefills and decodes of other requests in the
  // same steps, gives each request the tokens it gets when it runs alone.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = looptest::random_prompt_with_repeats(60 + 45 * i, 20 + i);
    r.max_tokens = 8;
    r.ignore_eos = true;
    r.sampling.temperature = 0.8;
    r.sampling.seed = 100 + i;
    reqs.push_back(r);
  }
  auto run = [&](std::vector<int> which) {
    LoopConfig cfg;
    cfg.max_batch_tokens = 48;
    cfg.max_running = 4;
    EngineLoop loop(eng_.get(), cfg);
    EXPECT_TRUE(loop.start().ok());
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i : which) streams.push_back(*loop.submit(reqs[i]));
    std::vector<std::vector<int32_t>> toks(streams.size());
    for (size_t k = 0; k < streams.size(); ++k) {
      std::vector<TokenEvent> evs;
      while (streams[k]->next(&evs, std::chrono::milliseconds(20000))) {
      }
      for (const auto& e : evs)
        if (e.token >= 0) toks[k].push_back(e.token);
      EXPECT_EQ(evs.back().finish, FinishReason::kLength);
    }
    loop.stop(std::chrono::milliseconds(1000));
    return toks;
  };
  auto together = run({0, 1, 2});
  for (int i = 0; i < 3; ++i) {
    auto alone = run({i});
    EXPECT_EQ(together[i], alone[0]) << "request " << i;
    EXPECT_EQ(together[i].size(), 8u);
  }
  EXPECT_EQ(eng_->live_sequences(), 0);
}

}  // namespace
}  // namespace ds41::engine
