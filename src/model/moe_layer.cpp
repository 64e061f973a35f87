// ds41 model: the MoE sublayer (MODEL_SPEC 3.5): sqrt-softplus router with the bias used for
// selection only (bias_vl inside image spans), normalised weights x routed_scaling_factor,
// routed experts with the two clamps and the routing weight applied before w2, shared expert.
// moe_forward() is shared by the text layers and the DSpark stages (3.10.4: E_d experts, top-k_d).
#include <algorithm>
#include <vector>

#include "model/forward_pass.h"

namespace ds41::model {

void ForwardPass::moe(int64_t l, const float* x, float* y) {
  const int64_t k = c_.num_experts_per_tok;
  std::vector<float> wts(n_ * k);
  std::vector<int32_t> experts(n_ * k);
  moe_forward(be_, c_, m_.weights().layers[l], c_.n_routed_experts, k, x, n_, any_vl_ ? vl_.data() : nullptr,
              y, experts.data(), wts.data());
  if (opt_.record)
    for (size_t s = 0; s < seqs_.size(); ++s) {
      records_[s].router_experts[l].assign(&experts[seqs_[s].begin * k], &experts[seqs_[s].end * k]);
      records_[s].router_weights[l].assign(&wts[seqs_[s].begin * k], &wts[seqs_[s].end * k]);
    }
}

void moe_forward(ops::Backend& be, const ModelConfig& c, const LayerWeights& w, int64_t E, int64_t k,
                 const float* x, int64_t n, const uint8_t* vl, float* y, int32_t* experts, float* wts) {
  const int64_t H = c.hidden_size;
  const int64_t I = c.moe_intermediate_size;
  const float lim = static_cast<float>(c.swiglu_limit);
  std::vector<float> logits(n * E);
  be.linear(w.gate, x, n, logits.data());
  be.router(logits.data(), n, E, w.gate_bias.data(), w.gate_bias_vl.data(), vl, k,
            static_cast<float>(c.gate_temp), static_cast<float>(c.routed_scaling_factor), experts, wts);
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
    be.linear(ew.w1, xs.data(), m, g.data());
    be.linear(ew.w3, xs.data(), m, u.data());
    be.swiglu(g.data(), u.data(), m, I, lim, scale_of[e].data(), a.data());
    be.linear(ew.w2, a.data(), m, out.data());
    be.scatter_add_rows(out.data(), rows_of[e].data(), m, H, y);
  }
  if (w.shared.w1.present()) {
    const int64_t Is = w.shared.w1.out_dim;
    g.resize(n * Is);
    u.resize(n * Is);
    a.resize(n * Is);
    out.resize(n * H);
    be.linear(w.shared.w1, x, n, g.data());
    be.linear(w.shared.w3, x, n, u.data());
    be.swiglu(g.data(), u.data(), n, Is, lim, nullptr, a.data());
    be.linear(w.shared.w2, a.data(), n, out.data());
    for (int64_t i = 0; i < n * H; ++i) y[i] += out[i];
  }
}

}  // namespace ds41::model
