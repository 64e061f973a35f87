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
  // One branch-free pass for the maximum and the validity of the row; the offending index is
  // looked up only when the row is invalid.
  float mx = -INFINITY;
  bool bad = false;
  for (const float v : logits) {
    bad |= !(v < INFINITY);  // NaN or +inf
    mx = v > mx ? v : mx;
  }
  if (bad)
    for (size_t i = 0; i < logits.size(); ++i)
      if (!(logits[i] < INFINITY))
        return invalid_argument("sampler: logit " + std::to_string(i) + " is " + std::to_string(logits[i]) +
                                " (NaN and +inf are not valid logits)");
  if (mx == -INFINITY) return invalid_argument("sampler: every logit is -inf");
  if (params_.temperature == 0) return argmax_token(logits);

  // The (p desc, id asc) order is materialised lazily: one pass computes every p (and the sum in
  // token order, which the rule uses as is) and counts the tokens per bucket of 1/16 octave of p
  // (bucket order = p descending, so every token of a bucket precedes every token of the next one
  // in the full order). Buckets are placed into cand_ (a counting sort) only when the rule reads
  // into them — the first read places the buckets of at least 4096 tokens, a later one the rest,
  // so at most two more passes — and each is sorted by (p desc, id asc) when read. cand_[0,
  // sorted) is therefore always the full sort's prefix, bit for bit, at O(vocab) plus the sorting
  // of the buckets the rule reads.
  const size_t n = logits.size();
  prob_.resize(n);
  bucket_.resize(n);
  bucket_start_.assign(kBuckets + 1, 0);
  double sum = 0;  // in token order (kept as is: it decides the nucleus below)
  size_t positive = 0;
  const double temp = params_.temperature;
  const bool unit_temp = temp == 1.0;  // x / 1.0 == x exactly: the division is skipped
  for (size_t i = 0; i < n; ++i) {
    const double x = logits[i] - mx;
    const double p = std::exp(unit_temp ? x : x / temp);
    prob_[i] = p;
    sum += p;
    positive += p > 0;
    const auto b = static_cast<uint16_t>(bucket_of(p));
    bucket_[i] = b;
    ++bucket_start_[b + 1];
  }
  for (size_t b = 0; b < kBuckets; ++b) bucket_start_[b + 1] += bucket_start_[b];
  cand_.resize(n);
  size_t placed = 0;  // buckets [0, placed) are in cand_ at their bucket_start_ offsets
  const auto place_through = [&](size_t end_bucket) {
    if (end_bucket <= placed) return;
    bucket_fill_.assign(bucket_start_.begin(), bucket_start_.end() - 1);
    for (size_t i = 0; i < n; ++i) {
      const size_t b = bucket_[i];
      if (b >= placed && b < end_bucket) cand_[bucket_fill_[b]++] = {prob_[i], static_cast<int32_t>(i)};
    }
    placed = end_bucket;
  };
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
    for (const double p : prob_) above += p >= floor;
    const size_t capped = std::max<size_t>(1, std::min(cand, above));
    cut = cut || capped < cand;
    cand = capped;
  }
  size_t sorted = 0;  // cand_[0, sorted) is the order's prefix (whole buckets)
  size_t next_bucket = 0;
  const auto sort_up_to = [&](size_t m) {
    m = std::min(m, cand);
    if (m <= sorted) return;
    size_t end_bucket = next_bucket;
    while (end_bucket < kBuckets && bucket_start_[end_bucket] < m) ++end_bucket;
    if (placed == 0) {  // the first read places at least 4096 tokens' worth of buckets
      while (end_bucket < kBuckets && bucket_start_[end_bucket] < std::min<size_t>(n, 4096)) ++end_bucket;
      place_through(end_bucket);
    } else {
      place_through(kBuckets);
    }
    for (; next_bucket < end_bucket; ++next_bucket) {
      const size_t b0 = bucket_start_[next_bucket], b1 = bucket_start_[next_bucket + 1];
      if (b1 - b0 > 1)
        std::sort(first + static_cast<ptrdiff_t>(b0), first + static_cast<ptrdiff_t>(b1), by_prob);
      sorted = b1;
    }
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
