// ds41 gpu: GpuWorkspace sizing (gpu_workspace.h).
#include "gpu/gpu_workspace.h"

#include <algorithm>
#include <string>

#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/topk_kernels.h"

namespace ds41::gpu {
namespace {

constexpr size_t kWorkspaceAlign = 256;

int64_t min_ratio(const model::LayerSchedule& s) {
  int64_t r = 0;
  for (const model::LayerPlan& p : s.layers)
    if (p.ratio > 0) r = r == 0 ? p.ratio : std::min(r, p.ratio);
  return r;
}

int64_t max_ratio(const model::LayerSchedule& s) {
  int64_t r = 1;
  for (const model::LayerPlan& p : s.layers) r = std::max(r, p.ratio);
  return r;
}

// Two passes: sizes first (base == nullptr), then pointers.
struct Carver {
  uint8_t* base = nullptr;
  size_t off = 0;
  template <class T>
  void take(T*& p, int64_t count) {
    off = (off + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    p = base ? reinterpret_cast<T*>(base + off) : nullptr;
    off += static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
  }
};

}  // namespace

GpuLimits resolve_limits(const model::ModelConfig& c, const model::LayerSchedule& s, GpuLimits l) {
  if (l.max_context <= 0) l.max_context = std::min<int64_t>(c.max_position_embeddings, 131072);
  l.max_context = std::min(l.max_context, c.max_position_embeddings);
  if (l.max_logit_rows <= 0) l.max_logit_rows = l.max_step_seqs;
  const int64_t r = min_ratio(s);
  if (l.max_step_key_rows <= 0)
    l.max_step_key_rows =
        r == 0 ? 0 : std::min<int64_t>(l.max_step_seqs * (l.max_context / r + 1), int64_t{1} << 22);
  return l;
}

Result<GpuWorkspace> create_workspace(const DeviceModel& m, const GpuLimits& lim) {
  const model::ModelConfig& c = m.config();
  const model::LayerSchedule& s = m.schedule();
  const int64_t N = lim.max_step_tokens, S = lim.max_step_seqs, L = lim.max_logit_rows;
  const int64_t C = c.hc_mult, H = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t W = c.sliding_window, K = c.index_topk, nih = c.index_n_heads, dI = c.index_head_dim;
  const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size;
  const int64_t V = c.vocab_size, R = max_ratio(s), G = N + S, KR = lim.max_step_key_rows;
  const int64_t mr = min_ratio(s);
  const int64_t TS = mr == 0 ? 0 : lim.max_context / mr + 1;
  int64_t Is = 0;
  for (const DeviceLayer& dl : m.weights().layers) Is = std::max(Is, dl.shared.w1.out_dim);
  int64_t cols = 0, ed = c.engram_head_dim;
  if (m.hasher()) cols = m.hasher()->n_cols();

  GpuWorkspace w;
  w.ts_max = TS;
  if (lim.numerics != quant::ActNumerics::kExact) {
    // The widest input of an FP8 / FP4 linear over N rows (x, q_r, the attention output into wo_a, z into
    // wo_b, the shared expert's act, Engram rows, DSpark's concatenated features), and the routed experts'
    // w2 input (N * k rows of I).
    const int64_t kd = std::max(k, c.dspark_num_experts_per_tok);
    const int64_t kmax = std::max({H, c.q_lora_rank, nh * hd, c.o_groups * c.o_lora_rank, Is, cols * ed,
                                   c.num_nextn_predict_layers > 0 ? 3 * H : int64_t{0}});
    w.xq_elems = std::max(N * kmax, N * kd * I);
  }
  w.kvf_rows = N + S * W + N * K;
  w.scratch_bytes =
      std::max({cuda::topk_workspace_bytes(N, std::max<int64_t>(TS, 1), std::max<int64_t>(K, 1)),
                c.candidate_block_size > 0
                    ? cuda::candidate_pool_workspace_bytes(N, std::max<int64_t>(TS, 1),
                                                           c.candidate_block_size, c.candidate_topk_blocks)
                    : size_t{0},
                cuda::moe_bucket_workspace_bytes(N, k, E), cuda::hc_map_workspace_bytes(N, C, H),
                cuda::sparse_attention_workspace_bytes(N, nh, hd, W + K),
                // GpuForwardOptions::argmax: the reduction's workspace, then one token per logits row
                (cuda::argmax_workspace_bytes(std::max<int64_t>(L, 1), V) + 255) / 256 * 256 +
                    static_cast<size_t>(std::max<int64_t>(L, 1)) * sizeof(int32_t),
                size_t{1}});
  auto carve = [&](Carver& cv) {
    cv.take(w.streams, N * C * H);
    for (float** p : {&w.pi, &w.pre_a, &w.post_a, &w.pre_f, &w.post_f}) cv.take(*p, N * C);
    cv.take(w.comb_a, N * C * C);
    cv.take(w.comb_f, N * C * C);
    cv.take(w.x, N * H);
    cv.take(w.y, N * H);
    cv.take(w.q_r, N * c.q_lora_rank);
    cv.take(w.q, N * nh * hd);
    cv.take(w.o, N * nh * hd);
    cv.take(w.z, N * c.o_groups * c.o_lora_rank);
    cv.take(w.kvf, w.kvf_rows * hd);
    cv.take(w.kv_offsets, N + 1);
    cv.take(w.kv_index, N * (W + K));
    cv.take(w.sel_offsets, N * K);
    cv.take(w.ca, N * hd);
    cv.take(w.cb, N * hd);
    cv.take(w.ga, G * R * hd);
    cv.take(w.gb, G * R * hd);
    cv.take(w.zs, G * hd);
    cv.take(w.u, G * hd);
    cv.take(w.e, G * hd);
    cv.take(w.kk, G * dI);
    cv.take(w.qi, N * nih * dI);
    cv.take(w.wt, N * nih);
    cv.take(w.keys, KR * dI);
    cv.take(w.key_offsets, KR);
    cv.take(w.scores, N * TS);
    cv.take(w.sel, N * K);
    cv.take(w.cand, N * TS);
    cv.take(w.gate_logits, N * E);
    cv.take(w.route_w, N * k);
    cv.take(w.perm_weight, N * k);
    cv.take(w.experts, N * k);
    cv.take(w.offsets, E + 1);
    cv.take(w.perm_rows, N * k);
    cv.take(w.slot_pos, N * k);
    cv.take(w.xs, N * k * H);
    cv.take(w.g, N * k * I);
    cv.take(w.up, N * k * I);
    cv.take(w.act, N * k * I);
    cv.take(w.out_perm, N * k * H);
    cv.take(w.sg, N * Is);
    cv.take(w.su, N * Is);
    cv.take(w.sa, N * Is);
    cv.take(w.sout, N * H);
    cv.take(w.erows, N * cols * ed);
    cv.take(w.ez, N * (C + 1) * H);
    cv.take(w.gates, N * C);
    cv.take(w.hs, L * C * H);
    cv.take(w.hp, L * C);
    cv.take(w.h, L * H);
    cv.take(w.logits, L * V);
    cv.take(w.xq, w.xq_elems);
    // One array for the main stream's fused kernels (hc_site, the router, the attention's split
    // combine: self-resetting, in stream order), sized for the largest.
    w.counters_size = std::max(cuda::hc_site_counter_count(N), cuda::sparse_attention_counter_count(N, nh));
    cv.take(w.counters, w.counters_size);
    cv.take(w.hc_counters, w.counters_size);
    w.hc_scratch_bytes = cuda::hc_map_workspace_bytes(N, C, H);
    uint8_t* hs = nullptr;
    cv.take(hs, static_cast<int64_t>(w.hc_scratch_bytes));
    w.hc_scratch = hs;
    uint8_t* sc = nullptr;
    cv.take(sc, static_cast<int64_t>(w.scratch_bytes));
    w.scratch = sc;
  };
  Carver sizer;
  carve(sizer);
  w.device_bytes = sizer.off;
  DS41_ASSIGN_OR_RETURN(
      w.dev, DeviceBuffer::allocate(w.device_bytes,
                                    "GPU engine workspace (max_step_tokens " + std::to_string(N) + ")"));
  Carver cv;
  cv.base = w.dev.as<uint8_t>();
  carve(cv);
  for (uint32_t* c : {w.counters, w.hc_counters})
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemset(c, 0, static_cast<size_t>(w.counters_size) * sizeof(uint32_t)),
                                           "zero the fused-kernel counters"));
  // Metadata: a generous bound of what the step plan writes (rows, window lists, per source and
  // per index layer lists, page tables); the plan checks that it fits.
  const int64_t n_layers = c.num_hidden_layers;
  const int64_t pages_per_seq = lim.max_context / 16 + 4;
  w.meta_bytes = static_cast<size_t>(
      N * (4 + 8 + 4 + 8 + 8 + 4 * W + 1 + 8 +  // ... image-span flags and rows
           8 * std::max<int64_t>(1, static_cast<int64_t>(c.engram_layer_ids.size())) *
               std::max<int64_t>(cols, 1)) +
      S * W * 8 + L * 8 +
      n_layers * (G * R * 16 + G * 8 * 3 + N * 16 + S * (pages_per_seq * 4 + 24) + N * 24 + 64 * kWorkspaceAlign) +
      (1 << 20));
  DS41_ASSIGN_OR_RETURN(w.meta_pinned, PinnedBuffer::allocate(w.meta_bytes, "GPU step metadata (pinned)"));
  DS41_ASSIGN_OR_RETURN(w.meta_buf, DeviceBuffer::allocate(w.meta_bytes, "GPU step metadata"));
  DS41_ASSIGN_OR_RETURN(
      w.logits_pinned, PinnedBuffer::allocate(static_cast<size_t>(L * V) * sizeof(float), "logits (pinned)"));
  w.meta_host = static_cast<uint8_t*>(w.meta_pinned.data());
  w.meta_dev = w.meta_buf.as<uint8_t>();
  w.logits_host = static_cast<float*>(w.logits_pinned.data());
  return w;
}

}  // namespace ds41::gpu
