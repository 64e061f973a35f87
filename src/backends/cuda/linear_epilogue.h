// ds41 backends/cuda: what a decode linear's launch may write instead of its output (the tensor-core
// GEMV's epilogues, tc_gemv_kernels.h), each the exact operations of the launch it replaces:
// - SwigluEpilogue (MODEL_SPEC 3.5): the MoE's w1 and w3 (routed or shared) multiply the same rows and
//   what follows is act = row_scale[r] * silu(min(g, limit)) * clamp(u, -limit, limit) of g = x . W1^T
//   and u = x . W3^T (run_swiglu's operations: swiglu_device.cuh).
// - HcExpandEpilogue (MODEL_SPEC 3.3): the attention's output projection wo_b, whose output y goes into
//   the row's C residual streams (run_hc_expand's operations: hc_expand_device.cuh).
// A call that takes one of these gets its result written either in the linear's own launch (where the
// tensor-core GEMV takes the call) or as the plain linear followed by run_swiglu / run_hc_expand.
#pragma once

#include <cstdint>

#include "backends/cuda/device_weight.h"

namespace ds41::cuda {

struct SwigluEpilogue {
  float* act = nullptr;              // [rows, out_dim] device
  const float* row_scale = nullptr;  // nullable: one per row of the call (experts: per routed row)
  float limit = 0.0f;
};

// The other side of a launch: what a one-row decode linear may compute before its GEMV instead of reading
// x (the MoE entry: tc_gemv_kernels.cu tc_moe_entry_kernel): the mHC collapse of the row's 4 streams and its
// RMSNorm (MODEL_SPEC 3.3; run_hc_site's collapse part: hc_collapse_norm_quads_kernel's operations,
// hc_collapse_device.cuh), every block for itself; the first block writes x where it is set.
struct CollapseRow {
  const float* streams = nullptr;      // [4, h] device, 16-byte aligned
  const float* collapse_w = nullptr;   // [4]
  const float* norm_weight = nullptr;  // [h], 16-byte aligned (nullable: 1)
  float eps = 0.0f;
  int sum_threads = 0;  // rms_norm_sum_threads(1, h)
  float* x = nullptr;   // [h] the collapsed, normed row (nullable: not written)
};

struct HcMapFold;  // fused_rows_kernels.h

// The shared expert (MODEL_SPEC 3.5) as extra units of a routed experts' launch (tc_gemv_kernels.h try_experts,
// DS41_MOE_SHARED_FOLD): the same products as its own launch (its dense FP8 weight, the warps per row group
// its dense call takes: see try_experts), in the blocks of the routed launch, so the decode MoE runs its
// shared and routed experts in two launches instead of five. w2 set: a pair with its SwiGLU (the routed call
// is the w1 / w3 pair with a SwigluEpilogue): y = act = silu(min(g, limit)) * clamp(u, -limit, limit), no row
// scale; w2 null: the single weight (the routed call is w2), y = x . w^T. `folded` is written by the call:
// true where the shared units ran in its launch, false where the caller must run the shared expert itself.
struct SharedUnits {
  const DeviceWeight* w = nullptr;   // the shared w1 (a pair) or w2: FP8 tiles, the routed call's shape
  const DeviceWeight* w2 = nullptr;  // the shared w3 (a pair), else null
  const float* x = nullptr;          // [n, in] device, 16-byte aligned
  int64_t n = 0;                     // the token rows
  float* y = nullptr;                // [n, out] device: act (a pair) or the output
  bool folded = false;               // out
  HcMapFold* map = nullptr;          // nullable: a site's map carried by the same launch (its own `folded`)
};

struct HcExpandEpilogue {
  float* streams = nullptr;      // [rows, c, out_dim] device, updated in place
  const float* post = nullptr;   // [rows, c]
  const float* comb = nullptr;   // [rows, c, c]
  int64_t c = 0;                 // streams per row, 1..8
};

}  // namespace ds41::cuda
