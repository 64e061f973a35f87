// ds41 gpu: the DSpark draft on the device (MODEL_SPEC 3.10.2-3.10.6) — the twin of
// src/model/dspark_context.cpp, dspark_attention.cpp and dspark_draft.cpp, op for op through the
// backends/cuda launchers the target forward uses:
//   - capture: during every target forward the streams entering each dspark_target_layer_ids layer
//     (after its Engram) averaged over the C streams (a collapse with weights 1/C), written into
//     column block `slot` of the feature rows [n, n_targets * H];
//   - commit: main_x = RMSNorm(main_proj . features; main_norm) and per stage the window row
//     Q_win(RoPE_p(RMSNorm(wkv . main_x; kv_norm))) (base rope_theta, no YaRN) packed into the
//     stage's ring of the sequence's slot, for committed positions only (the last `window` rows of
//     each item);
//   - draft: the B-position block [x_L, noise x (B-1)] through the stages (both mHC sites, block
//     attention over the stage's context rows max(first, L-W)..L-1 plus all B block rows — no causal
//     mask — and the E_d-expert top-k_d MoE without bias_vl), the collapse with the last FFN pre, the
//     draft's norm, the target head; then left to right the Markov term, the choice (greedy:
//     run_argmax_rows on the device, the lowest index on ties as the reference's argmax; a chooser:
//     z_k is copied back to the host) and the confidence head.
// Every buffer comes from enable_dspark's one allocation; nothing is allocated per step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "gpu/gpu_forward.h"

namespace ds41::gpu {

using cuda::FakeQuantOp;

namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

Status GpuForward::enable_dspark() {
  if (ds_.on) return ok_status();
  const model::ModelConfig& c = *c_;
  if (!m_->weights().dspark)
    return failed_precondition("DSpark: the checkpoint has no draft stages (num_nextn_predict_layers = 0)");
  const int64_t B = c.dspark_block_size, H = c.hidden_size, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t C = c.hc_mult, hd = c.head_dim, W = c.sliding_window, N = lim_.max_step_tokens;
  const int64_t S = lim_.max_step_seqs, nl = c.num_hidden_layers;
  const int64_t n_stages = static_cast<int64_t>(m_->weights().dspark->stages.size());
  if (c.dspark_n_routed_experts > c.n_routed_experts)
    return failed_precondition("DSpark: the draft's " + std::to_string(c.dspark_n_routed_experts) +
                               " experts exceed the target's " + std::to_string(c.n_routed_experts) +
                               " (the MoE workspace is sized for the target)");
  if (B + 1 > N) return invalid_argument("DSpark: max_step_tokens below the block size + 1");
  if (cuda::sparse_attention_workspace_bytes(N, c.num_attention_heads, hd, W + B) > ws_.scratch_bytes)
    return failed_precondition("DSpark: the attention scratch is too small for the draft block");
  Dspark& d = ds_;
  d.F = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * H;
  d.J = B + 1;
  d.max_draft_seqs = std::min(S, N / B);
  d.jrows = S * d.J;
  int64_t n_pend = 0;
  for (size_t j = 0; j < m_->kv_layout().sources.size(); ++j)
    n_pend += slots_->pending_index(static_cast<int64_t>(j)) >= 0;
  d.n_pend = n_pend;
  const int64_t rb = slots_->row_bytes(), nd = d.max_draft_seqs * B, Sd = d.max_draft_seqs;
  d.stage_stride = slots_->max_slots() * W * rb;
  // Carve: sizes in bytes, in order.
  const size_t f4 = sizeof(float);
  std::vector<std::pair<void**, size_t>> parts = {
      {reinterpret_cast<void**>(&d.feat), N * d.F * f4},
      {reinterpret_cast<void**>(&d.featg), N * d.F * f4},
      {reinterpret_cast<void**>(&d.main_x), N * H * f4},
      {reinterpret_cast<void**>(&d.kvd), N * hd * f4},
      {reinterpret_cast<void**>(&d.mean_w), N * C * f4},
      {reinterpret_cast<void**>(&d.rings), static_cast<size_t>(n_stages * d.stage_stride)},
      {reinterpret_cast<void**>(&d.U), nd * V * f4},
      {reinterpret_cast<void**>(&d.h), nd * H * f4},
      {reinterpret_cast<void**>(&d.hn), nd * H * f4},
      {reinterpret_cast<void**>(&d.me), Sd * R * f4},
      {reinterpret_cast<void**>(&d.mz), Sd * V * f4},
      {reinterpret_cast<void**>(&d.zk), Sd * V * f4},
      {reinterpret_cast<void**>(&d.hz), Sd * (H + R) * f4},
      {reinterpret_cast<void**>(&d.gamma), B * Sd * f4},
      {reinterpret_cast<void**>(&d.prev), Sd * sizeof(int32_t)},
      {reinterpret_cast<void**>(&d.cand), B * Sd * sizeof(int32_t)},
      {reinterpret_cast<void**>(&d.ring_save), static_cast<size_t>(S * nl * d.J * rb)},
      {reinterpret_cast<void**>(&d.pend_save), std::max<int64_t>(1, d.jrows * 2 * n_pend) * hd * f4},
      {reinterpret_cast<void**>(&d.jca), std::max<int64_t>(1, n_pend * d.jrows) * hd * f4},
      {reinterpret_cast<void**>(&d.jcb), std::max<int64_t>(1, n_pend * d.jrows) * hd * f4},
      {reinterpret_cast<void**>(&d.rscratch), std::max<int64_t>(1, d.jrows * 2 * n_pend) * hd * f4},
  };
  size_t total = 0;
  for (auto& p : parts) total += align256(p.second);
  DS41_ASSIGN_OR_RETURN(d.buf, DeviceBuffer::allocate(total, "the DSpark draft buffers"));
  uint8_t* at = d.buf.as<uint8_t>();
  for (auto& p : parts) {
    *p.first = at;
    at += align256(p.second);
  }
  DS41_ASSIGN_OR_RETURN(d.host, PinnedBuffer::allocate(align256(Sd * V * f4) + Sd * sizeof(int32_t),
                                                       "the DSpark host buffers"));
  d.zk_host = static_cast<float*>(d.host.data());
  d.prev_host = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(d.host.data()) + align256(Sd * V * f4));
  const std::vector<float> mean(N * C, 1.0f / static_cast<float>(C));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(d.mean_w, mean.data(), mean.size() * f4, cudaMemcpyHostToDevice, stream_),
      "upload the stream-mean weights"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemsetAsync(d.rings, 0, static_cast<size_t>(n_stages * d.stage_stride), stream_), "clear the draft rings"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(stream_), "enable DSpark"));
  d.on = true;
  return ok_status();
}

// MODEL_SPEC 3.10.2: [R] h.mean(dim=2) of the streams entering block l = a collapse with 1/C. The
// mean goes through ws_.x (free until this layer's attention-site collapse) into its column block.
Status GpuForward::capture_dspark_features(int64_t l) {
  const std::vector<int64_t>& ids = c_->dspark_target_layer_ids;
  const auto it = std::find(ids.begin(), ids.end(), l);
  if (it == ids.end()) return ok_status();
  const int64_t H = c_->hidden_size, C = c_->hc_mult, slot = it - ids.begin();
  DS41_RETURN_IF_ERROR(cuda::run_hc_collapse(ws_.streams, ds_.mean_w, n_, C, H, ws_.x, stream_));
  return cuda::cuda_status(cuda::copy_2d_async(ds_.feat + slot * H, ds_.F * sizeof(float), ws_.x, H * sizeof(float),
                                             H * sizeof(float), n_, cudaMemcpyDeviceToDevice, stream_),
                           "store the DSpark features");
}

Status GpuForward::dspark_commit(std::span<const GpuContextRows> rows) {
  if (!ds_.on) return failed_precondition("DSpark is not enabled on the GPU forward");
  const model::ModelConfig& c = *c_;
  const DeviceDspark& w = *m_->weights().dspark;
  const int64_t W = c.sliding_window, H = c.hidden_size, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<int64_t> idx, pos, off;
  for (const GpuContextRows& r : rows) {
    if (r.n <= 0) continue;
    GpuSequence& s = *r.seq;
    if (r.first_pos != s.draft_next) s.draft_next = s.draft_first = r.first_pos;  // restart (no rows before)
    const int64_t skip = std::max<int64_t>(0, r.n - W);
    for (int64_t i = skip; i < r.n; ++i) {
      idx.push_back(r.row_begin + i);
      pos.push_back(r.first_pos + i);
      off.push_back(slots_->ring_row_offset(s.slot, r.first_pos + i));
    }
  }
  const int64_t m = static_cast<int64_t>(idx.size());
  if (m > lim_.max_step_tokens) return internal_error("DSpark: more context rows than feature rows");
  ds_.main_x_rows = m;
  if (m > 0) {
    meta_off_ = 0;
    meta_overflow_ = false;
    const int64_t* d_idx = put(idx);
    const int64_t* d_pos = put(pos);
    const int64_t* d_off = put(off);
    if (meta_overflow_) return resource_exhausted("DSpark: context rows exceed the metadata arena");
    cudaStream_t st = stream_;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(ws_.meta_dev, ws_.meta_host, meta_off_, cudaMemcpyHostToDevice, st), "upload DSpark rows"));
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(ds_.feat, d_idx, m, ds_.F, ds_.featg, st));
    DS41_RETURN_IF_ERROR(linear(w.main_proj, ds_.featg, m, ds_.main_x));
    DS41_RETURN_IF_ERROR(cuda::run_rms_norm(ds_.main_x, m, H, w.main_norm.ptr, eps, ds_.main_x, st));
    const DeviceVec& inv = m_->rope_inv_freq(false);  // ratio-0 rule: base rope_theta, no YaRN
    for (size_t s = 0; s < w.stages.size(); ++s) {
      const DeviceLayer& sw = w.stages[s];
      DS41_RETURN_IF_ERROR(linear(sw.wkv, ds_.main_x, m, ds_.kvd));  // every stage reads the same main_x
      // norm, rotation, Q_win packing into the stage's ring: one launch
      DS41_RETURN_IF_ERROR(cuda::run_rows_norm_rope_quant(
          cuda::window_kv_rows(m, hd, ds_.kvd, sw.kv_norm.ptr, eps, d_pos, inv.ptr, inv.size,
                               ds_.rings + s * ds_.stage_stride, d_off, false),
          st));
    }
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st), "DSpark context rows"));
  }
  for (const GpuContextRows& r : rows)
    if (r.n > 0) r.seq->draft_next = r.first_pos + r.n;
  return ok_status();
}

Status GpuForward::draft_attention(int64_t s, const int64_t* ring_read, int64_t ctx_rows, const int64_t* kv_offsets,
                                   const int32_t* kv_index, const float* x, float* y,
                                   const cuda::HcExpandEpilogue* expand) {
  const DeviceLayer& w = m_->weights().dspark->stages[s];
  const int64_t n = n_, hd = c_->head_dim;
  const float eps = static_cast<float>(c_->rms_norm_eps);
  const DeviceVec& inv = m_->rope_inv_freq(false);
  cudaStream_t st = stream_;
  DS41_RETURN_IF_ERROR(linear(w.wq_a, x, n, ws_.q_r));
  DS41_RETURN_IF_ERROR(linear_normed(w.wq_b, ws_.q_r, n, ws_.q, w.q_norm.ptr));  // rotated in attention_output
  float* kv = ws_.kvf;  // block rows [0, n), then the decoded context rows
  DS41_RETURN_IF_ERROR(linear(w.wkv, x, n, kv));
  // norm, rotation, Q_win in place: one launch
  DS41_RETURN_IF_ERROR(cuda::run_rows_norm_rope_quant(
      cuda::window_kv_rows(n, hd, kv, w.kv_norm.ptr, eps, pos_, inv.ptr, inv.size, nullptr, nullptr, true), st));
  if (ctx_rows > 0)
    DS41_RETURN_IF_ERROR(cuda::run_decode_rows_gather(FakeQuantOp::kWin, hd, ds_.rings + s * ds_.stage_stride,
                                                      ring_read, ctx_rows, ws_.kvf + n * hd, st));
  return attention_output(w, n, kv_offsets, kv_index, c_->sliding_window + c_->dspark_block_size, inv, y, expand);
}

Status GpuForward::draft(std::span<const GpuDraftInput> batch, const GpuDraftOptions& opt,
                         std::vector<model::DraftOutput>* out) {
  if (!ds_.on) return failed_precondition("DSpark is not enabled on the GPU forward");
  const model::ModelConfig& c = *c_;
  const DeviceDspark& w = *m_->weights().dspark;
  const int64_t B = c.dspark_block_size, nb = static_cast<int64_t>(batch.size()), n = nb * B;
  const int64_t H = c.hidden_size, C = c.hc_mult, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t W = c.sliding_window, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  out->assign(nb, model::DraftOutput{});
  if (nb == 0) return ok_status();
  if (nb > ds_.max_draft_seqs)
    return invalid_argument("DSpark: " + std::to_string(nb) + " drafts in one call, the buffers hold " +
                            std::to_string(ds_.max_draft_seqs));
  for (int64_t b = 0; b < nb; ++b) {
    const GpuDraftInput& in = batch[b];
    const std::string what = "draft " + std::to_string(b);
    if (!in.seq) return invalid_argument(what + ": no sequence");
    if (in.anchor < 0 || in.anchor >= V)
      return invalid_argument(what + ": anchor token " + std::to_string(in.anchor) + " outside the vocabulary");
    if (in.seq->draft_next != in.seq->position)  // 3.10.4: rows for every q <= L-1 and none beyond
      return failed_precondition(what + ": anchor at position " + std::to_string(in.seq->position) +
                                 " but the draft context ends at " + std::to_string(in.seq->draft_next));
  }
  // Plan: ids, positions, context ring rows, the entry lists (context rows then the block's rows,
  // the same list for the B queries of a block, as dspark_attention.cpp).
  std::vector<int32_t> ids(n, static_cast<int32_t>(c.dspark_noise_token_id));
  std::vector<int64_t> pos(n), ring_read, offs(n + 1, 0), krow(nb);
  std::vector<int32_t> index;
  std::vector<int64_t> ctx_begin(nb), ctx_n(nb);
  for (int64_t b = 0; b < nb; ++b) {
    const GpuSequence& s = *batch[b].seq;
    const int64_t L = s.position, lo = std::max<int64_t>(s.draft_first, L - W);
    ids[b * B] = batch[b].anchor;
    for (int64_t j = 0; j < B; ++j) pos[b * B + j] = L + j;
    ctx_begin[b] = static_cast<int64_t>(ring_read.size());
    ctx_n[b] = L - lo;
    for (int64_t t = lo; t < L; ++t) ring_read.push_back(slots_->ring_row_offset(s.slot, t));
  }
  const int64_t ctx_rows = static_cast<int64_t>(ring_read.size());
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t j = 0; j < B; ++j) {
      for (int64_t t = 0; t < ctx_n[b]; ++t) index.push_back(static_cast<int32_t>(n + ctx_begin[b] + t));
      for (int64_t i = 0; i < B; ++i) index.push_back(static_cast<int32_t>(b * B + i));
      offs[b * B + j + 1] = static_cast<int64_t>(index.size());
    }
  std::vector<std::vector<int64_t>> rows_k(B, std::vector<int64_t>(nb));
  for (int64_t k = 0; k < B; ++k)
    for (int64_t b = 0; b < nb; ++b) rows_k[k][b] = b * B + k;
  n_ = n;
  row_invariant_ = false;  // the draft's rows propose only: the kernels of their shape
  meta_off_ = 0;
  meta_overflow_ = false;
  const int32_t* d_ids = put(ids);
  pos_ = put(pos);
  const int64_t* d_ring = put(ring_read);
  const int64_t* d_offs = put(offs);
  const int32_t* d_index = put(index);
  std::vector<const int64_t*> d_rows_k;
  for (int64_t k = 0; k < B; ++k) d_rows_k.push_back(put(rows_k[k]));
  if (meta_overflow_) return resource_exhausted("DSpark: the draft's metadata exceeds the arena");
  cudaStream_t st = stream_;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(ws_.meta_dev, ws_.meta_host, meta_off_, cudaMemcpyHostToDevice, st), "upload draft plan"));
  for (int64_t b = 0; b < nb; ++b) ds_.prev_host[b] = batch[b].anchor;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(ds_.prev, ds_.prev_host, nb * sizeof(int32_t), cudaMemcpyHostToDevice, st), "upload anchors"));

  // 3.10.4: embed, copy into every stream, pi = one-hot(0); the stages.
  DS41_RETURN_IF_ERROR(cuda::run_embed_bf16(m_->weights().embed, V, H, d_ids, n, ws_.x, st));
  float* pi = ws_.pi;
  float* pre_f = ws_.pre_f;
  DS41_RETURN_IF_ERROR(cuda::run_hc_init(ws_.x, n, C, H, ws_.streams, pi, st));
  for (size_t s = 0; s < w.stages.size(); ++s) {
    const DeviceLayer& sw = w.stages[s];
    // Each site: map, collapse with the lagged pre, norm: one launch (hc_site).
    DS41_RETURN_IF_ERROR(
        hc_site(sw.hc_attn, n, ws_.pre_a, ws_.post_a, ws_.comb_a, pi, sw.attn_norm.ptr, ws_.x));
    const cuda::HcExpandEpilogue expand{ws_.streams, ws_.post_a, ws_.comb_a, C};  // wo_b into the streams
    DS41_RETURN_IF_ERROR(draft_attention(static_cast<int64_t>(s), d_ring, ctx_rows, d_offs, d_index, ws_.x, ws_.y,
                                         &expand)
                             .with_context("DSpark stage " + std::to_string(s) + " attention"));
    DS41_RETURN_IF_ERROR(
        hc_site(sw.hc_ffn, n, pre_f, ws_.post_f, ws_.comb_f, ws_.pre_a, sw.ffn_norm.ptr, ws_.x));
    DS41_RETURN_IF_ERROR(moe_rows(sw, c.dspark_n_routed_experts, c.dspark_num_experts_per_tok, nullptr, ws_.x,
                                  ws_.y, ws_.post_f, ws_.comb_f)  // expands into the streams
                             .with_context("DSpark stage " + std::to_string(s) + " MoE"));
    std::swap(pi, pre_f);  // the next stage collapses with this FFN site's pre
    if (opt.record) {  // the block's KV rows (ws_.kvf rows [0, n), Q_win values) and the routing
      const int64_t kd = c.dspark_num_experts_per_tok;
      std::vector<float> kv(n * hd);
      std::vector<int32_t> ex(n * kd);
      DS41_RETURN_IF_ERROR(cuda::cuda_status(
          cudaMemcpyAsync(kv.data(), ws_.kvf, kv.size() * sizeof(float), cudaMemcpyDeviceToHost, st), "record block rows"));
      DS41_RETURN_IF_ERROR(cuda::cuda_status(
          cudaMemcpyAsync(ex.data(), ws_.experts, ex.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st),
          "record routing"));
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st), "record draft"));
      for (int64_t b = 0; b < nb; ++b) {
        (*out)[b].block_kv.emplace_back(kv.begin() + b * B * hd, kv.begin() + (b + 1) * B * hd);
        (*out)[b].router_experts.emplace_back(ex.begin() + b * B * kd, ex.begin() + (b + 1) * B * kd);
      }
    }
  }
  // Head: collapse with the last stage's FFN pre, the draft's final norm, the target's head.
  DS41_RETURN_IF_ERROR(cuda::run_hc_collapse(ws_.streams, pi, n, C, H, ds_.h, st));
  DS41_RETURN_IF_ERROR(cuda::run_rms_norm(ds_.h, n, H, w.norm.ptr, eps, ds_.hn, st));
  DS41_RETURN_IF_ERROR(linear(m_->weights().head, ds_.hn, n, ds_.U));
  if (opt.record) {
    for (int64_t b = 0; b < nb; ++b) {
      model::DraftOutput& o = (*out)[b];
      o.base_logits.resize(B * V);
      o.hidden.resize(B * H);
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(o.base_logits.data(), ds_.U + b * B * V,
                                                             B * V * sizeof(float), cudaMemcpyDeviceToHost, st),
                                             "copy draft logits"));
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(o.hidden.data(), ds_.h + b * B * H,
                                                             B * H * sizeof(float), cudaMemcpyDeviceToHost, st),
                                             "copy draft hidden"));
    }
  }
  // 3.10.5 left to right: e_k = markov.embed[prev_k], z_k = U_k + markov.head . e_k, c_k = choose(z_k),
  // gamma_k = proj . [h_k ; e_k], prev_{k+1} = c_k.
  for (auto& o : *out) {
    o.candidates.resize(B);
    o.confidence_logits.resize(B);
    o.confidence.resize(B);
  }
  // Greedy on the device: c_k = top-1 of z_k (the house tie order: lowest index on ties, as the
  // reference's argmax), no host round trip until the end. A chooser (sampling) gets z_k on the host.
  const size_t f4 = sizeof(float);
  const bool device_argmax = !opt.choose && cuda::argmax_workspace_bytes(nb, V) <= ws_.scratch_bytes;
  for (int64_t k = 0; k < B; ++k) {
    const int32_t* prev = k == 0 ? ds_.prev : ds_.cand + (k - 1) * nb;
    DS41_RETURN_IF_ERROR(cuda::run_embed_bf16(w.markov_embed.data, V, R, prev, nb, ds_.me, st));
    DS41_RETURN_IF_ERROR(linear(w.markov_head, ds_.me, nb, ds_.mz));
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(ds_.U, d_rows_k[k], nb, V, ds_.zk, st));
    DS41_RETURN_IF_ERROR(cuda::run_add_inplace(ds_.zk, ds_.mz, nb * V, st));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpy2DAsync(ds_.hz, (H + R) * f4, ds_.h + k * H, B * H * f4, H * f4, nb, cudaMemcpyDeviceToDevice, st),
        "confidence input"));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpy2DAsync(ds_.hz + H, (H + R) * f4, ds_.me, R * f4, R * f4, nb, cudaMemcpyDeviceToDevice, st),
        "confidence input"));
    DS41_RETURN_IF_ERROR(linear(w.confidence_proj, ds_.hz, nb, ds_.gamma + k * nb));
    if (device_argmax) {
      DS41_RETURN_IF_ERROR(cuda::run_argmax_rows(ds_.zk, nb, V, ds_.cand + k * nb, ws_.scratch, st));
      continue;
    }
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(ds_.zk_host, ds_.zk, nb * V * f4, cudaMemcpyDeviceToHost, st), "copy draft logits"));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st), "draft step"));
    for (int64_t b = 0; b < nb; ++b) {
      std::span<const float> z(ds_.zk_host + b * V, static_cast<size_t>(V));
      int32_t ck = 0;
      if (opt.choose) {
        ck = opt.choose(b, k, z);
        if (ck < 0 || ck >= V) return internal_error("draft chooser returned a token outside the vocabulary");
      } else {
        for (int64_t v = 1; v < V; ++v)
          if (z[v] > z[ck]) ck = static_cast<int32_t>(v);
      }
      ds_.prev_host[b] = ck;
    }
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(ds_.cand + k * nb, ds_.prev_host, nb * sizeof(int32_t), cudaMemcpyHostToDevice, st),
        "upload draft tokens"));
    // The pinned prev_host is rewritten at the next position: wait for this upload.
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st), "draft step"));
  }
  std::vector<int32_t> cand(B * nb);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(cand.data(), ds_.cand, cand.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st),
      "copy candidates"));
  std::vector<float> gamma(B * nb);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(gamma.data(), ds_.gamma, gamma.size() * f4, cudaMemcpyDeviceToHost, st), "copy confidences"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(st), "draft step"));
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t k = 0; k < B; ++k) {
      const float g = gamma[k * nb + b];
      (*out)[b].candidates[k] = cand[k * nb + b];
      (*out)[b].confidence_logits[k] = g;
      (*out)[b].confidence[k] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(g))));
    }
  return ok_status();
}

Status GpuForward::copy_draft_rings(int32_t src, int32_t dst) {
  if (!ds_.on) return ok_status();
  const int64_t bytes = c_->sliding_window * slots_->row_bytes();
  const int64_t n_stages = static_cast<int64_t>(m_->weights().dspark->stages.size());
  for (int64_t s = 0; s < n_stages; ++s) {
    uint8_t* base = ds_.rings + s * ds_.stage_stride;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(base + slots_->ring_row_offset(dst, 0), base + slots_->ring_row_offset(src, 0),
                        static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_),
        "copy the draft rings"));
  }
  return ok_status();
}

Status GpuForward::download_draft_rows(const GpuSequence& seq, int64_t s, int64_t first, int64_t n,
                                       std::vector<uint8_t>* out) {
  if (!ds_.on) return failed_precondition("DSpark is not enabled on the GPU forward");
  const int64_t rb = slots_->row_bytes();
  out->assign(static_cast<size_t>(n * rb), 0);
  for (int64_t i = 0; i < n; ++i)
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(out->data() + i * rb, ds_.rings + s * ds_.stage_stride + slots_->ring_row_offset(seq.slot, first + i),
                        static_cast<size_t>(rb), cudaMemcpyDeviceToHost, stream_),
        "download draft rows"));
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "download draft rows");
}

Status GpuForward::download_features(int64_t row_begin, int64_t n, std::vector<float>* out) {
  if (!ds_.on) return failed_precondition("DSpark is not enabled on the GPU forward");
  out->assign(static_cast<size_t>(n * ds_.F), 0.0f);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(out->data(), ds_.feat + row_begin * ds_.F,
                                                         out->size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                                         "download features"));
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "download features");
}

Status GpuForward::download_main_x(int64_t n, std::vector<float>* out) {
  if (!ds_.on) return failed_precondition("DSpark is not enabled on the GPU forward");
  if (n < 0 || n > ds_.main_x_rows)
    return out_of_range("DSpark: " + std::to_string(n) + " main_x rows asked, the last commit computed " +
                        std::to_string(ds_.main_x_rows));
  const int64_t H = c_->hidden_size;
  out->assign(static_cast<size_t>(n * H), 0.0f);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(out->data(), ds_.main_x, out->size() * sizeof(float), cudaMemcpyDeviceToHost, stream_),
      "download main_x"));
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "download main_x");
}

}  // namespace ds41::gpu
