// ds41 gpu: the MoE sublayer on the device (MODEL_SPEC 3.5) — the twin of src/model/moe_layer.cpp:
// sqrt-softplus router (bias for selection only; gate.bias_vl on image-span rows), stable bucketing of the
// (row, slot) pairs by expert, grouped launches over the sorted rows (w1 with w3 in one at decode sizes, with
// the SwiGLU as that launch's epilogue), SwiGLU with the two clamps and the routing weight applied before
// w2, w2, the combine in ascending expert order (the reference's order of additions), then the shared
// expert added. Where the forward has a side stream (decode steps, verifications, drafts: gpu_forward.h
// "Side stream") the shared expert runs there beside the router and the routed experts; at prefill
// sizes its w1 / w3 run before the SwiGLUs (one launch for both). With an expand target (the layer's FFN site) the combine, the shared add and the
// mHC expand are one launch (backends/cuda/fused_moe_kernels.h). With DS41_MOE_SHARED_FOLD=1 (opt-in until
// timed) the decode MoE runs the shared expert as extra units of the routed pair's and w2's launches instead
// (cuda::SharedUnits): no side stream, three launches fewer per layer, the same bits as its dense pair fused.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/moe_kernels.h"
#include "gpu/gpu_forward.h"

namespace ds41::gpu {

cuda::MoeRouteArgs GpuForward::route_args(const DeviceLayer& w, int64_t E, int64_t k, const uint8_t* vl) {
  cuda::MoeRouteArgs ra;
  ra.logits = ws_.gate_logits;
  ra.n = n_;
  ra.n_experts = E;
  ra.k = k;
  ra.bias = w.gate_bias.ptr;
  ra.bias_vl = w.gate_bias_vl.size > 0 ? w.gate_bias_vl.ptr : nullptr;
  ra.vl = vl;
  ra.temp = static_cast<float>(c_->gate_temp);
  ra.route_scale = static_cast<float>(c_->routed_scaling_factor);
  ra.experts = ws_.experts;
  ra.weights = ws_.route_w;
  ra.offsets = ws_.offsets;
  ra.perm_rows = ws_.perm_rows;
  ra.perm_weight = ws_.perm_weight;
  ra.slot_pos = ws_.slot_pos;
  ra.workspace = ws_.scratch;
  ra.workspace_bytes = ws_.scratch_bytes;
  ra.counters = ws_.counters;
  return ra;
}

// The entry (fused_moe_kernels.h run_moe_entry) is for one row of a decode step (row-invariant: the
// gate's GEMV is then the tensor-core GEMV whose KS the entry kernel repeats, so a row keeps its bits
// whatever the step's batch) through a BF16 gate, four mHC streams; DS41_MOE_ENTRY=0 turns it off.
bool GpuForward::moe_entry_ok(const DeviceLayer& w) const {
  return n_ == 1 && row_invariant_ && cuda::moe_entry_enabled() && c_->hc_mult == 4 &&
         w.gate.format == quant::WeightFormat::kBF16 && w.gate.in_dim == c_->hidden_size;
}

Status GpuForward::moe_entry(const DeviceLayer& w, const float* collapse_w, const float* norm_weight, float* x) {
  cuda::MoeEntryArgs a;
  a.row = collapse_row(collapse_w, norm_weight, x);
  a.route = route_args(w, c_->n_routed_experts, c_->num_experts_per_tok, vl_);
  return cuda::run_moe_entry(w.gate, a, stream_);
}

bool GpuForward::shared_fold_ok(int64_t nk) const {
  return cuda::moe_shared_fold() && lim_.numerics == quant::ActNumerics::kExact && (!tc_ || row_invariant_ || nk < lim_.tensor_core_min_rows) &&
         (row_invariant_ || n_ <= cuda::kTensorCoreGemvRows);
}

// The MoE of n_ rows through block w with E routed experts, top-k (the text layers, or a DSpark
// stage with E_d / k_d and no image rows, MODEL_SPEC 3.10.4).
Status GpuForward::moe_rows(const DeviceLayer& w, int64_t E, int64_t k, const uint8_t* vl, const float* x,
                            float* y, const float* expand_post, const float* expand_comb, bool routed_ready,
                            const cuda::NextCollapse* next, cuda::HcMapFold* map) {
  const int64_t n = n_, H = c_->hidden_size;
  const int64_t I = c_->moe_intermediate_size, nk = n * k;
  const float lim = static_cast<float>(c_->swiglu_limit);
  const bool shared = w.shared.w1.present();
  const int64_t Is = shared ? w.shared.w1.out_dim : 0;
  // The router and the bucketing (unless the MoE entry ran them), on the stream current when called.
  auto route = [&]() -> Status {
    if (routed_ready) return ok_status();
    DS41_RETURN_IF_ERROR(linear(w.gate, x, n, ws_.gate_logits));
    return cuda::run_moe_route(route_args(w, E, k, vl), stream_);  // router + bucketing: one launch
  };
  // The routed rows x[perm_rows[i]]: read straight from x by the prefill GEMMs' split and by the decode
  // GEMV's staging (no gather launch); gathered into xs for the other paths. At decode sizes the
  // SwiGLU with the routing weights is the pair's epilogue (one launch). sh: the shared expert's units in the
  // same launch where they fit (cuda::SharedUnits; sh->folded says).
  auto routed_pair_swiglu = [&](cuda::SharedUnits* sh) {
    return expert_linear_pair_swiglu(w.experts, &DeviceExpert::w1, &DeviceExpert::w3, w.d_w1, w.d_w3, I, H, x,
                                     ws_.perm_rows, ws_.xs, nk, ws_.g, ws_.up,
                                     cuda::SwigluEpilogue{ws_.act, ws_.perm_weight, lim}, sh);
  };
  // The routing is two or more launches back here (the route, then the pair's one or more launches, each of
  // which waits before it triggers: launch.h contract 3), so w2 may look up its units and start its weight
  // loads before its PDL wait.
  auto routed_w2 = [&](cuda::SharedUnits* sh) {
    return expert_linear(w.experts, &DeviceExpert::w2, w.d_w2, H, I, ws_.act, nk, ws_.out_perm,
                         /*routing_early=*/true, sh);
  };
  // The router, the bucketing and the routed experts' w1 / w3 (and, with `swiglu`, their SwiGLU and
  // w2), on the stream current when called.
  auto routed = [&](bool swiglu) -> Status {
    DS41_RETURN_IF_ERROR(route());
    if (!swiglu)
      return expert_linear_pair(w.experts, &DeviceExpert::w1, &DeviceExpert::w3, w.d_w1, w.d_w3, I, H, x,
                                ws_.perm_rows, ws_.xs, nk, ws_.g, ws_.up);
    DS41_RETURN_IF_ERROR(routed_pair_swiglu(nullptr));
    return routed_w2(nullptr);
  };
  const bool fold = shared && shared_fold_ok(nk);
  if (map != nullptr && !fold) {  // no launch here carries it: its own, first
    DS41_RETURN_IF_ERROR(cuda::run_hc_site(map->site, stream_, cuda::HcSitePart::kMap));
    map = nullptr;
  }
  if (fold) {
    // DS41_MOE_SHARED_FOLD: the shared expert's pair (with its SwiGLU) and its w2 as units of the routed
    // pair's and w2's launches, in order on this stream (no side stream). Where a launch did not take them,
    // the shared expert's own launch follows it, with the same bits (its dense pair fused: shared_fold_ok).
    DS41_RETURN_IF_ERROR(route());
    cuda::SharedUnits sp{&w.shared.w1, &w.shared.w3, x, n, ws_.sa};
    sp.map = map;  // the FFN site's map, where run_layer left it to this launch (DS41_HC_MAP_FOLD)
    DS41_RETURN_IF_ERROR(routed_pair_swiglu(&sp));
    if (map != nullptr && !map->folded)
      DS41_RETURN_IF_ERROR(cuda::run_hc_site(map->site, stream_, cuda::HcSitePart::kMap));
    if (!sp.folded)
      DS41_RETURN_IF_ERROR(linear_pair_swiglu(w.shared.w1, w.shared.w3, x, n, ws_.sg, ws_.su,
                                              cuda::SwigluEpilogue{ws_.sa, nullptr, lim}));
    cuda::SharedUnits s2{&w.shared.w2, nullptr, ws_.sa, n, ws_.sout};
    DS41_RETURN_IF_ERROR(routed_w2(&s2));
    if (!s2.folded) DS41_RETURN_IF_ERROR(linear(w.shared.w2, ws_.sa, n, ws_.sout));
  } else if (shared && side_ok()) {
    // The shared expert (ws_.sg / su / sa / sout, from x alone) on the side stream beside the router
    // and the routed experts (gpu_forward.h "Side stream"), its SwiGLU the pair's epilogue at decode
    // sizes (the same operations as the pair kernel's second set).
    DS41_RETURN_IF_ERROR(concurrently(
        [&]() -> Status {
          DS41_RETURN_IF_ERROR(linear_pair_swiglu(w.shared.w1, w.shared.w3, x, n, ws_.sg, ws_.su,
                                                  cuda::SwigluEpilogue{ws_.sa, nullptr, lim}));
          return linear(w.shared.w2, ws_.sa, n, ws_.sout);
        },
        [&] { return routed(true); }));
  } else if (shared && (!tc_ || row_invariant_ || nk < lim_.tensor_core_min_rows)) {
    // Decode sizes without the side stream: in order, each pair with its SwiGLU as above (the same
    // launches, so the same bits as with the side stream).
    DS41_RETURN_IF_ERROR(routed(true));
    DS41_RETURN_IF_ERROR(linear_pair_swiglu(w.shared.w1, w.shared.w3, x, n, ws_.sg, ws_.su,
                                            cuda::SwigluEpilogue{ws_.sa, nullptr, lim}));
    DS41_RETURN_IF_ERROR(linear(w.shared.w2, ws_.sa, n, ws_.sout));
  } else if (shared) {
    // In order: the shared expert's w1 / w3 (they read x only) before the SwiGLUs, so that both run
    // in one launch.
    DS41_RETURN_IF_ERROR(routed(false));
    cudaStream_t s = stream_;
    DS41_RETURN_IF_ERROR(linear_pair(w.shared.w1, w.shared.w3, x, n, ws_.sg, ws_.su));
    DS41_RETURN_IF_ERROR(cuda::run_swiglu_pair({ws_.g, ws_.up, nk, I, ws_.perm_weight, ws_.act},
                                               {ws_.sg, ws_.su, n, Is, nullptr, ws_.sa}, lim, s));
    DS41_RETURN_IF_ERROR(expert_linear(w.experts, &DeviceExpert::w2, w.d_w2, H, I, ws_.act, nk, ws_.out_perm));
    DS41_RETURN_IF_ERROR(linear(w.shared.w2, ws_.sa, n, ws_.sout));
  } else {
    DS41_RETURN_IF_ERROR(routed(true));
  }
  DS41_RETURN_IF_ERROR(join_pending());  // the FFN site's map (post / comb), if it ran on the side stream
  cudaStream_t s = stream_;
  if (!expand_post) {
    DS41_RETURN_IF_ERROR(cuda::run_moe_combine(ws_.out_perm, ws_.slot_pos, ws_.experts, n, k, H, y, s));
    if (shared) DS41_RETURN_IF_ERROR(cuda::run_add_inplace(y, ws_.sout, n * H, s));
    return ok_status();
  }
  // y = combine + the shared output, and its expand into the streams: one launch (the same float
  // operations as combine, add, expand); with `next` also the next layer's attention-site collapse.
  if (next != nullptr) {
    DS41_RETURN_IF_ERROR(cuda::run_moe_combine_expand_collapse(ws_.out_perm, ws_.slot_pos, ws_.experts, n, k, H,
                                                               shared ? ws_.sout : nullptr, y, ws_.streams,
                                                               expand_post, expand_comb, c_->hc_mult, *next, s));
    carry_.x_collapsed = true;
    return ok_status();
  }
  return cuda::run_moe_combine_expand(ws_.out_perm, ws_.slot_pos, ws_.experts, n, k, H,
                                      shared ? ws_.sout : nullptr, y, ws_.streams, expand_post, expand_comb,
                                      c_->hc_mult, s);
}

Status GpuForward::moe(int64_t l, const float* x, float* y, const GpuForwardOptions& opt,
                       std::vector<model::SequenceOutput>* out, const float* expand_post,
                       const float* expand_comb, bool routed_ready, const cuda::NextCollapse* next,
                       cuda::HcMapFold* map) {
  const int64_t n = n_, k = c_->num_experts_per_tok, nk = n * k;
  DS41_RETURN_IF_ERROR(moe_rows(m_->weights().layers[l], c_->n_routed_experts, k, vl_, x, y, expand_post,
                                expand_comb, routed_ready, next, map));
  cudaStream_t s = stream_;
  if (!opt.record) return ok_status();
  std::vector<int32_t> ex(nk);
  std::vector<float> wt(nk);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(ex.data(), ws_.experts, nk * sizeof(int32_t), cudaMemcpyDeviceToHost, s),
      "copy routing"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(wt.data(), ws_.route_w, nk * sizeof(float), cudaMemcpyDeviceToHost, s),
      "copy routing"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(s), "record routing"));
  for (size_t si = 0; si < seqs_.size(); ++si) {
    model::ForwardRecord& rec = (*out)[si].record;
    rec.router_experts[l].assign(ex.begin() + seqs_[si].begin * k, ex.begin() + seqs_[si].end * k);
    rec.router_weights[l].assign(wt.begin() + seqs_[si].begin * k, wt.begin() + seqs_[si].end * k);
  }
  return ok_status();
}

}  // namespace ds41::gpu
