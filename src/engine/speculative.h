// ds41 engine: the rules of speculative decoding with DSpark drafts (MODEL_SPEC 3.10.6-3.10.7,
// 3.10.9), as pure functions over logits rows — no model, no state:
//   - greedy acceptance: a = the largest j <= l with c_i = argmax T_i for every i < j; the bonus
//     is argmax T_a;
//   - speculative rejection sampling (T > 0): accept c_k with probability
//     min(1, P_T(c_k) / p_k(c_k)); at the first rejection draw the bonus from
//     norm(max(0, P_T - p_k)); after l acceptances from P_T of row l. The output distribution of
//     every position equals the target's (vLLM's generic rejection sampler; [R] ships none);
//   - confidence scheduling: prefix survival s_j = prod_{i<=j} q_i; for one sequence the verify
//     length is l = max{j+1 : s_j >= theta}; for a batch the best `budget` (sequence, j) pairs by
//     survival (stable), which gives every sequence a prefix.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace ds41::engine {

struct Acceptance {
  int64_t accepted = 0;  // a: candidates committed
  int32_t bonus = -1;    // the token for position L + a + 1
};

// target_logits: [l + 1, V] rows T_0..T_l of the verification forward; candidates: c_0..c_{l-1}.
Acceptance accept_greedy(std::span<const int32_t> candidates, std::span<const float> target_logits,
                         int64_t vocab);
// The same rule over rows already reduced on the device: row_argmax[k] = argmax_token(T_k), k = 0..l
// (the GPU verification's GpuForwardOptions::argmax; no logits rows cross to the host).
Acceptance accept_greedy_argmax(std::span<const int32_t> candidates, std::span<const int32_t> row_argmax);

// softmax(logits / temperature) in fp64 (temperature > 0), relative to the row maximum.
std::vector<double> tempered_probs(std::span<const float> logits, double temperature);

// draft_probs: [l, V] p_k; target_probs: [l + 1, V] P_T rows. Draws from rng (two uniforms per
// step at most: the acceptance test and the residual draw).
Acceptance accept_sampled(std::span<const int32_t> candidates, std::span<const double> draft_probs,
                          std::span<const double> target_probs, int64_t vocab, std::mt19937_64& rng);

// A draw from probs (need not be normalised; all >= 0, sum > 0).
int32_t draw_from(std::span<const double> probs, std::mt19937_64& rng);

// prefix survival s_j = prod_{i <= j} q_i (fp64 product, as the golden walk.survival).
std::vector<double> prefix_survival(std::span<const float> confidence);
// Single sequence (MODEL_SPEC 3.10.9): l = max{j + 1 : s_j >= theta}, 0 when s_0 < theta.
int64_t verify_length(std::span<const float> confidence, double theta);
// Batch: survival[r] holds sequence r's s_0..s_{B-1}; the first `budget` (r, j) pairs by s_j
// descending (stable: lower r, then lower j first) are admitted; returns l_r per sequence.
std::vector<int64_t> schedule_verify_lengths(const std::vector<std::vector<double>>& survival,
                                             int64_t budget);
// One engine step's verify lengths under a batch budget (what Engine::speculative_step applies):
// confidence[r] holds sequence r's q_0..q_{B-1} (empty: r drafted nothing), cap[r] its own limit
// (the request's verify_len / threshold, <= confidence[r].size()). budget < 0: every sequence
// verifies its cap; else schedule_verify_lengths over the survivals cut to the caps, so
// l_r <= cap[r] and sum l_r <= budget.
std::vector<int64_t> budget_verify_lengths(const std::vector<std::vector<float>>& confidence,
                                           std::span<const int64_t> cap, int64_t budget);

// Accepted-length histogram and mean (for /metrics and bench): counts[a] for a = 0..B.
struct AcceptanceStats {
  std::vector<int64_t> counts;
  int64_t steps = 0;
  int64_t tokens = 0;  // a + 1 per step
  void add(int64_t accepted, int64_t block);
  double mean_accepted() const { return steps ? static_cast<double>(tokens - steps) / steps : 0.0; }
  double tokens_per_step() const { return steps ? static_cast<double>(tokens) / steps : 0.0; }
};

}  // namespace ds41::engine
