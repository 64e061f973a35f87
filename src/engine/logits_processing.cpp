// ds41 engine: logits processing (logits_processing.h).
#include "engine/logits_processing.h"

#include <algorithm>
#include <cmath>

namespace ds41::engine {

PenaltyState::PenaltyState(const SamplingParams& p, std::span<const int32_t> prompt, int64_t vocab)
    : repetition_(p.repetition_penalty != 1.0),
      rep_(p.repetition_penalty),
      presence_(p.presence_penalty),
      frequency_(p.frequency_penalty) {
  if (repetition_) {
    seen_.assign(vocab, 0);
    for (int32_t t : prompt) seen_[t] = 1;
  }
}

void PenaltyState::add(int32_t token) {
  if (repetition_ && token >= 0 && token < static_cast<int32_t>(seen_.size())) seen_[token] = 1;
  if (presence_ != 0 || frequency_ != 0) ++count_[token];
}

void PenaltyState::apply(float* logits, int64_t vocab) const {
  if (repetition_)
    for (int64_t t = 0; t < vocab; ++t)
      if (seen_[t])
        logits[t] =
            logits[t] > 0 ? static_cast<float>(logits[t] / rep_) : static_cast<float>(logits[t] * rep_);
  if (presence_ != 0 || frequency_ != 0)
    for (const auto& [t, n] : count_)
      if (t >= 0 && t < vocab)
        logits[t] -= static_cast<float>(frequency_ * static_cast<double>(n) + presence_);
}

float token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n,
                    std::vector<TopLogprob>* top) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t t = 0; t < vocab; ++t) sum += std::exp(static_cast<double>(logits[t]) - mx);
  const double lse = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](int64_t t) { return static_cast<float>(static_cast<double>(logits[t]) - lse); };
  top_n = static_cast<int>(std::clamp<int64_t>(top_n, 0, std::min<int64_t>(kMaxTopLogprobs, vocab)));
  if (top && top_n > 0) {
    // Keep the best top_n ids in a small sorted buffer: larger logit first, then lower id.
    std::vector<int32_t> best;
    best.reserve(top_n + 1);
    auto better = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    for (int64_t t = 0; t < vocab; ++t) {
      const int32_t id = static_cast<int32_t>(t);
      if (static_cast<int>(best.size()) == top_n && !better(id, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), id, better), id);
      if (static_cast<int>(best.size()) > top_n) best.pop_back();
    }
    top->clear();
    for (int32_t id : best) top->push_back({id, lp(id)});
  }
  return (token >= 0 && token < vocab) ? lp(token) : -INFINITY;
}

}  // namespace ds41::engine
