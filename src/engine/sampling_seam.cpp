// ds41 engine: the sampling seam (sampling_seam.h).
#include "engine/sampling_seam.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ds41::engine {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng) {
  const int32_t argmax = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  if (p.temperature <= 0 || p.top_k == 1) return argmax;
  const double mx = logits[argmax];
  // min_p keeps p >= min_p * p_max, i.e. logit >= max + T * log(min_p): a cheap filter first.
  const double floor = p.min_p > 0 ? mx + p.temperature * std::log(p.min_p) : -INFINITY;
  std::vector<int32_t> cand;
  cand.reserve(vocab);
  for (int64_t t = 0; t < vocab; ++t)
    if (logits[t] >= floor || t == argmax) cand.push_back(static_cast<int32_t>(t));
  // Larger logit first, ties by lower id; only needed when top_k or top_p truncates.
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (p.top_k > 0 && p.top_k < static_cast<int64_t>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + p.top_k, cand.end(), better);
    cand.resize(p.top_k);
  } else if (p.top_p < 1.0) {
    std::sort(cand.begin(), cand.end(), better);
  }
  std::vector<double> w(cand.size());
  double total = 0;
  for (size_t i = 0; i < cand.size(); ++i)
    total += w[i] = std::exp((static_cast<double>(logits[cand[i]]) - mx) / p.temperature);
  size_t keep = cand.size();
  if (p.top_p < 1.0) {  // smallest prefix (descending) whose mass reaches top_p
    double acc = 0;
    size_t k = 0;
    while (k < keep && (k == 0 || acc < p.top_p * total)) acc += w[k++];
    keep = k;
    total = acc;
  }
  // 53 random bits -> [0, 1): the same draw on every platform for the same rng state.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += w[i];
    if (u < acc) return cand[i];
  }
  return cand[keep - 1];
}

}  // namespace ds41::engine
