// ds41 model: the DSpark draft step (MODEL_SPEC 3.10.4-3.10.6). Block of B positions L..L+B-1
// with ids [x_L, noise x (B-1)], embedded and copied into the C streams with pi = (1, 0, ..);
// the stages in order, each the block schedule of 3.3 (attention site collapsing with the
// incoming pi, FFN site with the attention site's pre; the stage hands its FFN pre on) with the
// block attention (dspark_attention.cpp) and the E_d-expert top-k_d MoE (text bias only); then
// h_k = collapse(S, pi_final), U_k = head . RMSNorm(h_k; norm). Left to right: e_k =
// markov.embed[prev_k], z_k = U_k + markov.head . e_k, c_k = choose(z_k), gamma_k = proj .
// [h_k ; e_k], q_k = sigmoid(gamma_k), prev_{k+1} = c_k (prev_0 = x_L).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/hc_site.h"
#include "model/dspark.h"
#include "model/forward_pass.h"

namespace ds41::model {
Status Dspark::draft(std::span<const DraftInput> batch, const DraftOptions& opt,
                     std::vector<DraftOutput>* out) const {
  const ModelConfig& c = m_->config();
  const DsparkWeights& w = *m_->dspark_weights();
  ops::Backend& be = m_->backend();
  const int64_t B = c.dspark_block_size, nb = static_cast<int64_t>(batch.size()), n = nb * B;
  const int64_t H = c.hidden_size, C = c.hc_mult, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t kd = c.dspark_num_experts_per_tok;
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t b = 0; b < nb; ++b) {
    const DraftInput& in = batch[b];
    const std::string what = "draft " + std::to_string(b);
    if (!in.state || !in.state->dspark)
      return failed_precondition(what + ": the sequence has no draft state");
    if (in.anchor < 0 || in.anchor >= V)
      return invalid_argument(what + ": anchor token " + std::to_string(in.anchor) +
                              " outside the vocabulary");
    // 3.10.4 precondition: rows w_s[q] exist for every q <= L-1 (and none beyond).
    if (in.state->dspark->next_position() != in.pos)
      return failed_precondition(what + ": anchor at position " + std::to_string(in.pos) +
                                 " but the draft context ends at " +
                                 std::to_string(in.state->dspark->next_position()));
  }
  out->assign(nb, DraftOutput{});
  if (nb == 0) return ok_status();

  std::vector<int32_t> ids(n, static_cast<int32_t>(c.dspark_noise_token_id));
  std::vector<int64_t> pos(n);
  for (int64_t b = 0; b < nb; ++b) {
    ids[b * B] = batch[b].anchor;
    for (int64_t j = 0; j < B; ++j) pos[b * B + j] = batch[b].pos + j;
  }
  std::vector<float> e(n * H), streams(n * C * H), pi(n * C, 0.0f);
  be.embed_bf16(m_->weights().embed, V, H, ids.data(), n, e.data());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < C; ++j) std::memcpy(&streams[(r * C + j) * H], &e[r * H], H * sizeof(float));
    pi[r * C] = 1.0f;
  }
  auto site_map = [&](const HcSiteWeights& hw, std::vector<float>& pre, std::vector<float>& post,
                      std::vector<float>& comb) { hc_site_map(be, c, hw, streams.data(), n, &pre, &post, &comb); };
  std::vector<float> pre_a, post_a, comb_a, pre_f, post_f, comb_f, x(n * H), y(n * H), kv_rec, wts(n * kd);
  std::vector<int32_t> experts(n * kd);
  for (int64_t s = 0; s < w.n_stages(); ++s) {
    const LayerWeights& sw = w.stages[s];
    site_map(sw.hc_attn, pre_a, post_a, comb_a);
    be.hc_collapse(streams.data(), pi.data(), n, C, H, x.data());
    be.rms_norm(x.data(), n, H, sw.attn_norm.data(), eps, x.data());
    if (opt.record) kv_rec.resize(n * c.head_dim);
    stage_attention(s, batch, x.data(), pos.data(), y.data(), opt.record ? kv_rec.data() : nullptr);
    be.hc_expand(streams.data(), y.data(), post_a.data(), comb_a.data(), n, C, H);
    site_map(sw.hc_ffn, pre_f, post_f, comb_f);
    be.hc_collapse(streams.data(), pre_a.data(), n, C, H, x.data());
    be.rms_norm(x.data(), n, H, sw.ffn_norm.data(), eps, x.data());
    moe_forward(be, c, sw, c.dspark_n_routed_experts, kd, x.data(), n, nullptr, y.data(), experts.data(),
                wts.data());  // drafts are text: never bias_vl
    be.hc_expand(streams.data(), y.data(), post_f.data(), comb_f.data(), n, C, H);
    pi = pre_f;
    if (opt.record)
      for (int64_t b = 0; b < nb; ++b) {
        (*out)[b].block_kv.emplace_back(kv_rec.begin() + b * B * c.head_dim,
                                        kv_rec.begin() + (b + 1) * B * c.head_dim);
        (*out)[b].router_experts.emplace_back(experts.begin() + b * B * kd,
                                              experts.begin() + (b + 1) * B * kd);
      }
  }
  // Head: collapse with the last stage's FFN pre, the draft's final norm, the target's head.
  std::vector<float> h(n * H), hn(n * H), U(n * V);
  be.hc_collapse(streams.data(), pi.data(), n, C, H, h.data());
  be.rms_norm(h.data(), n, H, w.norm.data(), eps, hn.data());
  be.linear(m_->weights().head, hn.data(), n, U.data());

  // 3.10.5 left to right per anchor.
  std::vector<float> me(R), mz(V), hz(H + R);
  for (int64_t b = 0; b < nb; ++b) {
    DraftOutput& o = (*out)[b];
    o.candidates.resize(B);
    o.confidence_logits.resize(B);
    o.confidence.resize(B);
    if (opt.keep_logits) o.z.resize(B * V);
    if (opt.record) {
      o.base_logits.assign(U.begin() + b * B * V, U.begin() + (b + 1) * B * V);
      o.hidden.assign(h.begin() + b * B * H, h.begin() + (b + 1) * B * H);
    }
    int32_t prev = batch[b].anchor;
    std::vector<float> z(V);
    for (int64_t k = 0; k < B; ++k) {
      const int64_t r = b * B + k;
      be.embed_bf16(w.markov_embed, V, R, &prev, 1, me.data());
      be.linear(w.markov_head, me.data(), 1, mz.data());
      for (int64_t v = 0; v < V; ++v) z[v] = U[r * V + v] + mz[v];
      const int32_t ck = opt.choose ? opt.choose(b, k, z) : argmax_lowest(z);
      DS41_CHECK(ck >= 0 && ck < V, "draft chooser returned a token outside the vocabulary");
      // gamma_k = proj . [h_k ; e_k]: the pre-norm hidden first, then the embedding of prev_k.
      std::memcpy(hz.data(), &h[r * H], H * sizeof(float));
      std::memcpy(hz.data() + H, me.data(), R * sizeof(float));
      float gamma = 0;
      be.linear(w.confidence_proj, hz.data(), 1, &gamma);
      o.candidates[k] = ck;
      o.confidence_logits[k] = gamma;
      o.confidence[k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(gamma))));
      if (opt.keep_logits) std::copy(z.begin(), z.end(), o.z.begin() + k * V);
      prev = ck;
    }
  }
  return ok_status();
}

}  // namespace ds41::model
