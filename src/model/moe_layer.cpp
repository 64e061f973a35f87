// ds41 model: the MoE sublayer (MODEL_SPEC 3.5): sqrt-softplus router with the bias used for
// selection only (bias_vl inside image spans), normalised weights x routed_scaling_factor,
// routed experts with the two clamps and the routing weight applied before w2, shared expert.
#include <vector>

#include "model/forward_pass.h"

namespace ds41::model {

void ForwardPass::moe(int64_t l, const float* x, float* y) {
  const LayerWeights& w = m_.weights().layers[l];
  const int64_t n = n_, H = c_.hidden_size, E = c_.n_routed_experts, k = c_.num_experts_per_tok;
  const int64_t I = c_.moe_intermediate_size;
  const float lim = static_cast<float>(c_.swiglu_limit);
  std::vector<float> logits(n * E), wts(n * k);
  std::vector<int32_t> experts(n * k);
  be_.linear(w.gate, x, n, logits.data());
  be_.router(logits.data(), n, E, w.gate_bias.data(), w.gate_bias_vl.data(), any_vl_ ? vl_.data() : nullptr,
             k, static_cast<float>(c_.gate_temp), static_cast<float>(c_.routed_scaling_factor),
             experts.data(), wts.data());
  if (opt_.record)
    for (size_t s = 0; s < seqs_.size(); ++s) {
      records_[s].router_experts[l].assign(&experts[seqs_[s].begin * k], &experts[seqs_[s].end * k]);
      records_[s].router_weights[l].assign(&wts[seqs_[s].begin * k], &wts[seqs_[s].end * k]);
    }
  std::fill(y, y + n * H, 0.0f);
  // Rows per expert (in row order), then one batched pass per used expert.
  std::vector<std::vector<int64_t>> rows_of(E);
  std::vector<std::vector<float>> scale_of(E);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < k; ++j) {
      rows_of[experts[r * k + j]].push_back(r);
      scale_of[experts[r * k + j]].push_back(wts[r * k + j]);
    }
  std::vector<float> xs, g, u, a, out;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = static_cast<int64_t>(rows_of[e].size());
    if (m == 0) continue;
    xs.resize(m * H);
    for (int64_t i = 0; i < m; ++i) std::copy(x + rows_of[e][i] * H, x + (rows_of[e][i] + 1) * H, &xs[i * H]);
    g.resize(m * I);
    u.resize(m * I);
    a.resize(m * I);
    out.resize(m * H);
    const ExpertWeights& ew = w.experts[e];
    be_.linear(ew.w1, xs.data(), m, g.data());
    be_.linear(ew.w3, xs.data(), m, u.data());
    be_.swiglu(g.data(), u.data(), m, I, lim, scale_of[e].data(), a.data());
    be_.linear(ew.w2, a.data(), m, out.data());
    be_.scatter_add_rows(out.data(), rows_of[e].data(), m, H, y);
  }
  if (w.shared.w1.present()) {
    const int64_t Is = w.shared.w1.out_dim;
    g.resize(n * Is);
    u.resize(n * Is);
    a.resize(n * Is);
    out.resize(n * H);
    be_.linear(w.shared.w1, x, n, g.data());
    be_.linear(w.shared.w3, x, n, u.data());
    be_.swiglu(g.data(), u.data(), n, Is, lim, nullptr, a.data());
    be_.linear(w.shared.w2, a.data(), n, out.data());
    for (int64_t i = 0; i < n * H; ++i) y[i] += out[i];
  }
}

}  // namespace ds41::model
