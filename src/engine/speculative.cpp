// ds41 engine: speculative decoding rules (speculative.h; MODEL_SPEC 3.10.6-3.10.9).
#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "engine/sampler.h"

namespace ds41::engine {

Acceptance accept_greedy(std::span<const int32_t> candidates, std::span<const float> target_logits,
                         int64_t vocab) {
  const int64_t l = static_cast<int64_t>(candidates.size());
  DS41_CHECK_EQ(static_cast<int64_t>(target_logits.size()), (l + 1) * vocab, "verification rows");
  Acceptance a;
  while (a.accepted < l &&
         candidates[a.accepted] == argmax_token(target_logits.subspan(a.accepted * vocab, vocab)))
    ++a.accepted;
  a.bonus = argmax_token(target_logits.subspan(a.accepted * vocab, vocab));
  return a;
}

Acceptance accept_greedy_argmax(std::span<const int32_t> candidates, std::span<const int32_t> row_argmax) {
  const int64_t l = static_cast<int64_t>(candidates.size());
  DS41_CHECK_EQ(static_cast<int64_t>(row_argmax.size()), l + 1, "verification rows");
  Acceptance a;
  while (a.accepted < l && candidates[a.accepted] == row_argmax[a.accepted]) ++a.accepted;
  a.bonus = row_argmax[a.accepted];
  return a;
}

std::vector<double> tempered_probs(std::span<const float> logits, double temperature) {
  DS41_CHECK(temperature > 0, "tempered_probs: temperature must be positive");
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - mx) / temperature);
    sum += p[i];
  }
  for (double& v : p) v /= sum;
  return p;
}

int32_t draw_from(std::span<const double> probs, std::mt19937_64& rng) {
  double sum = 0;
  for (double v : probs) sum += v;
  DS41_CHECK(sum > 0, "draw_from: no probability mass");
  const double u = std::uniform_real_distribution<double>(0.0, sum)(rng);
  double acc = 0;
  int32_t last = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0) continue;
    acc += probs[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;  // u rounded onto the total
}

Acceptance accept_sampled(std::span<const int32_t> candidates, std::span<const double> draft_probs,
                          std::span<const double> target_probs, int64_t vocab, std::mt19937_64& rng) {
  const int64_t l = static_cast<int64_t>(candidates.size());
  DS41_CHECK_EQ(static_cast<int64_t>(draft_probs.size()), l * vocab, "draft rows");
  DS41_CHECK_EQ(static_cast<int64_t>(target_probs.size()), (l + 1) * vocab, "verification rows");
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  Acceptance a;
  for (int64_t k = 0; k < l; ++k) {
    const double* p = &draft_probs[k * vocab];
    const double* P = &target_probs[k * vocab];
    const int32_t c = candidates[k];
    const double pc = p[c], Pc = P[c];
    // Accept with min(1, P/p): u < P/p  <=>  u * p < P (no division; p > 0 since c was drawn from p).
    if (uni(rng) * pc < Pc) {
      ++a.accepted;
      continue;
    }
    std::vector<double> resid(vocab);
    double mass = 0;
    for (int64_t v = 0; v < vocab; ++v) mass += (resid[v] = std::max(0.0, P[v] - p[v]));
    // mass == 0 only when P == p (then rejection has probability 0); fall back to P itself.
    a.bonus = mass > 0 ? draw_from(resid, rng) : draw_from(std::span<const double>(P, vocab), rng);
    return a;
  }
  a.bonus = draw_from(target_probs.subspan(l * vocab, vocab), rng);
  return a;
}

std::vector<double> prefix_survival(std::span<const float> confidence) {
  std::vector<double> s(confidence.size());
  double acc = 1.0;
  for (size_t i = 0; i < confidence.size(); ++i) s[i] = acc *= static_cast<double>(confidence[i]);
  return s;
}

int64_t verify_length(std::span<const float> confidence, double theta) {
  const std::vector<double> s = prefix_survival(confidence);
  int64_t l = 0;
  for (size_t j = 0; j < s.size(); ++j)
    if (s[j] >= theta) l = static_cast<int64_t>(j) + 1;
  return l;
}

std::vector<int64_t> schedule_verify_lengths(const std::vector<std::vector<double>>& survival,
                                             int64_t budget) {
  struct Pair {
    double s;
    size_t r, j;
  };
  std::vector<Pair> pairs;
  for (size_t r = 0; r < survival.size(); ++r)
    for (size_t j = 0; j < survival[r].size(); ++j) pairs.push_back({survival[r][j], r, j});
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) { return a.s > b.s; });
  std::vector<int64_t> len(survival.size(), 0);
  const size_t take = static_cast<size_t>(std::clamp<int64_t>(budget, 0, static_cast<int64_t>(pairs.size())));
  // s_j is non-increasing in j, so the admitted pairs of a sequence form a prefix; count them
  // as a prefix anyway (equal survivals may admit j before j-1 only if both are admitted).
  std::vector<int64_t> count(survival.size(), 0);
  for (size_t i = 0; i < take; ++i) ++count[pairs[i].r];
  for (size_t r = 0; r < survival.size(); ++r) len[r] = count[r];
  return len;
}

std::vector<int64_t> budget_verify_lengths(const std::vector<std::vector<float>>& confidence,
                                           std::span<const int64_t> cap, int64_t budget) {
  DS41_CHECK_EQ(confidence.size(), cap.size(), "budget_verify_lengths: one cap per sequence");
  std::vector<int64_t> len(cap.begin(), cap.end());
  if (budget < 0) return len;
  std::vector<std::vector<double>> survival(confidence.size());
  for (size_t r = 0; r < confidence.size(); ++r) {
    DS41_CHECK(cap[r] >= 0 && cap[r] <= static_cast<int64_t>(confidence[r].size()),
               "budget_verify_lengths: cap outside the drafted block");
    survival[r] = prefix_survival(std::span<const float>(confidence[r]).first(static_cast<size_t>(cap[r])));
  }
  return schedule_verify_lengths(survival, budget);
}

void AcceptanceStats::add(int64_t accepted, int64_t block) {
  if (static_cast<int64_t>(counts.size()) < block + 1) counts.resize(block + 1, 0);
  ++counts[std::clamp<int64_t>(accepted, 0, block)];
  ++steps;
  tokens += accepted + 1;
}

}  // namespace ds41::engine
