// CudaEngine::step with StepItem::greedy_only (engine.h): when every logits item of a step is drawn
// greedily, the engine returns each item's token (the checked argmax on the device) instead of its
// row. Two engines on the golden tiny model run the same batches — prompts of different lengths
// (chunked past the step's token limit), then decode steps with a fork — one returning rows, one
// tokens: every token equals engine::Sampler's greedy draw from the other's row, the engines' states
// stay equal (the next rows agree bit for bit), and a mixed step (one item not greedy_only) returns
// rows as before.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

TEST(GpuGreedyTokens, StepTokensAreTheSamplersGreedyDrawOfTheRows) {
  DS41_SKIP_WITHOUT_GPU();
  const std::string dir = golden_dir();
  auto dm = load_device_model(dir);
  ASSERT_TRUE(dm);
  // Steps of at most 48 tokens: the 70-token prompt runs in two rounds of the forward.
  auto rows_eng = make_engine(*dm, 8, 4096, 48), tok_eng = make_engine(*dm, 8, 4096, 48);
  ASSERT_TRUE(rows_eng && tok_eng);
  const int64_t V = rows_eng->info().vocab_size;
  const std::vector<int64_t> lens = {70, 9, 33};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<int32_t> p(static_cast<size_t>(lens[s]));
    for (int64_t i = 0; i < lens[s]; ++i) p[i] = static_cast<int32_t>((i * 131 + s * 977 + 7) % V);
    prompts.push_back(p);
  }
  std::vector<engine::SeqId> ra, ta;
  for (size_t s = 0; s < lens.size(); ++s) {
    auto a = rows_eng->create_sequence(), b = tok_eng->create_sequence();
    ASSERT_TRUE(a.ok() && b.ok());
    ra.push_back(*a);
    ta.push_back(*b);
  }
  // One step over items built from `toks` (per sequence); greedy_only on the token engine's items.
  auto step = [&](gpu::CudaEngine& e, const std::vector<engine::SeqId>& seqs,
                  const std::vector<std::vector<int32_t>>& toks, bool greedy, engine::StepOutput* out) {
    std::vector<engine::StepItem> items;
    for (size_t s = 0; s < seqs.size(); ++s) {
      engine::StepItem it;
      it.seq = seqs[s];
      it.tokens = toks[s];
      it.greedy_only = greedy;
      items.push_back(it);
    }
    const Status st = e.step(items, out);
    ASSERT_TRUE(st.ok()) << st.message();
  };
  std::vector<std::vector<int32_t>> feed = prompts;
  int64_t compared = 0;
  for (int t = 0; t < 6; ++t) {
    engine::StepOutput ro, to;
    step(*rows_eng, ra, feed, false, &ro);
    step(*tok_eng, ta, feed, true, &to);
    ASSERT_TRUE(ro.token.empty());
    ASSERT_EQ(to.token.size(), feed.size());
    EXPECT_TRUE(to.logits.empty()) << "no rows cross to the host for a greedy-only step";
    std::vector<std::vector<int32_t>> next;
    for (size_t s = 0; s < feed.size(); ++s) {
      ASSERT_GE(ro.row[s], 0);
      EXPECT_EQ(to.row[s], -1);
      const std::span<const float> row(ro.logits.data() + ro.row[s] * V, static_cast<size_t>(V));
      auto sampler = engine::Sampler::create(engine::SamplerParams{});  // temperature 0: greedy
      ASSERT_TRUE(sampler.ok());
      auto want = sampler->sample(row);
      ASSERT_TRUE(want.ok()) << want.status().message();
      EXPECT_EQ(to.token[s], *want) << "step " << t << " sequence " << s;
      ++compared;
      next.push_back({*want});
    }
    feed = next;
    if (t == 2) {  // a fork of sequence 1 joins the batch in both engines
      auto fa = rows_eng->fork_sequence(ra[1]), fb = tok_eng->fork_sequence(ta[1]);
      ASSERT_TRUE(fa.ok() && fb.ok());
      ra.push_back(*fa);
      ta.push_back(*fb);
      feed.push_back({static_cast<int32_t>((feed[1][0] + 1) % V)});
    }
  }
  EXPECT_EQ(compared, 3 * 3 + 4 * 3);
  // A mixed step (the last item not greedy_only): rows for every item, no tokens; the rows agree
  // bit for bit with the rows engine's (the token engine's state followed the same tokens).
  engine::StepOutput ro, mo;
  step(*rows_eng, ra, feed, false, &ro);
  std::vector<engine::StepItem> items;
  for (size_t s = 0; s < ta.size(); ++s) {
    engine::StepItem it;
    it.seq = ta[s];
    it.tokens = feed[s];
    it.greedy_only = s + 1 < ta.size();
    items.push_back(it);
  }
  ASSERT_TRUE(tok_eng->step(items, &mo).ok());
  EXPECT_TRUE(mo.token.empty());
  ASSERT_EQ(mo.logits.size(), ro.logits.size());
  size_t differ = 0;
  for (size_t i = 0; i < mo.logits.size(); ++i) differ += mo.logits[i] != ro.logits[i];
  EXPECT_EQ(differ, 0u) << "the token engine's sequences hold the same state";
}

}  // namespace
}  // namespace ds41::testing
