// Test support: Pearson's chi-square goodness of fit for sampler tests (issue 17's "the
// distribution of outputs matches the target": speculative rejection sampling on the CPU reference
// and on the GPU engine).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace ds41::testing {

// Chi-square critical value at alpha = 1e-3 (Wilson-Hilferty): a correct sampler fails 1 in 1000.
inline double chi2_crit(int64_t df) {
  const double z = 3.0902, d = static_cast<double>(df);
  const double t = 1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d));
  return d * t * t * t;
}

// Pearson chi-square of counts against probabilities over n draws; bins with expected < 5 are
// pooled into one. Returns (statistic, degrees of freedom).
inline std::pair<double, int64_t> chi2(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                                       int64_t n) {
  double stat = 0, pool_e = 0;
  int64_t pool_o = 0, bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5) {
      pool_e += e;
      pool_o += counts[i];
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++bins;
  }
  if (pool_e > 0) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / std::max(pool_e, 1e-9);
    ++bins;
  }
  return {stat, bins - 1};
}

}  // namespace ds41::testing
