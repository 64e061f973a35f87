// ds41 engine: the sampler (rule in sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace ds41::engine {

Status validate_sampling_params(const SamplerParams& p) {
  // Written as !(in range) so that NaN fails every check.
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    return invalid_argument("temperature must be a finite number >= 0 (0 = greedy), got " +
                            std::to_string(p.temperature));
  if (!(p.top_p > 0 && p.top_p <= 1))
    return invalid_argument("top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (p.top_k < 0) return invalid_argument("top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.min_p >= 0 && p.min_p <= 1))
    return invalid_argument("min_p must be in [0, 1] (0 = off), got " + std::to_string(p.min_p));
  return ok_status();
}

int32_t argmax_token(std::span<const float> logits) {
  // std::max_element returns the first of equal maxima: the lowest index.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Result<Sampler> Sampler::create(const SamplerParams& params) {
  DS41_RETURN_IF_ERROR(validate_sampling_params(params));
  return Sampler(params);
}

Result<int32_t> Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) return invalid_argument("sampler: empty logits row");
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v) || v == INFINITY)
      return invalid_argument("sampler: logit " + std::to_string(i) + " is " + std::to_string(v) +
                              " (NaN and +inf are not valid logits)");
    any_finite = any_finite || std::isfinite(v);
  }
  if (!any_finite) return invalid_argument("sampler: every logit is -inf");
  if (params_.temperature == 0) return argmax_token(logits);

  const size_t n = logits.size();
  const float mx = *std::max_element(logits.begin(), logits.end());
  prob_.resize(n);
  double sum = 0;  // in token order (kept as is: it decides the nucleus below)
  for (size_t i = 0; i < n; ++i) sum += prob_[i] = std::exp((logits[i] - mx) / params_.temperature);

  // Candidates: tokens with p > 0 (-inf logits and underflows are never drawn), by descending
  // p, ties by lower index; top_k needs only the first k of that total order.
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  const auto by_prob = [this](int32_t a, int32_t b) {
    return prob_[a] > prob_[b] || (prob_[a] == prob_[b] && a < b);
  };
  size_t cand = n;
  if (params_.top_k > 0 && static_cast<uint64_t>(params_.top_k) < n) {
    cand = static_cast<size_t>(params_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(cand), order_.end(), by_prob);
  } else {
    std::sort(order_.begin(), order_.end(), by_prob);
  }
  bool cut = cand < n;
  while (cand > 1 && prob_[order_[cand - 1]] == 0) --cand;  // zeros add nothing to `sum`
  if (params_.min_p > 0) {
    // p_max = prob_[order_[0]] = 1 (the largest logit); the first token always stays.
    const double floor = params_.min_p * prob_[order_[0]];
    const size_t before = cand;
    while (cand > 1 && prob_[order_[cand - 1]] < floor) --cand;
    cut = cut || cand < before;
  }
  if (cut) {  // the nucleus is a fraction of the mass top_k / min_p left
    sum = 0;
    for (size_t i = 0; i < cand; ++i) sum += prob_[order_[i]];
  }

  double acc = 0;
  size_t keep = 0;
  while (keep < cand && (keep == 0 || acc < params_.top_p * sum)) acc += prob_[order_[keep++]];
  std::uniform_real_distribution<double> u(0.0, acc);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= prob_[order_[i]];
    if (r <= 0) return order_[i];
  }
  return order_[keep - 1];
}

SamplerParams sampler_params(const SamplingParams& request, uint64_t seed) {
  SamplerParams p;
  p.temperature = request.temperature;
  p.top_p = request.top_p;
  p.top_k = request.top_k;
  p.min_p = request.min_p;
  p.seed = seed;
  return p;
}

}  // namespace ds41::engine
