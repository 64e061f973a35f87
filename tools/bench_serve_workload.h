// ds41 bench serve: the request workloads (random prompts, a multi-turn agent trace), Poisson
// arrival times and latency percentiles. Library-free (std only) and deterministic for a seed on
// every platform (own generator and distributions, not <random>'s implementation-defined ones), so
// the same --seed replays the same token ids against any server. Header-only (tools/ compiles only
// main.cpp and cmd_*.cpp); unit-tested in tests/unit/tools.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ds41::cli::bench_serve {

// splitmix64: a tiny, well-mixed generator whose output is fixed by its definition.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [lo, hi) (hi > lo); the tiny modulo bias is irrelevant for token ids.
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo));
  }

 private:
  uint64_t s_;
};

// Token ids are drawn from [lo, hi): ordinary vocabulary entries, away from the special tokens at
// either end of the vocabulary.
struct TokenRange {
  int32_t lo = 1000, hi = 30000;
};

struct BenchRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;  // generated exactly (ignore_eos)
};

// A job is what one client runs back to back: one request (random workload) or one agent session
// (its turns in order; turn k+1 is sent when turn k finished).
using BenchJob = std::vector<BenchRequest>;

inline std::vector<int32_t> random_tokens(SplitMix64& rng, int64_t n, TokenRange r) {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(0, n)));
  for (int32_t& t : out) t = static_cast<int32_t>(rng.range(r.lo, r.hi));
  return out;
}

// `n` jobs of one request each: `input_len` random token ids, `output_len` tokens to generate.
inline std::vector<BenchJob> random_workload(int64_t n, int64_t input_len, int64_t output_len, uint64_t seed,
                                             TokenRange r = {}) {
  SplitMix64 rng(seed);
  std::vector<BenchJob> jobs;
  for (int64_t i = 0; i < n; ++i)
    jobs.push_back({BenchRequest{random_tokens(rng, input_len, r), output_len}});
  return jobs;
}

// A multi-turn agent trace with growing shared prefixes:
//   - every session starts with the same system prompt (`system_tokens`, shared across sessions,
//     as an agent's instructions and tool schemas are);
//   - turn 0 appends a first user message; every later turn appends the previous turn's assistant
//     reply (`output_tokens` placeholder ids: the trace is fixed before any server answers), a tool
//     output (`tool_tokens`) and a new user message (`user_tokens`);
//   - so turn k's prompt is a strict prefix of turn k+1's, and all sessions share the system prompt.
// Lengths vary by +-`jitter` (a fraction) per segment, drawn from the seed.
struct AgentTraceConfig {
  int64_t sessions = 16;
  int64_t turns = 4;
  int64_t system_tokens = 256;
  int64_t user_tokens = 32;
  int64_t tool_tokens = 128;
  int64_t output_tokens = 32;
  double jitter = 0.25;
  uint64_t seed = 0;
  TokenRange range;
};

inline int64_t jittered(SplitMix64& rng, int64_t n, double jitter) {
  if (n <= 0) return 0;
  const double f = 1.0 + jitter * (2.0 * rng.uniform() - 1.0);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(n) * f)));
}

inline std::vector<BenchJob> agent_trace(const AgentTraceConfig& c) {
  SplitMix64 rng(c.seed);
  const std::vector<int32_t> system = random_tokens(rng, c.system_tokens, c.range);
  std::vector<BenchJob> jobs;
  for (int64_t s = 0; s < c.sessions; ++s) {
    BenchJob job;
    std::vector<int32_t> conv = system;
    for (int64_t t = 0; t < c.turns; ++t) {
      if (t > 0) {
        const std::vector<int32_t> reply = random_tokens(rng, c.output_tokens, c.range);
        const std::vector<int32_t> tool = random_tokens(rng, jittered(rng, c.tool_tokens, c.jitter), c.range);
        conv.insert(conv.end(), reply.begin(), reply.end());
        conv.insert(conv.end(), tool.begin(), tool.end());
      }
      const std::vector<int32_t> user = random_tokens(rng, jittered(rng, c.user_tokens, c.jitter), c.range);
      conv.insert(conv.end(), user.begin(), user.end());
      job.push_back(BenchRequest{conv, c.output_tokens});
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// Arrival offsets (seconds from the start) of `n` jobs: a Poisson process of `rate` per second
// (exponential gaps), or all at 0 when rate is infinite or <= 0 (the concurrency cap paces them).
inline std::vector<double> poisson_arrivals(int64_t n, double rate, uint64_t seed) {
  std::vector<double> at(static_cast<size_t>(std::max<int64_t>(0, n)), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return at;
  SplitMix64 rng(seed ^ 0xA5A5A5A5DEADBEEFull);
  double t = 0;
  for (double& a : at) {
    a = t;
    t += -std::log1p(-rng.uniform()) / rate;
  }
  return at;
}

// The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default);
// 0 for an empty sample.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  const size_t j = std::min(i + 1, v.size() - 1);
  return v[i] + (v[j] - v[i]) * (pos - static_cast<double>(i));
}

}  // namespace ds41::cli::bench_serve
