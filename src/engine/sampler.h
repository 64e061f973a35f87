// ds41 engine: the sampler — turns one logits row into the next token id. The one sampler of
// the project (`ds41 generate` and the server both use it).
//
// Rule, in this order (all probabilities in fp64, relative to the row's largest logit):
//   temperature == 0      greedy: the largest logit, lowest index among equal maxima.
//   otherwise             p_i = exp((logit_i - max) / temperature), tokens ordered by p
//                         descending, ties by lower index; then
//     top_k > 0           keep the first top_k tokens of that order;
//     min_p > 0           keep tokens with p_i >= min_p * p_max (p_max = 1);
//     top_p < 1           keep the shortest prefix whose mass reaches top_p of what is left
//                         (always at least one token);
//                         and draw from the kept tokens in proportion to p_i with the
//                         sampler's own mt19937_64 seeded by `seed`.
// Cost: O(vocab) (one exp per token and a counting sort into 1/16-octave buckets of p) plus
// sorting the buckets the rule reads: the kept tokens (top_k / min_p), the nucleus (top_p < 1),
// or, with top_p = 1 and nothing cut, the prefix the draw walks.
// The same params and the same sequence of rows give the same tokens (the draw is one
// std::uniform_real_distribution<double> value over the kept mass, walked in the order above;
// mt19937_64 is fully specified, the distribution is the standard library's).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/request.h"

namespace ds41::engine {

// The draw rule's parameters (a subset of the request's SamplerParams, request.h, with the
// seed resolved).
struct SamplerParams {
  double temperature = 0.0;  // >= 0, finite; 0 = greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // >= 0; 0 = off
  double min_p = 0.0;        // [0, 1]; 0 = off
  uint64_t seed = 0;
};

// InvalidArgument naming the parameter and the accepted range, else ok.
Status validate_sampling_params(const SamplerParams& p);

// The draw rule of a request's params, with `seed` (the request's own, or one from the loop's
// seed source) as the RNG seed.
SamplerParams sampler_params(const SamplingParams& request, uint64_t seed);

// Index of the largest logit, the lowest index among equal maxima (the house tie rule).
// Precondition: logits is not empty and holds no NaN.
int32_t argmax_token(std::span<const float> logits);

// Not thread-safe: one Sampler per sequence (it owns the RNG stream and scratch buffers).
class Sampler {
 public:
  // InvalidArgument for params outside their ranges (validate_sampling_params).
  static Result<Sampler> create(const SamplerParams& params);

  // The next token for this row. InvalidArgument for an empty row, a NaN or +inf logit, or a
  // row with no finite logit (-inf marks a forbidden token and is never drawn unless sampling
  // is greedy and every other logit is -inf as well, which is rejected).
  Result<int32_t> sample(std::span<const float> logits);

  const SamplerParams& params() const { return params_; }

 private:
  explicit Sampler(const SamplerParams& p) : params_(p), rng_(p.seed) {}

  SamplerParams params_;
  std::mt19937_64 rng_;
  struct Candidate {
    double p;  // unnormalized probability
    int32_t id;
  };
  // Buckets of the lazy order: 1/16 octave of p each for p in [2^-127, 1] (128 octaves), then
  // one bucket for 0 < p < 2^-127 and one for p == 0. Index ascending = p descending.
  static constexpr size_t kBuckets = 128 * 16 + 2;
  static size_t bucket_of(double p) {
    if (!(p > 0)) return kBuckets - 1;
    uint64_t bits;
    std::memcpy(&bits, &p, sizeof bits);
    const uint64_t e = bits >> 52;  // biased exponent, <= 1023 for p <= 1
    if (e + 127 < 1023) return kBuckets - 2;
    return static_cast<size_t>((1023 - e) * 16 + (15 - ((bits >> 48) & 15)));
  }
  // Scratch: every token's p in token order; cand_ the tokens in bucket order, sorted by
  // (p desc, id asc) bucket by bucket as sample() reads into them.
  std::vector<double> prob_;
  std::vector<uint16_t> bucket_;  // bucket_of(prob_[i])
  std::vector<size_t> bucket_start_, bucket_fill_;
  std::vector<Candidate> cand_;
};

}  // namespace ds41::engine
