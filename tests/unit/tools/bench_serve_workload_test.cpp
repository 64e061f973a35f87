// ds41 bench serve workloads: the same seed gives the same trace, a different seed a different
// one; the agent trace's prompts grow with shared prefixes; Poisson gaps have the right mean.
#include "bench_serve_workload.h"

#include <gtest/gtest.h>

namespace ds41::cli::bench_serve {
namespace {

bool is_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return a.size() < b.size() && std::equal(a.begin(), a.end(), b.begin());
}

TEST(BenchServeWorkload, SplitMix64IsFixedByItsDefinition) {
  // Reference values of splitmix64 from seed 0 (Vigna's reference implementation).
  SplitMix64 r(0);
  EXPECT_EQ(r.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(r.next(), 0x6E789E6AA1B965F4ull);
}

TEST(BenchServeWorkload, RandomWorkloadIsDeterministicWithExactLengths) {
  auto a = random_workload(8, 100, 7, 42), b = random_workload(8, 100, 7, 42),
       c = random_workload(8, 100, 7, 43);
  ASSERT_EQ(a.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), 1u);
    EXPECT_EQ(a[i][0].prompt.size(), 100u);
    EXPECT_EQ(a[i][0].max_tokens, 7);
    EXPECT_EQ(a[i][0].prompt, b[i][0].prompt);
    for (int32_t t : a[i][0].prompt) {
      EXPECT_GE(t, TokenRange{}.lo);
      EXPECT_LT(t, TokenRange{}.hi);
    }
  }
  EXPECT_NE(a[0][0].prompt, c[0][0].prompt);
  EXPECT_NE(a[0][0].prompt, a[1][0].prompt);
}

TEST(BenchServeWorkload, AgentTraceIsDeterministicForASeed) {
  AgentTraceConfig cfg;
  cfg.sessions = 5;
  cfg.turns = 6;
  cfg.seed = 7;
  auto a = agent_trace(cfg), b = agent_trace(cfg);
  cfg.seed = 8;
  auto c = agent_trace(cfg);
  ASSERT_EQ(a.size(), 5u);
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), 6u);
    for (size_t t = 0; t < a[s].size(); ++t) EXPECT_EQ(a[s][t].prompt, b[s][t].prompt);
  }
  EXPECT_NE(a[0][1].prompt, c[0][1].prompt);
}

TEST(BenchServeWorkload, AgentTurnsGrowWithSharedPrefixes) {
  AgentTraceConfig cfg;
  cfg.sessions = 4;
  cfg.turns = 5;
  cfg.system_tokens = 64;
  cfg.output_tokens = 9;
  cfg.seed = 3;
  auto jobs = agent_trace(cfg);
  for (const BenchJob& j : jobs) {
    for (size_t t = 0; t + 1 < j.size(); ++t) {
      EXPECT_TRUE(is_prefix(j[t].prompt, j[t + 1].prompt)) << "turn " << t;
      // The next turn adds the reply, a tool output and a user message: more than the reply.
      EXPECT_GT(j[t + 1].prompt.size(), j[t].prompt.size() + 9);
    }
    for (const BenchRequest& r : j) EXPECT_EQ(r.max_tokens, 9);
  }
  // All sessions share the system prompt, and differ after it.
  for (size_t s = 1; s < jobs.size(); ++s) {
    EXPECT_TRUE(
        std::equal(jobs[0][0].prompt.begin(), jobs[0][0].prompt.begin() + 64, jobs[s][0].prompt.begin()));
    EXPECT_NE(jobs[0][0].prompt, jobs[s][0].prompt);
  }
}

TEST(BenchServeWorkload, PoissonArrivalsHaveTheRequestedRate) {
  auto at = poisson_arrivals(20000, 50.0, 1);
  ASSERT_EQ(at.size(), 20000u);
  EXPECT_EQ(at[0], 0.0);
  for (size_t i = 1; i < at.size(); ++i) ASSERT_GE(at[i], at[i - 1]);
  const double mean_gap = at.back() / static_cast<double>(at.size() - 1);
  EXPECT_NEAR(mean_gap, 1.0 / 50.0, 0.001);
  const std::vector<double> first3(at.begin(), at.begin() + 3);
  EXPECT_EQ(poisson_arrivals(3, 50.0, 1), first3);                 // same seed: same schedule
  for (double a : poisson_arrivals(5, 0.0, 1)) EXPECT_EQ(a, 0.0);  // no rate: all at once
}

TEST(BenchServeWorkload, PercentileInterpolatesBetweenRanks) {
  EXPECT_EQ(percentile({}, 50), 0.0);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4}, 50), 2.5);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 90), 4.6);
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4, 5}, 100), 5.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
}

}  // namespace
}  // namespace ds41::cli::bench_serve
