// ds41 backends/cuda: what a decode linear's launch may write instead of its output (the tensor-core
// GEMV's epilogues, tc_gemv_kernels.h), each the exact operations of the launch it replaces:
// - SwigluEpilogue (MODEL_SPEC 3.5): the MoE's w1 and w3 (routed or shared) multiply the same rows and
//   what follows is act = row_scale[r] * silu(min(g, limit)) * clamp(u, -limit, limit) of g = x . W1^T
//   and u = x . W3^T (run_swiglu's operations: swiglu_device.cuh).
// - HcExpandEpilogue (MODEL_SPEC 3.3): the attention's output projection wo_b, whose output y goes into
//   the row's C residual streams (run_hc_expand's operations: hc_expand_device.cuh), optionally with
//   the next site's collapse and norm (CollapseNormNext: collapse_norm_device.cuh).
// A call that takes one of these gets its result written either in the linear's own launch (where the
// tensor-core GEMV takes the call) or as the plain linear followed by run_swiglu / run_hc_expand.
#pragma once

#include <cstdint>

namespace ds41::cuda {

struct SwigluEpilogue {
  float* act = nullptr;              // [rows, out_dim] device
  const float* row_scale = nullptr;  // nullable: one per row of the call (experts: per routed row)
  float limit = 0.0f;
};

// The next mHC site's collapse and norm after an expand (MODEL_SPEC 3.3: the next site collapses the
// streams the expand leaves with its lagged pre): x = RMSNorm(sum_j w[r, j] streams[r, j];
// norm_weight, eps), the bits of
//   run_hc_collapse(streams, w, n, c, h, x)
//   run_rms_norm(x, n, h, norm_weight, eps, x)
// (and of run_hc_site's collapse part, bit-identical to those two), so the site launches only its map.
// The launch that expands collapses each channel from the stream values it writes, and the last of a
// row's blocks (an atomic counter: at least the launcher's counter count of zeroed uint32 on the device
// that only this stream's fused kernels use, zero again after the call) normalizes the row; shapes
// without that tail run the two launches after the expand.
struct CollapseNormNext {
  const float* w = nullptr;            // [rows, c] the collapse weights
  const float* norm_weight = nullptr;  // [h], nullable: 1
  float eps = 0.0f;
  float* x = nullptr;  // [rows, h]; must not alias the expand's inputs or the streams
  uint32_t* counters = nullptr;
  int64_t counters_size = 0;
};

struct HcExpandEpilogue {
  float* streams = nullptr;      // [rows, c, out_dim] device, updated in place
  const float* post = nullptr;   // [rows, c]
  const float* comb = nullptr;   // [rows, c, c]
  int64_t c = 0;                 // streams per row, 1..8
  const CollapseNormNext* next = nullptr;  // nullable: the next site's x as well (run_linear_expand)
};

}  // namespace ds41::cuda
