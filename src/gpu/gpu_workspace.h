// ds41 gpu: GpuLimits and GpuWorkspace — every device buffer one forward step uses, carved out of
// ONE allocation at engine creation from the step limits (rows, sequences, context, logits rows),
// so a step never allocates (docs/gpu_engine.md). Also the step's metadata buffers: a pinned host
// arena the plan is written into and its device twin, uploaded with one copy per step.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "gpu/device_buffer.h"
#include "gpu/device_model.h"
#include "quant/act_quant.h"

namespace ds41::gpu {

struct GpuLimits {
  int64_t max_step_tokens = 2048;  // rows (tokens) of one forward, all sequences together
  int64_t max_step_seqs = 64;      // sequences of one forward
  int64_t max_context = 0;         // positions a sequence may reach; 0: the config's, at most 131072
  int64_t max_logit_rows = 0;      // logits rows one forward returns; 0: max_step_seqs
  int64_t max_step_key_rows = 0;   // index keys decoded per step (all sequences); 0: derived, <= 2^22
  // Linears with at least this many rows run on the tensor cores (gpu/tensor_core_linear.h);
  // 0: never (the GEMV / tile kernels only).
  int64_t tensor_core_min_rows = 128;
  // Decode steps captured as CUDA graphs and replayed (gpu/step_graphs.h), one graph per segment
  // (layers 1.., head; gpu_forward.cpp): variants kept per segment (the cache holds this many times the
  // segments, least recently used evicted); 0: launch every kernel directly. -1: 4, or DS41_GRAPHS.
  int64_t decode_graphs = -1;
  // Forwards without a tensor-core GEMM (decode steps, DSpark verifications and drafts, small
  // prefill chunks) enqueue two independent chains of a layer on a second stream, joined before
  // their results are read (gpu_forward.h "Side stream"): the same kernels on the same buffers, so
  // the same bits. 1 on, 0 off, -1: on unless DS41_SIDE_STREAM=0.
  int64_t side_stream = -1;
  // Prefill's routed FP4 experts as the grouped FP4 GEMM (TensorCoreLimits::fp4_expert_gemm): 1 on, 0 off,
  // -1: on unless DS41_TC_FP4_GEMM=0.
  int64_t fp4_expert_gemm = -1;
  // The activation numerics of the FP8 / FP4 linears (--numerics; quant/act_quant.h): kFp8Block32 quantizes
  // each such linear's input per 32 along K into GpuWorkspace::xq first (as the CPU reference's linears do),
  // runs the prefill GEMMs on one bfloat16 part instead of three (the quantized values are exact in
  // bfloat16) and keeps every launch on the main stream (one xq).
  quant::ActNumerics numerics = quant::ActNumerics::kExact;
};

// The limits with every 0 resolved from the config.
GpuLimits resolve_limits(const model::ModelConfig& c, const model::LayerSchedule& s, GpuLimits l);

struct GpuWorkspace {
  // Rows / residual streams (MODEL_SPEC 3.1, 3.3).
  float* streams = nullptr;  // [N, C, H]
  float* pi = nullptr;       // [N, C] the collapse weights entering a layer
  float *pre_a = nullptr, *post_a = nullptr, *comb_a = nullptr;
  float *pre_f = nullptr, *post_f = nullptr, *comb_f = nullptr;
  float *x = nullptr, *y = nullptr;  // [N, H]
  // Attention (3.4).
  float *q_r = nullptr, *q = nullptr, *o = nullptr, *z = nullptr;
  float* kvf =
      nullptr;  // [N + S*W + N*K, head_dim]: this call's window rows, decoded ring rows, decoded entries
  int64_t kvf_rows = 0;
  int64_t* kv_offsets = nullptr;   // [N + 1]
  int32_t* kv_index = nullptr;     // [N * (W + K)]
  int64_t* sel_offsets = nullptr;  // [N * K]
  // Compressor (3.4.4).
  float *ca = nullptr, *cb = nullptr;               // [N, head_dim]
  float *ga = nullptr, *gb = nullptr;               // [G, R, head_dim]
  float *zs = nullptr, *u = nullptr, *e = nullptr;  // [G, head_dim]
  float* kk = nullptr;                              // [G, index_head_dim]
  // Indexer (3.4.6).
  float *qi = nullptr, *wt = nullptr;
  float* keys = nullptr;           // [KR, index_head_dim]
  int64_t* key_offsets = nullptr;  // [KR]
  float* scores = nullptr;         // [N, TS]
  int32_t* sel = nullptr;          // [N, K]
  uint8_t* cand = nullptr;         // [N, TS]
  // MoE (3.5).
  float *gate_logits = nullptr, *route_w = nullptr, *perm_weight = nullptr;
  int32_t* experts = nullptr;
  int64_t *offsets = nullptr, *perm_rows = nullptr, *slot_pos = nullptr;
  float *xs = nullptr, *g = nullptr, *up = nullptr, *act = nullptr, *out_perm = nullptr;
  float *sg = nullptr, *su = nullptr, *sa = nullptr, *sout = nullptr;
  // Engram (3.2.4).
  float *erows = nullptr, *ez = nullptr, *gates = nullptr;
  // Head (3.6).
  float *hs = nullptr, *hp = nullptr, *h = nullptr, *logits = nullptr;
  // --numerics fp8-act: a linear's quantized input (GpuLimits::numerics; null and 0 in the exact numerics).
  float* xq = nullptr;
  int64_t xq_elems = 0;
  // Kernel scratch (top-k, candidate pool, MoE bucketing, hc_map split-K partials, sparse
  // attention split states): the largest need; dead after each call (one stream, calls in order).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // Self-resetting counters of the fused kernels (cuda::run_hc_site: one per group of 8 rows;
  // cuda::run_moe_route: the first; cuda::run_sparse_attention's split combine: one per row and head
  // pair): zeroed at creation, zero again after every call. The kernels
  // of the stream run one at a time (a PDL kernel touches them only after its wait), so they share.
  uint32_t* counters = nullptr;
  int64_t counters_size = 0;
  // The mHC map's own split-K partials and counters when it runs on the side stream beside kernels
  // of the main stream that use `scratch` / `counters` (gpu_forward.h "Side stream").
  void* hc_scratch = nullptr;
  size_t hc_scratch_bytes = 0;
  uint32_t* hc_counters = nullptr;
  // Step metadata: pinned host arena and its device twin.
  uint8_t* meta_host = nullptr;
  uint8_t* meta_dev = nullptr;
  size_t meta_bytes = 0;
  float* logits_host = nullptr;  // pinned [L, V]

  int64_t ts_max = 0;  // index key columns per row (max_context / smallest ratio)
  size_t device_bytes = 0;

  DeviceBuffer dev;
  PinnedBuffer meta_pinned, logits_pinned;
  DeviceBuffer meta_buf;
};

// Sizes and allocates the workspace for the model and the limits (resolved).
Result<GpuWorkspace> create_workspace(const DeviceModel& m, const GpuLimits& lim);

}  // namespace ds41::gpu
