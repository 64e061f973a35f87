// ds41 backends/cuda: a pair's SwiGLU as an epilogue (MODEL_SPEC 3.5): the MoE's w1 and w3 (routed or
// shared) multiply the same rows, and what follows is act = row_scale[r] * silu(min(g, limit)) *
// clamp(u, -limit, limit) of g = x . W1^T and u = x . W3^T. A call that takes this struct writes act
// (rows of the weights' output width) with run_swiglu's operations (swiglu_device.cuh) — in the pair's
// own launch where the tensor-core GEMV takes it (tc_gemv_kernels.h), else as the pair followed by
// run_swiglu.
#pragma once

namespace ds41::cuda {

struct SwigluEpilogue {
  float* act = nullptr;              // [rows, out_dim] device
  const float* row_scale = nullptr;  // nullable: one per row of the call (experts: per routed row)
  float limit = 0.0f;
};

}  // namespace ds41::cuda
