// Penalties, log-probabilities and the sampling seam (logits_processing.h, sampling_seam.h).
#include "engine/logits_processing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampling_seam.h"

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

TEST(SamplingSeam, GreedyTakesTheLowestIdAmongEqualMaxima) {
  std::vector<float> l = {0, 5, 2, 5};
  Rng rng(1);
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
  p.temperature = 1;
  p.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 4, p, rng), 1);
}

TEST(SamplingSeam, TopKTopPMinPRestrictTheSupport) {
  std::vector<float> l = {2.0f, 1.0f, 0.0f, -1.0f, 3.0f};
  auto support = [&](SamplingParams p) {
    Rng rng(7);
    std::map<int32_t, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[sample_token(l.data(), 5, p, rng)];
    return seen;
  };
  SamplingParams p;
  p.temperature = 1.0;
  EXPECT_EQ(support(p).size(), 5u);
  p.top_k = 2;
  auto s = support(p);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_TRUE(s.count(4) && s.count(0));
  p.top_k = 0;
  p.top_p = 0.5;  // p(4) = 0.64 alone reaches 0.5
  EXPECT_EQ(support(p).size(), 1u);
  p.top_p = 1.0;
  p.min_p = 0.3;  // keeps p >= 0.3 * p_max: logits >= 3 + ln 0.3 = 1.796
  s = support(p);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_TRUE(s.count(4) && s.count(0));
  // Roughly the softmax frequencies (temperature 1, no truncation): p(4) ~ 0.636.
  p.min_p = 0;
  EXPECT_NEAR(support(p)[4] / 4000.0, 0.636, 0.03);
}

TEST(SamplingSeam, SameSeedSameDraws) {
  std::vector<float> l(300);
  for (int i = 0; i < 300; ++i) l[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.9;
  Rng a(123), b(123);
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(sample_token(l.data(), 300, p, a), sample_token(l.data(), 300, p, b));
}

}  // namespace
}  // namespace ds41::engine
