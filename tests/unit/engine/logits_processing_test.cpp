// Penalties and log-probabilities (logits_processing.h); the draw itself: sampler_test.cpp.
#include "engine/logits_processing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>


namespace ds41::engine {
namespace {

TEST(Penalties, PresenceAndFrequencyCountGeneratedTokensOnly) {
  SamplingParams p;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  std::vector<int32_t> prompt = {1, 1, 2};
  PenaltyState st(p, prompt, 6);
  ASSERT_TRUE(st.active());
  st.add(3);
  st.add(3);
  st.add(4);
  std::vector<float> l = {1, 1, 1, 1, 1, 1};
  st.apply(l.data(), 6);
  EXPECT_FLOAT_EQ(l[1], 1.0f);  // prompt tokens are not penalized (OpenAI)
  EXPECT_FLOAT_EQ(l[3], 1.0f - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(l[4], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[5], 1.0f);
}

TEST(Penalties, RepetitionDividesPositiveAndMultipliesNegativeOverPromptAndGenerated) {
  SamplingParams p;
  p.repetition_penalty = 2.0;
  std::vector<int32_t> prompt = {0, 1};
  PenaltyState st(p, prompt, 4);
  st.add(2);
  std::vector<float> l = {3, -3, 4, 5};
  st.apply(l.data(), 4);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  EXPECT_FLOAT_EQ(l[1], -6.0f);
  EXPECT_FLOAT_EQ(l[2], 2.0f);
  EXPECT_FLOAT_EQ(l[3], 5.0f);
  EXPECT_FALSE(PenaltyState(SamplingParams{}, prompt, 4).active());
}

TEST(Logprobs, LogSoftmaxAndTopNWithTiesByLowerId) {
  std::vector<float> l = {1, 3, 3, 0, 2};
  std::vector<TopLogprob> top;
  const float lp = token_logprob(l.data(), 5, 4, 3, &top);
  double z = 0;
  for (float x : l) z += std::exp(static_cast<double>(x));
  EXPECT_NEAR(lp, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 2);
  EXPECT_EQ(top[2].token, 4);
  EXPECT_NEAR(top[0].logprob, 3.0 - std::log(z), 1e-6);
  // Clamped to 20.
  std::vector<float> big(100, 0.0f);
  token_logprob(big.data(), 100, 0, 50, &top);
  EXPECT_EQ(top.size(), 20u);
  EXPECT_EQ(top[19].token, 19);
}

}  // namespace
}  // namespace ds41::engine
