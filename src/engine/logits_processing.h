// ds41 engine: logits processing before sampling — penalties and log-probabilities.
//   - presence / frequency penalties (OpenAI semantics) over the tokens generated so far:
//     logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0);
//   - repetition penalty (HF / vLLM semantics) over prompt + generated tokens:
//     logit[t] = logit[t] > 0 ? logit[t] / p : logit[t] * p;
//   - log-softmax (fp64 sum) and the top-N log-probabilities (N <= 20, ties by lower id),
//     computed from the processed logits (after penalties, before temperature / truncation: what
//     the model with the request's penalties says, independent of the sampling knobs).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace ds41::engine {

constexpr int kMaxTopLogprobs = 20;

// Per-request penalty bookkeeping. Cheap when no penalty is set (nothing is tracked).
class PenaltyState {
 public:
  PenaltyState() = default;
  // `prompt` token ids must lie in [0, vocab).
  PenaltyState(const SamplingParams& p, std::span<const int32_t> prompt, int64_t vocab);
  bool active() const { return repetition_ || presence_ != 0 || frequency_ != 0; }
  // Records a generated token.
  void add(int32_t token);
  // Applies the penalties to one logits row in place.
  void apply(float* logits, int64_t vocab) const;

 private:
  bool repetition_ = false;
  double rep_ = 1.0, presence_ = 0.0, frequency_ = 0.0;
  std::vector<uint8_t> seen_;                   // prompt + generated (repetition penalty)
  std::unordered_map<int32_t, int64_t> count_;  // generated (presence / frequency)
};

// log_softmax(logits)[token], and when top_n > 0 the top_n entries (largest first, ties by lower
// id) in *top. top_n is clamped to [0, min(kMaxTopLogprobs, vocab)].
float token_logprob(const float* logits, int64_t vocab, int32_t token, int top_n,
                    std::vector<TopLogprob>* top);

}  // namespace ds41::engine
