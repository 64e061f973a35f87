// engine/sampler: parameter validation, the greedy tie rule, rejected rows, determinism per
// seed, and the distribution after temperature / top_k / min_p / top_p against probabilities
// computed here independently (softmax in the test). Statistical bounds are 6 standard
// deviations of the observed frequency (false failure ~1e-9 per check); each test names the
// wrong implementation its numbers would catch.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

namespace ds41::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

SamplerParams params(double t, double top_p = 1, int64_t top_k = 0, double min_p = 0, uint64_t seed = 1) {
  SamplerParams p;
  p.temperature = t;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

Sampler make(const SamplerParams& p) {
  auto s = Sampler::create(p);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

// Frequencies of `draws` samples from one row.
std::vector<double> frequencies(Sampler& s, const std::vector<float>& row, int draws) {
  std::vector<double> f(row.size(), 0);
  for (int i = 0; i < draws; ++i) {
    auto t = s.sample(row);
    EXPECT_TRUE(t.ok()) << t.status().message();
    f[static_cast<size_t>(*t)] += 1.0 / draws;
  }
  return f;
}

// softmax(row / t) restricted to `keep` (others 0), renormalized: the test's own arithmetic.
std::vector<double> expected(const std::vector<float>& row, double t, const std::set<int>& keep) {
  double mx = -1e300;
  for (float v : row) mx = std::max(mx, static_cast<double>(v));
  std::vector<double> p(row.size(), 0);
  double z = 0;
  for (int i : keep) z += p[i] = std::exp((row[i] - mx) / t);
  for (double& v : p) v /= z;
  return p;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, int draws) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double sd = std::sqrt(std::max(want[i] * (1 - want[i]), 1e-12) / draws);
    if (want[i] == 0)
      EXPECT_EQ(got[i], 0) << "token " << i << " must never be drawn";
    else
      EXPECT_NEAR(got[i], want[i], 6 * sd) << "token " << i;
  }
}

// Logits of the probabilities {0.5, 0.3, 0.15, 0.05} (at temperature 1).
const std::vector<float> kRow4 = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};

TEST(SamplerTest, RejectsParamsOutsideTheirRanges) {
  const double nan = std::nan("");
  for (const SamplerParams& p :
       {params(-0.1), params(nan), params(INFINITY), params(1, 0), params(1, 1.01), params(1, nan),
        params(1, -1), params(1, 1, -1), params(1, 1, 0, -0.1), params(1, 1, 0, 1.5), params(1, 1, 0, nan)}) {
    auto s = Sampler::create(p);
    ASSERT_FALSE(s.ok()) << "t=" << p.temperature << " top_p=" << p.top_p << " top_k=" << p.top_k
                         << " min_p=" << p.min_p;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(validate_sampling_params(p).ok());
  }
  for (const SamplerParams& p : {params(0), params(0.7, 0.9, 40, 0.05), params(2, 1, 1, 1)})
    EXPECT_TRUE(Sampler::create(p).ok());
}

TEST(SamplerTest, RejectsEmptyNanPlusInfAndAllMinusInfRows) {
  Sampler greedy = make(params(0));
  Sampler hot = make(params(1));
  const float nan = std::nanf("");
  for (Sampler* s : {&greedy, &hot}) {
    EXPECT_FALSE(s->sample(std::vector<float>{}).ok());
    EXPECT_FALSE(s->sample(std::vector<float>{0.f, nan, 1.f}).ok());
    EXPECT_FALSE(s->sample(std::vector<float>{0.f, INFINITY}).ok());
    EXPECT_FALSE(s->sample(std::vector<float>{kNegInf, kNegInf}).ok());
    EXPECT_EQ(s->sample(std::vector<float>{kNegInf, 3.f, kNegInf}).value(), 1);
  }
}

// Temperature 0 is argmax with the lowest index among equal maxima, whatever the seed and the
// other params (a "last maximum" or random tie break fails).
TEST(SamplerTest, TemperatureZeroIsArgmaxLowestIndexOnTies) {
  const std::vector<float> row = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, kNegInf};
  for (uint64_t seed : {0u, 1u, 99u}) {
    Sampler s = make(params(0, 0.1, 2, 0.5, seed));
    for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(row).value(), 1);
  }
  EXPECT_EQ(argmax_token(row), 1);
  std::vector<float> big(129280, -3.f);
  big[129279] = 7.f;
  big[77777] = 7.f;
  EXPECT_EQ(make(params(0)).sample(big).value(), 77777);
}

// Same params and seed -> the same token sequence; another seed -> another sequence.
TEST(SamplerTest, SameSeedSameSequenceOtherSeedDiffers) {
  std::vector<float> row(64);
  for (size_t i = 0; i < row.size(); ++i) row[i] = std::sin(static_cast<float>(i) * 0.37f);
  auto run = [&](uint64_t seed) {
    Sampler s = make(params(1.3, 0.95, 0, 0, seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(row).value());
    return out;
  };
  EXPECT_EQ(run(5), run(5));
  EXPECT_NE(run(5), run(6));
}

// Temperature divides the logits: T = 1 and T = 2.5 match softmax(logits / T). Multiplying
// instead, or ignoring T, moves token 0 of the T = 2.5 row from 0.37 to >= 0.5.
TEST(SamplerTest, TemperatureMatchesSoftmaxOfScaledLogits) {
  constexpr int kDraws = 40000;
  for (double t : {1.0, 2.5}) {
    Sampler s = make(params(t, 1, 0, 0, 11));
    expect_close(frequencies(s, kRow4, kDraws), expected(kRow4, t, {0, 1, 2, 3}), kDraws);
  }
}

// top_k never returns a token outside the k largest logits (checked on a full-size row), and
// inside them draws in proportion (an off-by-one k, or a k applied after sampling, fails).
TEST(SamplerTest, TopKNeverLeavesTheTopKAndKeepsProportions) {
  std::vector<float> big(129280);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>((i * 7919) % 1000) / 100.f;
  std::set<int32_t> top5;  // the five ids whose (i * 7919) % 1000 is largest (999, 998, ...)
  {
    std::vector<std::pair<float, int32_t>> v;
    for (size_t i = 0; i < big.size(); ++i) v.push_back({big[i], static_cast<int32_t>(i)});
    std::sort(v.begin(), v.end(), [](auto a, auto b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int i = 0; i < 5; ++i) top5.insert(v[i].second);
  }
  Sampler s = make(params(5.0, 1, 5, 0, 3));
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.sample(big).value();
    EXPECT_TRUE(top5.count(t)) << t;
    seen.insert(t);
  }
  EXPECT_EQ(seen, top5);  // with T = 5 the five are near-uniform: each is drawn

  constexpr int kDraws = 40000;
  Sampler k2 = make(params(1, 1, 2, 0, 4));
  expect_close(frequencies(k2, kRow4, kDraws), expected(kRow4, 1, {0, 1}), kDraws);
}

// top_p keeps the shortest prefix reaching top_p of the mass: 0.7 keeps {0.5, 0.3} (0.5 alone
// is short of 0.7), drawn 0.625 / 0.375. Keeping one token too many gives 0.53 for token 0.
TEST(SamplerTest, TopPKeepsTheShortestPrefixReachingTheMass) {
  constexpr int kDraws = 40000;
  Sampler s = make(params(1, 0.7, 0, 0, 8));
  expect_close(frequencies(s, kRow4, kDraws), expected(kRow4, 1, {0, 1}), kDraws);
  Sampler one = make(params(1, 0.4, 0, 0, 8));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(one.sample(kRow4).value(), 0);  // 0.5 alone reaches 0.4
}

// min_p keeps tokens with p >= min_p * p_max: 0.25 keeps 1, 0.6, 0.3 (relative) and drops 0.1.
TEST(SamplerTest, MinPDropsTokensBelowTheFractionOfTheMax) {
  constexpr int kDraws = 40000;
  Sampler s = make(params(1, 1, 0, 0.25, 9));
  expect_close(frequencies(s, kRow4, kDraws), expected(kRow4, 1, {0, 1, 2}), kDraws);
}

// top_p is a fraction of what top_k left (renormalized), not of the whole row: with top_k 3 the
// kept mass is 0.95, and top_p 0.83 keeps {0, 1} (0.8 / 0.95 = 0.842 >= 0.83); measured against
// the whole row (0.8 < 0.83) token 2 would be kept too.
TEST(SamplerTest, TopPIsAFractionOfTheTopKMass) {
  constexpr int kDraws = 40000;
  Sampler s = make(params(1, 0.83, 3, 0, 10));
  expect_close(frequencies(s, kRow4, kDraws), expected(kRow4, 1, {0, 1}), kDraws);
}

// Tokens whose probability is 0 (-inf logits, or exp underflow) are never drawn, even with
// top_p = 1 (a walk that falls off the end of the kept mass must not land on them).
TEST(SamplerTest, MinusInfinityLogitsAreNeverDrawn) {
  std::vector<float> row(1000, kNegInf);
  row[10] = 0.f;
  row[500] = 0.1f;
  row[999] = -0.2f;
  Sampler s = make(params(1, 1, 0, 0, 12));
  for (int i = 0; i < 3000; ++i) {
    const int32_t t = s.sample(row).value();
    EXPECT_TRUE(t == 10 || t == 500 || t == 999) << t;
  }
}

}  // namespace
}  // namespace ds41::engine
