// ds41 backends/cuda: SwiGLU of one element on the device (MODEL_SPEC 3.5, the CPU op's operations):
// silu(min(g, limit)) * clamp(u, -limit, limit) with std::min / std::clamp NaN semantics (a NaN input
// passes through) and the SiLU in float64 as the reference computes it. One definition for every
// kernel that applies it (elementwise swiglu_kernel, the fused MoE swiglu_pair kernels, the
// tensor-core GEMV pair's SwiGLU epilogue), so they give the same bits by construction.
#pragma once

#include <cuda_runtime.h>

namespace ds41::cuda::dev {

__device__ __forceinline__ float swiglu_value(float gv, float uv, float limit) {
  const float gg = limit < gv ? limit : gv;
  const float uu = uv < -limit ? -limit : (limit < uv ? limit : uv);
  const double gd = gg;
  const float silu = static_cast<float>(gd / (1.0 + exp(-gd)));
  return __fmul_rn(silu, uu);
}

}  // namespace ds41::cuda::dev
