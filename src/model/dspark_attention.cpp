// ds41 model: the attention of a DSpark stage over one draft block (MODEL_SPEC 3.10.4): 3.4.2-3.4.8
// of a window-only layer (q_norm, every head, the sink, inverse rotation of the output, grouped
// wo_a, wo_b; base rope_theta, no YaRN) with the block's own KV rows k_j at positions L+j, where
// every block query attends to the same set: the stage's context rows of positions
// max(0, L-W)..L-1 plus all B block rows — bidirectional inside the block, no causal mask and no
// per-query sliding ([R] get_dspark_topk_idxs; MODEL_SPEC 3.10.10). Block rows are never stored.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "model/dspark.h"
#include "quant/fake_quant.h"

namespace ds41::model {

void Dspark::stage_attention(int64_t s, std::span<const DraftInput> batch, const float* x, const int64_t* pos,
                             float* y, float* block_kv) const {
  const ModelConfig& c = m_->config();
  const LayerWeights& w = m_->dspark_weights()->stages[s];
  ops::Backend& be = m_->backend();
  const int64_t B = c.dspark_block_size, nb = static_cast<int64_t>(batch.size()), n = nb * B;
  const int64_t nh = c.num_attention_heads, hd = c.head_dim, qr = c.q_lora_rank, W = c.sliding_window;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const std::vector<float>& inv = m_->rope_inv_freq(false);
  const int64_t nf = static_cast<int64_t>(inv.size());

  std::vector<float> q_r(n * qr), q(n * nh * hd), kv(n * hd);
  be.linear(w.wq_a, x, n, q_r.data());
  be.rms_norm(q_r.data(), n, qr, w.q_norm.data(), eps, q_r.data());
  be.linear(w.wq_b, q_r.data(), n, q.data());
  be.rope(q.data(), n, nh, hd, pos, inv.data(), nf, false);
  be.linear(w.wkv, x, n, kv.data());
  be.rms_norm(kv.data(), n, hd, w.kv_norm.data(), eps, kv.data());
  be.rope(kv.data(), n, 1, hd, pos, inv.data(), nf, false);
  for (int64_t r = 0; r < n; ++r) quant::q_win_inplace(&kv[r * hd], hd);
  if (block_kv) std::copy(kv.begin(), kv.end(), block_kv);

  // Entry sets: the context rows of the anchor's sequence (decoded once per sequence), then
  // the block's rows; the same list for all B queries of a block.
  std::vector<std::vector<float>> ctx(nb);
  std::vector<int64_t> offs(n + 1, 0);
  std::vector<const float*> ptrs;
  for (int64_t b = 0; b < nb; ++b) {
    const DraftInput& in = batch[b];
    const DsparkState& ds = *in.state->dspark;
    const int64_t lo = std::max<int64_t>(ds.first_position(), in.pos - W);
    ctx[b].resize((in.pos - lo) * hd);
    for (int64_t t = lo; t < in.pos; ++t) quant::q_win_decode(ds.row(s, t), hd, &ctx[b][(t - lo) * hd]);
    for (int64_t j = 0; j < B; ++j) {
      const int64_t r = b * B + j;
      for (int64_t t = 0; t < in.pos - lo; ++t) ptrs.push_back(&ctx[b][t * hd]);
      for (int64_t i = 0; i < B; ++i) ptrs.push_back(&kv[(b * B + i) * hd]);
      offs[r + 1] = static_cast<int64_t>(ptrs.size());
    }
  }
  std::vector<float> o(n * nh * hd);
  ops::AttentionArgs a;
  a.n = n;
  a.n_heads = nh;
  a.head_dim = hd;
  a.q = q.data();
  a.kv_offsets = offs.data();
  a.kv = ptrs.data();
  a.sink = w.attn_sink.data();
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.out = o.data();
  be.attention(a);
  be.rope(o.data(), n, nh, hd, pos, inv.data(), nf, true);
  std::vector<float> z(n * c.o_groups * c.o_lora_rank);
  be.grouped_linear(w.wo_a, c.o_groups, o.data(), n, z.data());
  be.linear(w.wo_b, z.data(), n, y);
}

}  // namespace ds41::model
