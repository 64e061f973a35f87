// ds41 gpu: GpuForward rows, embeddings (image-span rows included, 3.11), the per-layer schedule
// with the mHC lag (MODEL_SPEC 3.1, 3.3, 3.6) and the head — the device twin of src/model/forward_pass.cpp.
#include "gpu/gpu_forward.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/mhc_kernels.h"

namespace ds41::gpu {

namespace {
std::atomic<int> g_kv_table_override{-1};
}  // namespace

void set_kv_entry_table_for_tests(int on) { g_kv_table_override.store(on); }

namespace {
// Decode-step segments (enqueue()): DS41_GRAPH_DIRECT (1: the prologue launched directly, 2: layer 0
// too) and DS41_GRAPH_LAYERS (0: the layers after 0 and the head in one segment; k: k layers each,
// the head its own), read once.
int64_t graph_direct_segments() {
  static const int64_t v = [] {
    const char* e = std::getenv("DS41_GRAPH_DIRECT");
    return e ? std::clamp<int64_t>(std::atoll(e), 1, 2) : int64_t{1};
  }();
  return v;
}
int64_t graph_layers_per_segment() {
  static const int64_t v = [] {
    const char* e = std::getenv("DS41_GRAPH_LAYERS");
    return e ? std::max<int64_t>(0, std::atoll(e)) : int64_t{0};
  }();
  return v;
}
}  // namespace

int64_t GpuForward::graphed_segments_per_step(int64_t layers) {
  const int64_t per = graph_layers_per_segment();
  const int64_t rest = layers - 1;  // the layers after layer 0
  // The prologue, layer 0, then the rest with the head (per == 0) or in segments of per and the head.
  const int64_t all = 1 + (layers > 0 ? 1 : 0) + (per == 0 ? 1 : (rest > 0 ? (rest + per - 1) / per : 0) + 1);
  return all - std::min(all, graph_direct_segments());
}

// DS41_ROUTED_ROWS_GATHER=1 (measurement): the decode MoE gathers its routed rows into a copy before the
// w1 / w3 pair, as before 2026-12-05, instead of the GEMV reading them through the permutation.
namespace {
bool routed_rows_gather() {
  static const bool v = [] {
    const char* e = std::getenv("DS41_ROUTED_ROWS_GATHER");
    return e && std::atoi(e) == 1;
  }();
  return v;
}
}  // namespace

// DS41_COMPRESS_PAIR=0 (measurement): a ratio-2 compressor's a / b as two launches, as before
// 2026-12-06, instead of one GEMV pair (gpu_attention_layer.cpp compress()).
bool GpuForward::compress_pair() {
  static const bool v = cuda::switch_on("DS41_COMPRESS_PAIR");
  return v;
}

bool GpuForward::table_decode_enabled() {
  const int o = g_kv_table_override.load();
  if (o >= 0) return o != 0;
  static const bool env = [] {
    const char* e = std::getenv("DS41_KV_TABLE");
    return !(e && std::atoi(e) == 0);
  }();
  return env;
}

Result<std::unique_ptr<GpuForward>> GpuForward::create(const DeviceModel& m, const GpuLimits& limits,
                                                       KvBlockPool* pool, SequenceSlots* slots,
                                                       cudaStream_t stream) {
  std::unique_ptr<GpuForward> f(new GpuForward());
  f->m_ = &m;
  f->c_ = &m.config();
  f->lim_ = resolve_limits(m.config(), m.schedule(), limits);
  if (f->lim_.max_step_tokens <= 0 || f->lim_.max_step_seqs <= 0)
    return invalid_argument("GPU forward: max_step_tokens and max_step_seqs must be > 0");
  f->pool_ = pool;
  f->slots_ = slots;
  f->stream_ = stream;
  DS41_ASSIGN_OR_RETURN(f->ws_, create_workspace(m, f->lim_));
  if (f->lim_.tensor_core_min_rows > 0 && f->lim_.max_step_tokens >= f->lim_.tensor_core_min_rows) {
    const model::ModelConfig& c = m.config();
    TensorCoreLimits tl;
    tl.min_rows = f->lim_.tensor_core_min_rows;
    tl.max_rows = f->lim_.max_step_tokens;
    int64_t dense_max = 0;
    for (const DeviceLayer& w : m.weights().layers) {
      for (const cuda::DeviceWeight* x :
           {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_b, &w.c_wkv, &w.c_wgate, &w.idx_wk, &w.idx_wq_b,
            &w.idx_weights_proj, &w.gate, &w.shared.w1, &w.shared.w2, &w.shared.w3}) {
        tl.max_in = std::max(tl.max_in, x->in_dim);
        tl.max_out = std::max(tl.max_out, x->out_dim);
        dense_max = std::max(dense_max, x->in_dim * x->out_dim);
      }
      // wo_a: its x rows are in_dim * groups wide.
      tl.max_in = std::max(tl.max_in, w.wo_a.in_dim * std::max<int64_t>(c.o_groups, 1));
      tl.max_out = std::max(tl.max_out, w.wo_a.out_dim);
      dense_max = std::max(dense_max, w.wo_a.in_dim * w.wo_a.out_dim);
      if (w.engram) {
        tl.max_in = std::max(tl.max_in, w.engram->wkv.in_dim);
        tl.max_out = std::max(tl.max_out, w.engram->wkv.out_dim);
        dense_max = std::max(dense_max, w.engram->wkv.in_dim * w.engram->wkv.out_dim);
      }
    }
    tl.n_experts = c.n_routed_experts;
    if (tl.n_experts > 0) {
      tl.expert_out = c.moe_intermediate_size;
      tl.expert_in = c.hidden_size;
      tl.max_expert_rows = tl.max_rows * c.num_experts_per_tok;
    }
    const int64_t expert_elems = tl.expert_in * tl.expert_out;
    tl.weight_scratch_bytes =
        2 * std::max(dense_max, std::min<int64_t>(std::max<int64_t>(tl.n_experts, 1), 48) * expert_elems);
    // DS41_TC_SPLIT=2: FP8 / FP4 prefill linears on the two-part fp16 split (opt-in, see
    // TensorCoreLimits::split_parts: it moved a golden selection); default: three bfloat16 parts.
    if (const char* e = std::getenv("DS41_TC_SPLIT")) tl.split_parts = std::atoi(e) == 2 ? 2 : 3;
    if (const char* e = std::getenv("DS41_TC_ACCUMULATE")) tl.accumulate_parts = std::atoi(e) != 0;
    // DS41_TC_EXPERT_STREAMS=n: the routed experts' GEMMs over n streams (0: in order on the engine stream).
    if (const char* e = std::getenv("DS41_TC_EXPERT_STREAMS")) tl.expert_streams = std::clamp(std::atoi(e), 0, 16);
    // DS41_TC_FP4_GEMM=0: FP4 routed experts through the decode and cuBLAS instead of the grouped FP4 GEMM.
    tl.fp4_expert_gemm = f->lim_.fp4_expert_gemm >= 0 ? f->lim_.fp4_expert_gemm != 0 : cuda::switch_on("DS41_TC_FP4_GEMM");
    if (const char* e = std::getenv("DS41_TC_FP4_GEMM_ROWS"))
      tl.fp4_gemm_rows_per_expert = std::max<int64_t>(0, std::atoll(e));
    DS41_ASSIGN_OR_RETURN(f->tc_, TensorCoreLinear::create(tl, stream));
  }
  int64_t graphs = f->lim_.decode_graphs;
  if (graphs < 0) {
    graphs = 4;
    if (const char* e = std::getenv("DS41_GRAPHS")) graphs = std::max<int64_t>(0, std::atoll(e));
  }
  // One graph per graphed segment and signature variant (2 spare segments).
  if (graphs > 0)
    f->graphs_ = std::make_unique<StepGraphs>(graphs * (graphed_segments_per_step(m.config().num_hidden_layers) + 2));
  const int64_t side = f->lim_.side_stream >= 0 ? f->lim_.side_stream : (cuda::switch_on("DS41_SIDE_STREAM") ? 1 : 0);
  if (side > 0 && stream != nullptr) {
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&f->side_, cudaStreamNonBlocking),
                                           "create the side stream"));
    for (cudaEvent_t* e : {&f->fork_ev_, &f->join_ev_})
      DS41_RETURN_IF_ERROR(
          cuda::cuda_status(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "create a side-stream event"));
  }
  f->events_.assign(static_cast<size_t>(m.config().num_hidden_layers + 2), nullptr);
  for (cudaEvent_t& e : f->events_)
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&e), "create a timing event"));
  for (cudaEvent_t& e : f->span_ev_)
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&e), "create a timing event"));
  return f;
}

// Row-invariant forwards (row_invariant_: decode steps and verification forwards) never take the
// prefill tensor cores: their rows must get the bits a one-row decode step gives them, whatever the
// batch (MODEL_SPEC 3.10.7 lossless). The GEMV kernels they take are row-count invariant
// (tc_gemv_kernels.h), as is the attention with SparseAttentionArgs::row_invariant.
Result<const float*> GpuForward::act_input(quant::WeightFormat f, const float* x, int64_t rows, int64_t k) {
  if (!act_quantized(f) || rows <= 0) return x;
  if (rows * k > ws_.xq_elems)
    return internal_error("--numerics fp8-act: a linear's input of " + std::to_string(rows) + " x " +
                          std::to_string(k) + " values exceeds the workspace's " + std::to_string(ws_.xq_elems));
  DS41_RETURN_IF_ERROR(cuda::run_act_quant_rows(x, rows, k, ws_.xq, stream_));
  return static_cast<const float*>(ws_.xq);
}

Status GpuForward::linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y) {
  DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n, w.in_dim));
  // Quantized inputs are exact in bfloat16: the prefill GEMM takes one part (tensor_core_linear.h).
  if (tc_ && !row_invariant_ && tc_->accepts(w, n)) return tc_->linear(w, x, n, y, act_quantized(w.format));
  return cuda::run_linear(w, x, n, y, stream_, row_invariant_);
}

Status GpuForward::linear_normed(const cuda::DeviceWeight& w, float* x, int64_t n, float* y, const float* norm_weight,
                                 cuda::HcMapFold* map) {
  const float eps = static_cast<float>(c_->rms_norm_eps);
  if (map != nullptr) map->folded = false;
  if ((tc_ && !row_invariant_ && tc_->accepts(w, n)) || act_quantized(w.format)) {
    // prefill (and fp8-act: the input is quantized after the norm): the norm, then the linear
    DS41_RETURN_IF_ERROR(cuda::run_rms_norm(x, n, w.in_dim, norm_weight, eps, x, stream_));
    return linear(w, x, n, y);
  }
  return cuda::run_linear_normed(w, x, n, y, norm_weight, eps, stream_, row_invariant_, map);
}

Status GpuForward::try_linear_normed(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y,
                                     const float* norm_weight, bool* took) {
  *took = false;
  if (tc_ && !row_invariant_ && tc_->accepts(w, n)) return ok_status();  // prefill: the GEMMs
  if (act_quantized(w.format)) return ok_status();  // fp8-act: the norm, then linear() (quantizing)
  return cuda::try_linear_normed(w, x, n, y, norm_weight, static_cast<float>(c_->rms_norm_eps), stream_,
                                 row_invariant_, took);
}

Status GpuForward::linear_pair(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x,
                               int64_t n, float* y, float* y2) {
  if ((tc_ && !row_invariant_ && (tc_->accepts(w, n) || tc_->accepts(w2, n))) ||
      act_quantized(w.format) != act_quantized(w2.format)) {  // prefill: the GEMMs (or one input each)
    DS41_RETURN_IF_ERROR(linear(w, x, n, y));
    return linear(w2, x, n, y2);
  }
  DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n, w.in_dim));
  return cuda::run_linear_pair(w, w2, x, n, y, y2, stream_, row_invariant_);
}

Status GpuForward::try_linear_dual(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x,
                                   int64_t n, float* y, float* y2, bool* took, const float* norm_weight) {
  *took = false;
  if (tc_ && !row_invariant_ && (tc_->accepts(w, n) || tc_->accepts(w2, n))) return ok_status();  // prefill
  if (act_quantized(w.format) || act_quantized(w2.format)) {
    // fp8-act: one quantized input for both, where both quantize it and the norm is not in the staging
    if (norm_weight != nullptr || act_quantized(w.format) != act_quantized(w2.format) || w.in_dim != w2.in_dim)
      return ok_status();
    DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n, w.in_dim));
  }
  if (norm_weight == nullptr) return cuda::try_linear_dual(w, w2, x, n, y, y2, stream_, row_invariant_, took);
  return cuda::try_linear_dual_normed(w, w2, x, n, y, y2, norm_weight, static_cast<float>(c_->rms_norm_eps), stream_,
                                      row_invariant_, took);
}

Status GpuForward::grouped_linear(const cuda::DeviceWeight& w, int64_t groups, const float* x, int64_t n,
                                  float* y) {
  // Each group's K (in_dim) quantized on its own, as the CPU reference's grouped_linear.
  DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n * groups, w.in_dim));
  if (tc_ && !row_invariant_ && tc_->accepts_grouped(w, groups, n))
    return tc_->grouped_linear(w, groups, x, n, y, act_quantized(w.format));
  return cuda::run_grouped_linear(w, groups, x, n, y, stream_, row_invariant_);
}

Status GpuForward::expert_linear(const std::vector<DeviceExpert>& experts, cuda::DeviceWeight DeviceExpert::*which,
                                 const cuda::DeviceWeight* d_w, int64_t out_dim, int64_t in_dim, const float* x,
                                 int64_t m_max, float* y, bool routing_early, cuda::SharedUnits* shared) {
  const int64_t E = static_cast<int64_t>(experts.size());
  if (shared != nullptr) shared->folded = false;
  if (!experts.empty()) {
    if (shared != nullptr && act_quantized((experts.front().*which).format)) shared = nullptr;  // not folded
    DS41_ASSIGN_OR_RETURN(x, act_input((experts.front().*which).format, x, m_max, in_dim));
  }
  if (tc_ && !row_invariant_ && m_max >= lim_.tensor_core_min_rows) {
    expert_scratch_.resize(experts.size());
    for (size_t e = 0; e < experts.size(); ++e) expert_scratch_[e] = experts[e].*which;
    if (tc_->accepts_experts(expert_scratch_, out_dim, in_dim, m_max))
      return tc_->expert_linear(expert_scratch_, d_w, out_dim, in_dim, ws_.offsets, x, m_max, y,
                                act_quantized(expert_scratch_.front().format));
  }
  const quant::WeightFormat format = experts.empty() ? quant::WeightFormat::kNone : (experts.front().*which).format;
  return cuda::run_expert_linear(d_w, E, out_dim, in_dim, ws_.offsets, x, m_max, y, stream_, format, routing_early,
                                 shared);
}

Status GpuForward::expert_linear_pair(const std::vector<DeviceExpert>& experts,
                                      cuda::DeviceWeight DeviceExpert::*which,
                                      cuda::DeviceWeight DeviceExpert::*which2, const cuda::DeviceWeight* d_w,
                                      const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim,
                                      const float* x, const int64_t* x_rows, float* gathered, int64_t m_max,
                                      float* y, float* y2) {
  if (!experts.empty() && act_quantized((experts.front().*which).format)) {
    // fp8-act: the token rows x (n_ of them, read through x_rows) quantized once for both matrices
    if (act_quantized((experts.front().*which).format) != act_quantized((experts.front().*which2).format))
      return invalid_argument("--numerics fp8-act: an expert pair of two weight formats");
    DS41_ASSIGN_OR_RETURN(x, act_input((experts.front().*which).format, x, n_, in_dim));
  }
  if (tc_ && !row_invariant_ && m_max >= lim_.tensor_core_min_rows) {  // prefill: the tensor-core GEMMs
    expert_scratch_.resize(experts.size());
    expert_scratch2_.resize(experts.size());
    for (size_t e = 0; e < experts.size(); ++e) {
      expert_scratch_[e] = experts[e].*which;
      expert_scratch2_[e] = experts[e].*which2;
    }
    if (tc_->accepts_experts(expert_scratch_, out_dim, in_dim, m_max) &&
        tc_->accepts_experts(expert_scratch2_, out_dim, in_dim, m_max))  // x split once for both, from the token rows
      return tc_->expert_linear_pair(expert_scratch_, &expert_scratch2_, d_w, d_w2, out_dim, in_dim, ws_.offsets,
                                     x, m_max, y, y2, x_rows, act_quantized(expert_scratch_.front().format));
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(x, x_rows, m_max, in_dim, gathered, stream_));
    DS41_RETURN_IF_ERROR(expert_linear(experts, which, d_w, out_dim, in_dim, gathered, m_max, y));
    return expert_linear(experts, which2, d_w2, out_dim, in_dim, gathered, m_max, y2);
  }
  const quant::WeightFormat format = experts.empty() ? quant::WeightFormat::kNone : (experts.front().*which).format;
  const quant::WeightFormat format2 = experts.empty() ? quant::WeightFormat::kNone : (experts.front().*which2).format;
  if (format != format2) {
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(x, x_rows, m_max, in_dim, gathered, stream_));
    DS41_RETURN_IF_ERROR(expert_linear(experts, which, d_w, out_dim, in_dim, gathered, m_max, y));
    return expert_linear(experts, which2, d_w2, out_dim, in_dim, gathered, m_max, y2);
  }
  // Decode-sized: the tensor-core GEMV reads the routed rows through x_rows (no gather launch);
  // other calls gather into `gathered` first (linear_kernels.h run_expert_linear_pair_rows).
  if (routed_rows_gather()) {
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(x, x_rows, m_max, in_dim, gathered, stream_));
    return cuda::run_expert_linear_pair(d_w, d_w2, static_cast<int64_t>(experts.size()), out_dim, in_dim,
                                        ws_.offsets, gathered, m_max, y, y2, stream_, format);
  }
  return cuda::run_expert_linear_pair_rows(d_w, d_w2, static_cast<int64_t>(experts.size()), out_dim, in_dim,
                                           ws_.offsets, x, x_rows, gathered, m_max, y, y2, stream_, format);
}

Status GpuForward::linear_expand(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y,
                                 const cuda::HcExpandEpilogue& ex) {
  DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n, w.in_dim));
  if (tc_ && !row_invariant_ && tc_->accepts(w, n)) {  // prefill: the GEMM, then the expand
    DS41_RETURN_IF_ERROR(tc_->linear(w, x, n, y, act_quantized(w.format)));
    return cuda::run_hc_expand(ex.streams, y, ex.post, ex.comb, n, ex.c, w.out_dim, stream_);
  }
  return cuda::run_linear_expand(w, x, n, y, ex, stream_, row_invariant_);
}

Status GpuForward::linear_pair_swiglu(const cuda::DeviceWeight& w, const cuda::DeviceWeight& w2, const float* x,
                                      int64_t n, float* y, float* y2, const cuda::SwigluEpilogue& sw) {
  if ((tc_ && !row_invariant_ && (tc_->accepts(w, n) || tc_->accepts(w2, n))) ||
      act_quantized(w.format) != act_quantized(w2.format)) {  // prefill: the GEMMs, the SwiGLU
    DS41_RETURN_IF_ERROR(linear_pair(w, w2, x, n, y, y2));
    return cuda::run_swiglu(y, y2, n, w.out_dim, sw.limit, sw.row_scale, sw.act, stream_);
  }
  DS41_ASSIGN_OR_RETURN(x, act_input(w.format, x, n, w.in_dim));
  return cuda::run_linear_pair_swiglu(w, w2, x, n, y, y2, sw, stream_, row_invariant_);
}

Status GpuForward::expert_linear_pair_swiglu(const std::vector<DeviceExpert>& experts,
                                             cuda::DeviceWeight DeviceExpert::*which,
                                             cuda::DeviceWeight DeviceExpert::*which2, const cuda::DeviceWeight* d_w,
                                             const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim,
                                             const float* x, const int64_t* x_rows, float* gathered, int64_t m_max,
                                             float* y, float* y2, const cuda::SwigluEpilogue& sw,
                                             cuda::SharedUnits* shared) {
  if (shared != nullptr) shared->folded = false;
  const quant::WeightFormat format = experts.empty() ? quant::WeightFormat::kNone : (experts.front().*which).format;
  const quant::WeightFormat format2 = experts.empty() ? quant::WeightFormat::kNone : (experts.front().*which2).format;
  const bool gemms = tc_ && !row_invariant_ && m_max >= lim_.tensor_core_min_rows;
  if (act_quantized(format)) {  // fp8-act: the token rows quantized here (expert_linear_pair's rule); no units
    shared = nullptr;
    if (!gemms && format == format2 && !routed_rows_gather()) {
      DS41_ASSIGN_OR_RETURN(x, act_input(format, x, n_, in_dim));
    }
  }
  if (gemms || format != format2 || routed_rows_gather()) {  // the paths of expert_linear_pair, then the SwiGLU
    DS41_RETURN_IF_ERROR(
        expert_linear_pair(experts, which, which2, d_w, d_w2, out_dim, in_dim, x, x_rows, gathered, m_max, y, y2));
    return cuda::run_swiglu(y, y2, m_max, out_dim, sw.limit, sw.row_scale, sw.act, stream_);
  }
  return cuda::run_expert_linear_pair_swiglu(d_w, d_w2, static_cast<int64_t>(experts.size()), out_dim, in_dim,
                                             ws_.offsets, x, x_rows, gathered, m_max, y, y2, sw, stream_, format,
                                             shared);
}

GpuForward::~GpuForward() {
  for (cudaEvent_t e : events_)
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : {fork_ev_, join_ev_, span_ev_[0], span_ev_[1]})
    if (e) cudaEventDestroy(e);
  if (side_) cudaStreamDestroy(side_);
}

// No call of the forward may take the tensor-core GEMMs (TensorCoreLinear's split buffers, weight
// scratch and cuBLAS handle serve one stream): row-invariant forwards never do (linear()), nor do
// forwards whose every linear, routed rows included, is below tensor_core_min_rows.
bool GpuForward::side_ok() const {
  if (side_ == nullptr) return false;
  if (lim_.numerics != quant::ActNumerics::kExact) return false;  // one ws_.xq: every launch on the main stream
  if (row_invariant_ || !tc_) return true;
  const int64_t k = std::max({c_->num_experts_per_tok, c_->dspark_num_experts_per_tok, int64_t{1}});
  return n_ * k < lim_.tensor_core_min_rows;
}

Status GpuForward::concurrently(const std::function<Status()>& side, const std::function<Status()>& main) {
  if (!side_ok()) {  // in order on the main stream
    DS41_RETURN_IF_ERROR(main());
    return side();
  }
  const cudaStream_t m = stream_;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::stream_wait(side_, m, fork_ev_), "fork the side stream"));
  // The side chain is enqueued first (the main chain first, or the engine stream at the highest
  // priority, measured the same on the H200: docs/perf, session of 2026-12-04 19:20 UTC).
  stream_ = side_;
  Status st = side();
  stream_ = m;
  if (st.ok()) st = main();
  // Joined whatever happened: a capture needs every forked stream back, and the next step must not
  // race the side stream's leftovers.
  const Status joined = cuda::cuda_status(cuda::stream_wait(m, side_, join_ev_), "join the side stream");
  side_pending_ = false;
  return st.ok() ? joined : st;
}

Status GpuForward::join_pending() {
  if (!side_pending_) return ok_status();
  side_pending_ = false;
  return cuda::cuda_status(cuda::stream_wait(stream_, side_, join_ev_), "join the side stream");
}

Status GpuForward::run(std::span<const GpuSeqInput> batch, const GpuForwardOptions& opt,
                       std::vector<model::SequenceOutput>* out) {
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  const Clock::time_point t0 = Clock::now();
  host_times_ = HostTimes{};
  out->clear();
  DS41_RETURN_IF_ERROR(validate(batch, opt));
  if (batch.empty()) return ok_status();
  journal_ = opt.journal;
  jpend_.clear();
  Status st = plan(batch);
  row_invariant_ = journal_ != nullptr;
  if (st.ok() && !row_invariant_) {  // a decode step: one row per sequence
    row_invariant_ = true;
    for (const PlanSeq& q : seqs_) row_invariant_ = row_invariant_ && q.end - q.begin == 1;
  }
  if (st.ok() && journal_) st = journal_plan(opt);
  if (!st.ok()) {
    journal_ = nullptr;
    rollback_pages();
    return st;
  }
  out->resize(seqs_.size());
  if (opt.record && m_->hasher()) {
    const int64_t per_tok = m_->hasher()->ids_per_token();
    for (size_t s = 0; s < seqs_.size(); ++s)
      (*out)[s].record.hash_ids.assign(hash_ids_.begin() + seqs_[s].begin * per_tok,
                                       hash_ids_.begin() + seqs_[s].end * per_tok);
  }
  // A decode step (one row per sequence, no journal, nothing read back between layers, no image
  // rows uploaded from pageable memory) replays a captured graph when its launches match one.
  const bool graph = graphs_ && row_invariant_ && !journal_ && !opt.record && span_rows_ == 0 && opt.last_layer < 0;
  const Clock::time_point t1 = Clock::now();
  const bool span = device_span_ && span_ev_[0] != nullptr;
  if (span) cudaEventRecord(span_ev_[0], stream_);
  st = enqueue(opt, out, graph);
  if (span && st.ok()) cudaEventRecord(span_ev_[1], stream_);
  const Clock::time_point t2 = Clock::now();
  // The pinned arena is rewritten by the next plan: wait for the upload and the logits copy.
  Status sync = cuda::cuda_status(cudaStreamSynchronize(stream_), "GPU forward");
  const Clock::time_point t3 = Clock::now();
  host_times_.plan_us = us(t0, t1);
  host_times_.enqueue_us = us(t1, t2);
  host_times_.wait_us = us(t2, t3);
  if (st.ok()) st = sync;
  if (span && st.ok()) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, span_ev_[0], span_ev_[1]) == cudaSuccess) host_times_.device_us = 1e3 * ms;
  }
  journal_ = nullptr;
  if (!st.ok()) {
    // Host mirrors stay as they were; device rows written by the failed step are beyond them.
    rollback_pages();
    out->clear();
    return st.with_context("GPU forward");
  }
  if (opt.layer_ms) {
    opt.layer_ms->assign(events_.size() - 1, 0.0f);
    for (size_t l = 0; l + 1 < events_.size(); ++l)
      cudaEventElapsedTime(&(*opt.layer_ms)[l], events_[l], events_[l + 1]);
  }
  if (opt.layer_launches) {
    opt.layer_launches->assign(launch_marks_.size() - 1, 0);
    for (size_t l = 0; l + 1 < launch_marks_.size(); ++l)
      (*opt.layer_launches)[l] = static_cast<int64_t>(launch_marks_[l + 1] - launch_marks_[l]);
  }
  const int64_t V = c_->vocab_size;
  if (opt.argmax) {
    const int32_t* tok = reinterpret_cast<const int32_t*>(ws_.logits_host);
    opt.argmax->assign(tok, tok + logit_rows_host_.size());
  }
  size_t i = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    model::SequenceOutput& o = (*out)[s];
    const size_t first = i;
    while (i < logit_rows_host_.size() && logit_rows_host_[i] < seqs_[s].end) {
      o.positions.push_back(pos_host_[logit_rows_host_[i]]);
      if (!opt.argmax && !opt.logits_to)
        o.logits.insert(o.logits.end(), ws_.logits_host + i * V, ws_.logits_host + (i + 1) * V);
      ++i;
    }
    if (!opt.argmax && opt.logits_to && i > first)
      opt.logits_to(s, ws_.logits_host + first * V, static_cast<int64_t>(i - first));
  }
  commit();
  host_times_.outputs_us = us(t3, Clock::now());
  return ok_status();
}

// Segments: the prologue (metadata upload, embeddings, mHC init), layer 0, then the other layers
// and the head together. Graphed, every segment but the prologue is replayed from its own graph:
// the prologue is launched directly, so the device starts at once and layer 0's dry pass (and its
// graph launch) hides behind it; the rest's dry pass hides behind layer 0. H200, slice, batch 1,
// 4K, same run: the enqueue 182-312 -> 116-118 us per served step, the calling thread's time 6.1 %
// of the step (docs/perf, session of 2026-12-05 02:36 UTC); the old layout (prologue + layer 0
// direct, one graph per layer and the head) cost ~31 direct launches and nine graph launches per
// step, and the device waits ~10-20 us longer now (layer 0's dry pass after the prologue's kernels).
// Switches (measurement): DS41_GRAPH_DIRECT=2 launches layer 0
// directly too; DS41_GRAPH_LAYERS=k puts the layers after 0 in segments of k and the head in its own.
// A segment may run more than once (dry pass, capture): the host state carried between layers is
// restored at its start.
Status GpuForward::enqueue(const GpuForwardOptions& opt, std::vector<model::SequenceOutput>* out, bool graphed) {
  const int64_t L = c_->num_hidden_layers;
  const int64_t direct_segments = graph_direct_segments(), per_segment = graph_layers_per_segment();
  launch_marks_.assign(static_cast<size_t>(L + 2), 0);
  int64_t seg = 0;  // segments so far
  auto segment = [&](const std::function<Status()>& body) -> Status {
    if (!graphed || seg++ < direct_segments) return body();
    const Carry c = carry_;
    return graphs_->run(stream_, [&] {
      carry_ = c;
      return body();
    });
  };
  auto layer = [&](int64_t l) -> Status {
    if (opt.layer_ms)  // every event is recorded: layers after opt.last_layer time as 0 ms
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::record_event(events_[l], stream_), "timing event"));
    launch_marks_[static_cast<size_t>(l)] = cuda::thread_launch_count();
    if (opt.last_layer >= 0 && l > opt.last_layer) return ok_status();
    const Status st = run_layer(l, opt, out).with_context("layer " + std::to_string(l));
    const Status joined = join_pending();  // a segment (a captured graph) ends with the streams joined
    return st.ok() ? joined : st;
  };
  auto head_unit = [&]() -> Status {
    if (opt.layer_ms) DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::record_event(events_[L], stream_), "timing event"));
    launch_marks_[L] = cuda::thread_launch_count();
    DS41_RETURN_IF_ERROR(head(opt));
    if (opt.layer_ms)
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::record_event(events_[L + 1], stream_), "timing event"));
    launch_marks_[L + 1] = cuda::thread_launch_count();
    return ok_status();
  };
  DS41_RETURN_IF_ERROR(segment([&]() -> Status {
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cuda::copy_async(ws_.meta_dev, ws_.meta_host, meta_off_, cudaMemcpyHostToDevice, stream_),
        "upload step metadata"));
    if (journal_) DS41_RETURN_IF_ERROR(journal_save());
    return prologue();
  }));
  if (L > 0) DS41_RETURN_IF_ERROR(segment([&] { return layer(0); }));
  if (per_segment == 0)
    return segment([&]() -> Status {
      for (int64_t l = 1; l < L; ++l) DS41_RETURN_IF_ERROR(layer(l));
      return head_unit();
    });
  for (int64_t l0 = 1; l0 < L; l0 += per_segment)
    DS41_RETURN_IF_ERROR(segment([&]() -> Status {
      for (int64_t l = l0; l < std::min(L, l0 + per_segment); ++l) DS41_RETURN_IF_ERROR(layer(l));
      return ok_status();
    }));
  return segment(head_unit);
}

void GpuForward::commit() {
  for (PlanSeq& q : seqs_) {
    GpuSequence& s = *q.seq;
    s.position = q.start_pos + (q.end - q.begin);
    s.sources = std::move(q.next_sources);
    s.engram = q.next_engram;
    for (const PlanSource& ps : sources_)
      if (ps.groups > 0) s.last_published_source = ps.layer;  // as the reference: every sequence of the call
  }
  new_pages_.clear();
}

Status GpuForward::prologue() {
  const int64_t n = n_, H = c_->hidden_size, C = c_->hc_mult;
  // MODEL_SPEC 3.1: embed, copy into every stream, pi = one-hot(0).
  DS41_RETURN_IF_ERROR(cuda::run_embed_bf16(m_->weights().embed, c_->vocab_size, H, ids_, n, ws_.x, stream_));
  // MODEL_SPEC 3.11: image-span rows replace the token embeddings of their positions. The rows go
  // to ws_.y (free until the first attention) in row order, then to their rows of ws_.x. The host
  // sources are pageable: each copy returns once its bytes are staged.
  if (span_rows_ > 0) {
    int64_t at = 0;
    for (std::span<const float> src : span_src_) {
      DS41_RETURN_IF_ERROR(cuda::cuda_status(
          cuda::copy_async(ws_.y + at, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream_),
          "upload of the image-span rows"));
      at += static_cast<int64_t>(src.size());
    }
    if (at != span_rows_ * H) return internal_error("image-span rows do not match the flagged positions");
    DS41_RETURN_IF_ERROR(cuda::run_scatter_rows(ws_.y, span_dst_, span_rows_, H, ws_.x, stream_));
  }
  carry_ = Carry{};  // the step's layers start over
  return cuda::run_hc_init(ws_.x, n, C, H, ws_.streams, ws_.pi, stream_);
}

Status GpuForward::hc_site_map(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb) {
  cuda::HcMapDeviceArgs a;
  a.n = n;
  a.c = c_->hc_mult;
  a.h = c_->hidden_size;
  a.sinkhorn_iters = c_->hc_sinkhorn_iters;
  a.streams = ws_.streams;
  a.fn = hw.fn.ptr;
  a.scale = hw.scale.ptr;
  a.base = hw.base.ptr;
  a.hc_eps = static_cast<float>(c_->hc_eps);
  a.norm_eps = static_cast<float>(c_->rms_norm_eps);
  a.pre = pre;
  a.post = post;
  a.comb = comb;
  a.workspace = ws_.scratch;
  a.workspace_bytes = ws_.scratch_bytes;
  return cuda::run_hc_map(a, stream_);
}

cuda::HcSiteArgs GpuForward::site_args(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb,
                                       const float* collapse_w, const float* norm_weight, float* x,
                                       bool side_map) const {
  cuda::HcSiteArgs s;
  s.map.n = n;
  s.map.c = c_->hc_mult;
  s.map.h = c_->hidden_size;
  s.map.sinkhorn_iters = c_->hc_sinkhorn_iters;
  s.map.streams = ws_.streams;
  s.map.fn = hw.fn.ptr;
  s.map.scale = hw.scale.ptr;
  s.map.base = hw.base.ptr;
  s.map.hc_eps = static_cast<float>(c_->hc_eps);
  s.map.norm_eps = static_cast<float>(c_->rms_norm_eps);
  s.map.pre = pre;
  s.map.post = post;
  s.map.comb = comb;
  s.map.workspace = ws_.scratch;
  s.map.workspace_bytes = ws_.scratch_bytes;
  s.collapse_w = collapse_w;
  s.norm_weight = norm_weight;
  s.eps = static_cast<float>(c_->rms_norm_eps);
  s.x = x;
  s.counters = ws_.counters;
  s.counters_size = ws_.counters_size;
  if (side_map) {
    s.map.workspace = ws_.hc_scratch;
    s.map.workspace_bytes = ws_.hc_scratch_bytes;
    s.counters = ws_.hc_counters;
  }
  return s;
}

Status GpuForward::site_map(const cuda::HcSiteArgs& m) {
  static const bool split = cuda::switch_on("DS41_HC_SPLIT");
  if (split && side_ok()) {
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::stream_wait(side_, stream_, fork_ev_), "fork the side stream"));
    side_pending_ = true;  // joined before the expand reads post / comb (join_pending)
    return cuda::run_hc_site(m, side_, cuda::HcSitePart::kMap);
  }
  return cuda::run_hc_site(m, stream_, cuda::HcSitePart::kMap);
}

Status GpuForward::hc_site(const DeviceHcSite& hw, int64_t n, float* pre, float* post, float* comb,
                           const float* collapse_w, const float* norm_weight, float* x, bool collapse) {
  const cuda::HcSiteArgs s = site_args(hw, n, pre, post, comb, collapse_w, norm_weight, x, false);
  static const bool split = cuda::switch_on("DS41_HC_SPLIT");
  if (split && side_ok()) {
    // The map beside the main stream's kernels: its own partials and counters.
    const cuda::HcSiteArgs m = site_args(hw, n, pre, post, comb, collapse_w, norm_weight, x, true);
    if (cuda::hc_site_fused(m)) {
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cuda::stream_wait(side_, stream_, fork_ev_), "fork the side stream"));
      side_pending_ = true;  // joined before the expand reads post / comb (join_pending)
      DS41_RETURN_IF_ERROR(cuda::run_hc_site(m, side_, cuda::HcSitePart::kMap));
      return collapse ? cuda::run_hc_site(s, stream_, cuda::HcSitePart::kCollapse) : ok_status();
    }
  }
  if (!collapse)
    return cuda::hc_site_fused(s) ? cuda::run_hc_site(s, stream_, cuda::HcSitePart::kMap)
                                  : hc_site_map(hw, n, pre, post, comb);
  return cuda::run_hc_site(s, stream_);
}

cuda::CollapseRow GpuForward::collapse_row(const float* collapse_w, const float* norm_weight, float* x) const {
  cuda::CollapseRow r;
  r.streams = ws_.streams;
  r.collapse_w = collapse_w;
  r.norm_weight = norm_weight;
  r.eps = static_cast<float>(c_->rms_norm_eps);
  r.sum_threads = cuda::rms_norm_sum_threads(1, c_->hidden_size);
  r.x = x;
  return r;
}

Status GpuForward::run_layer(int64_t l, const GpuForwardOptions& opt,
                             std::vector<model::SequenceOutput>* out) {
  const DeviceLayer& w = m_->weights().layers[l];
  const int64_t C = c_->hc_mult, n = n_;
  if (c_->is_engram_layer(l)) DS41_RETURN_IF_ERROR(engram_stage(l));
  if (ds_.on) DS41_RETURN_IF_ERROR(capture_dspark_features(l));  // MODEL_SPEC 3.10.2
  win_offsets_ = win_offsets_list_[win_list_of_layer_[l]];  // this layer's window floors (step plan)
  win_index_ = win_index_list_[win_list_of_layer_[l]];
  // Attention site: collapse with the previous site's pre (MODEL_SPEC 3.3, the lag); the map,
  // the collapse and the norm in one launch.
  // The collapse weights entering layer l: ws_.pi for even l, ws_.pre_f for odd l (each FFN site
  // writes its pre into the other buffer, the next layer collapses with it).
  float* const pi = l % 2 == 0 ? ws_.pi : ws_.pre_f;
  float* const pre_f = l % 2 == 0 ? ws_.pre_f : ws_.pi;
  // The previous layer's combine may have collapsed and normed this site's x already (moe_rows' next).
  const bool collapsed = carry_.x_collapsed;
  carry_.x_collapsed = false;
  // DS41_HC_MAP_FOLD (opt-in): the site's map as extra blocks of the attention's wq_b launch (attention()), one
  // launch fewer; the collapse (unless done) in its own launch as before.
  cuda::HcMapFold attn_map;
  const bool carry_attn_map =
      n <= cuda::kTensorCoreGemvRows &&
      cuda::hc_site_map_fold(site_args(w.hc_attn, n, ws_.pre_a, ws_.post_a, ws_.comb_a, pi, w.attn_norm.ptr, ws_.x,
                                       true),
                             &attn_map);
  if (carry_attn_map) {
    if (!collapsed)
      DS41_RETURN_IF_ERROR(cuda::run_hc_site(
          site_args(w.hc_attn, n, ws_.pre_a, ws_.post_a, ws_.comb_a, pi, w.attn_norm.ptr, ws_.x, false), stream_,
          cuda::HcSitePart::kCollapse));
  } else {
    DS41_RETURN_IF_ERROR(
        hc_site(w.hc_attn, n, ws_.pre_a, ws_.post_a, ws_.comb_a, pi, w.attn_norm.ptr, ws_.x, !collapsed));
  }
  // The attention's output projection expands into the streams (after joining the site's map).
  const cuda::HcExpandEpilogue expand{ws_.streams, ws_.post_a, ws_.comb_a, C};
  DS41_RETURN_IF_ERROR(attention(l, ws_.x, ws_.y, opt, out, &expand, carry_attn_map ? &attn_map : nullptr));
  // FFN site. A one-row decode step may collapse there in the MoE's entry launch (with the gate and the
  // router: moe_entry); the site then launches its map alone.
  const bool entry = moe_entry_ok(w);
  // DS41_HC_MAP_FOLD (opt-in): that map as extra blocks of the routed pair's launch (with the shared expert's
  // units, DS41_MOE_SHARED_FOLD), one launch fewer; moe_rows launches it where the pair did not carry it.
  cuda::HcMapFold ffn_map;
  const bool carry_map =
      entry && w.shared.w1.present() && shared_fold_ok(n * c_->num_experts_per_tok) &&
      cuda::hc_site_map_fold(site_args(w.hc_ffn, n, pre_f, ws_.post_f, ws_.comb_f, ws_.pre_a, w.ffn_norm.ptr, ws_.x,
                                       true),
                             &ffn_map);
  if (!carry_map)
    DS41_RETURN_IF_ERROR(
        hc_site(w.hc_ffn, n, pre_f, ws_.post_f, ws_.comb_f, ws_.pre_a, w.ffn_norm.ptr, ws_.x, !entry));
  if (entry) DS41_RETURN_IF_ERROR(moe_entry(w, ws_.pre_a, w.ffn_norm.ptr, ws_.x));
  // The next layer's attention-site collapse (with this FFN site's pre) and norm in the MoE's combine launch
  // (DS41_COMBINE_COLLAPSE): where the next layer starts with that collapse (no Engram stage or DSpark capture
  // before it, which read or change the streams or ws_.x), C = 4 and the launch's limits hold (the same bits as
  // the site's collapse: run_moe_combine_expand_collapse).
  cuda::NextCollapse nc;
  const cuda::NextCollapse* next = nullptr;
  if (cuda::combine_collapse_enabled() && l + 1 < c_->num_hidden_layers && !c_->is_engram_layer(l + 1) && !ds_.on &&
      C == 4 && c_->hidden_size % 4 == 0 && c_->hidden_size <= 12288 && n <= 65535 && n <= ws_.counters_size) {
    nc.collapse_w = pre_f;
    nc.norm_weight = m_->weights().layers[l + 1].attn_norm.ptr;
    nc.eps = static_cast<float>(c_->rms_norm_eps);
    nc.sum_threads = cuda::rms_norm_sum_threads(n, c_->hidden_size);
    nc.x = ws_.x;
    nc.counters = ws_.counters;
    next = &nc;
  }
  return moe(l, ws_.x, ws_.y, opt, out, ws_.post_f, ws_.comb_f, entry, next,
             carry_map ? &ffn_map : nullptr);  // expands into the streams
}

Status GpuForward::head(const GpuForwardOptions& opt) {
  const int64_t H = c_->hidden_size, C = c_->hc_mult, V = c_->vocab_size;
  const int64_t m = static_cast<int64_t>(logit_rows_host_.size());
  if (m == 0) return ok_status();
  // MODEL_SPEC 3.6: collapse with the last FFN pre, final norm, head.
  DS41_RETURN_IF_ERROR(cuda::run_gather_rows(ws_.streams, logit_rows_, m, C * H, ws_.hs, stream_));
  const float* pi = c_->num_hidden_layers % 2 == 0 ? ws_.pi : ws_.pre_f;  // the last FFN site's pre
  DS41_RETURN_IF_ERROR(cuda::run_gather_rows(pi, logit_rows_, m, C, ws_.hp, stream_));
  DS41_RETURN_IF_ERROR(cuda::run_hc_collapse(ws_.hs, ws_.hp, m, C, H, ws_.h, stream_));
  DS41_RETURN_IF_ERROR(cuda::run_rms_norm(ws_.h, m, H, m_->weights().norm.ptr,
                                          static_cast<float>(c_->rms_norm_eps), ws_.h, stream_));
  DS41_RETURN_IF_ERROR(linear(m_->weights().head, ws_.h, m, ws_.logits));
  if (opt.argmax) {  // the rows' argmax in the scratch after the reduction's workspace, then m tokens down
    const size_t wsb = (cuda::argmax_workspace_bytes(m, V) + 255) / 256 * 256;
    if (wsb + static_cast<size_t>(m) * sizeof(int32_t) > ws_.scratch_bytes)
      return internal_error("GPU forward: the scratch holds no argmax of " + std::to_string(m) + " logits rows");
    int32_t* tok = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(ws_.scratch) + wsb);
    DS41_RETURN_IF_ERROR(cuda::run_argmax_rows(ws_.logits, m, V, tok, ws_.scratch, stream_, opt.argmax_checked));
    return cuda::cuda_status(cuda::copy_async(ws_.logits_host, tok, static_cast<size_t>(m) * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, stream_),
                             "copy the logits rows' argmax to the host");
  }
  return cuda::cuda_status(
      cuda::copy_async(ws_.logits_host, ws_.logits, static_cast<size_t>(m * V) * sizeof(float),
                      cudaMemcpyDeviceToHost, stream_),
      "copy logits to the host");
}

}  // namespace ds41::gpu
