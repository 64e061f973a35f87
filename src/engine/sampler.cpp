// ds41 engine: the sampler (rule in sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
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

  // Only as much of the (p desc, id asc) order is materialised as the rule reads: the kept
  // prefix is found by selection (nth_element) and sorted; without top_k / min_p the sorted
  // prefix grows geometrically until it holds the nucleus. The sums are taken in the same order
  // as a full sort would give, so the tokens are those of the full-sort rule, bit for bit.
  const size_t n = logits.size();
  const float mx = *std::max_element(logits.begin(), logits.end());
  cand_.resize(n);
  double sum = 0;  // in token order (kept as is: it decides the nucleus below)
  size_t positive = 0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp((logits[i] - mx) / params_.temperature);
    cand_[i] = {p, static_cast<int32_t>(i)};
    sum += p;
    positive += p > 0;
  }
  const auto first = cand_.begin();
  const auto by_prob = [](const Candidate& a, const Candidate& b) {
    return a.p > b.p || (a.p == b.p && a.id < b.id);
  };

  // Candidates: the first `cand` tokens of the order; zeros (-inf logits, underflows) are never
  // drawn; p_max = 1 (the largest logit) so at least one token stays.
  size_t cand = n;
  bool cut = false;
  if (params_.top_k > 0 && static_cast<uint64_t>(params_.top_k) < n) {
    cand = static_cast<size_t>(params_.top_k);
    cut = true;
  }
  cand = std::max<size_t>(1, std::min(cand, positive));
  if (params_.min_p > 0) {
    const double floor = params_.min_p;  // min_p * p_max, p_max = 1
    size_t above = 0;
    for (const Candidate& c : cand_) above += c.p >= floor;
    const size_t capped = std::max<size_t>(1, std::min(cand, above));
    cut = cut || capped < cand;
    cand = capped;
  }
  if (cand < n) std::nth_element(first, first + static_cast<ptrdiff_t>(cand - 1), cand_.end(), by_prob);

  size_t sorted = 0;  // cand_[0, sorted) is the order's prefix
  const auto sort_up_to = [&](size_t m) {
    m = std::min(m, cand);
    if (m <= sorted) return;
    if (m < cand)
      std::nth_element(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(m - 1),
                       first + static_cast<ptrdiff_t>(cand), by_prob);
    std::sort(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(m), by_prob);
    sorted = m;
  };
  if (cut) {  // the nucleus is a fraction of the mass top_k / min_p left, summed in order
    sort_up_to(cand);
    sum = 0;
    for (size_t i = 0; i < cand; ++i) sum += cand_[i].p;
  }

  // No truncation (top_p = 1, nothing cut): the draw's mass `acc` is the sum of every candidate
  // in order, which alone would need the whole order. It lies within a few ulps of `sum` (both
  // are recursive sums of the same n non-negative numbers: relative error <= n * 2^-53 each), so
  // the draw is bracketed by [r_lo, r_hi] (the same canonical value times the mass bounds), and
  // the walk, monotone in r, returns between walk(r_lo) and walk(r_hi): when both stop at the
  // same token (always but within ~1e-11 of a boundary) that is the full-order token, found
  // after sorting only the prefix walked. Otherwise the exact path below runs with the RNG
  // restored.
  if (!cut && params_.top_p == 1 && cand > 1) {
    const double g = static_cast<double>(n + 1) * 0x1p-51;
    const std::mt19937_64 saved = rng_;
    std::mt19937_64 hi_rng = rng_;
    double r_lo = std::uniform_real_distribution<double>(0.0, sum * (1 - g))(rng_);
    double r_hi = std::uniform_real_distribution<double>(0.0, sum * (1 + g))(hi_rng);
    double prefix = 0;  // the exact path's `acc` before token i
    for (size_t i = 0; i < cand && (i == 0 || prefix < sum); ++i) {
      if (i == sorted) sort_up_to(std::max<size_t>(64, 2 * sorted));
      const double p = cand_[i].p;
      r_lo -= p;
      r_hi -= p;
      prefix += p;
      if (r_hi <= 0) return cand_[i].id;  // r_lo <= r_hi: both stop here
      if (r_lo <= 0) break;               // the bracket straddles a boundary
    }
    rng_ = saved;
  }

  const double target = params_.top_p * sum;
  double acc = 0;
  size_t keep = 0;
  while (keep < cand && (keep == 0 || acc < target)) {
    if (keep == sorted) sort_up_to(std::max<size_t>(64, 2 * sorted));
    acc += cand_[keep++].p;
  }
  std::uniform_real_distribution<double> u(0.0, acc);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= cand_[i].p;
    if (r <= 0) return cand_[i].id;
  }
  return cand_[keep - 1].id;
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
