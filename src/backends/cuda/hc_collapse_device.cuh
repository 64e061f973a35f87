// ds41 backends/cuda: the mHC collapse of one row's four streams followed by its RMSNorm, as one
// block computes it (MODEL_SPEC 3.3 collapse, 3.4 / 3.5 sublayer norm): the code of
// hc_collapse_norm_quads_kernel (fused_rows_kernels.cu), shared with the MoE entry kernel
// (tc_gemv_kernels.cu), so both give hc_collapse_kernel + run_rms_norm's bits by construction:
// v = 0 + w0 s0 + w1 s1 + w2 s2 + w3 s3 in float32 per element (fadd / fmul, no contraction),
// inv = rms_inv_like_rms_norm over v (run_rms_norm's float64 order for sum_threads threads), then
// x = fl(fl(v inv) norm_weight).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/rms_norm_device.cuh"

namespace ds41::cuda::dev {

constexpr int kCollapseQ = 5;  // quads per thread in flight (times the 4 streams): h = 5120 in one round

// The block's row: streams S (4 x h floats, float4 aligned, h % 4 == 0), its 4 collapse weights w4
// (global), the norm weight (nullable: 1), into the block's shared sm (h floats, 16-byte aligned).
// x (nullable): the normed row written there (global); normed_in_sm: also kept in sm (else sm holds
// v). Every thread calls it (barriers); scratch: 32 doubles of shared memory.
// wait(): called once, after the thread's first round of norm weights is loaded and before anything an
// earlier kernel wrote is read (the kernels pass their PDL wait): the norm weight is a weight, so its
// loads overlap the previous kernel's tail instead of following the row's sum of squares (one global
// round trip fewer on the decode step's critical path at h <= kCollapseQ x 4 x blockDim.x). The same
// values reach the same operations: the same bits.
template <class Wait>
__device__ __forceinline__ void collapse_norm_quads(const float* __restrict__ S0, const float* __restrict__ w4,
                                                    int64_t h, const float* __restrict__ norm_weight, float eps,
                                                    int sum_threads, float* sm, double* scratch, float* x,
                                                    bool normed_in_sm, Wait&& wait) {
  const int H4 = static_cast<int>(h >> 2), t = threadIdx.x, T = blockDim.x;
  const float4* S = reinterpret_cast<const float4*>(S0);
  float4* sm4 = reinterpret_cast<float4*>(sm);
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float4* nw4 = reinterpret_cast<const float4*>(norm_weight);
  const float4 ones = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  float4 nw0[kCollapseQ];  // the norm weights of the thread's first round (q0 = t)
#pragma unroll
  for (int q = 0; q < kCollapseQ; ++q) {
    const int i = t + q * T;
    nw0[q] = (i < H4 && nw4) ? nw4[i] : ones;
  }
  wait();
  float w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = w4[j];
  auto comb = [&](float s0, float s1, float s2, float s3) {
    float v = 0.0f;
    v = __fadd_rn(v, __fmul_rn(w[0], s0));
    v = __fadd_rn(v, __fmul_rn(w[1], s1));
    v = __fadd_rn(v, __fmul_rn(w[2], s2));
    v = __fadd_rn(v, __fmul_rn(w[3], s3));
    return v;
  };
  for (int q0 = t; q0 < H4; q0 += kCollapseQ * T) {
    float4 sv[kCollapseQ][4];
#pragma unroll
    for (int q = 0; q < kCollapseQ; ++q) {
      const int i = q0 + q * T;
#pragma unroll
      for (int j = 0; j < 4; ++j) sv[q][j] = i < H4 ? S[j * H4 + i] : zero4;
    }
#pragma unroll
    for (int q = 0; q < kCollapseQ; ++q) {
      const int i = q0 + q * T;
      if (i >= H4) break;
      sm4[i] = make_float4(comb(sv[q][0].x, sv[q][1].x, sv[q][2].x, sv[q][3].x),
                           comb(sv[q][0].y, sv[q][1].y, sv[q][2].y, sv[q][3].y),
                           comb(sv[q][0].z, sv[q][1].z, sv[q][2].z, sv[q][3].z),
                           comb(sv[q][0].w, sv[q][1].w, sv[q][2].w, sv[q][3].w));
    }
  }
  __syncthreads();
  const float inv = rms_inv_like_rms_norm([&](int64_t i) { return sm[i]; }, h, sum_threads, eps, scratch);
  float4* x4 = reinterpret_cast<float4*>(x);
  for (int q0 = t; q0 < H4; q0 += kCollapseQ * T) {
    float4 nw[kCollapseQ];
#pragma unroll
    for (int q = 0; q < kCollapseQ; ++q) {
      const int i = q0 + q * T;
      nw[q] = q0 == t ? nw0[q] : (i < H4 && nw4) ? nw4[i] : ones;
    }
#pragma unroll
    for (int q = 0; q < kCollapseQ; ++q) {
      const int i = q0 + q * T;
      if (i >= H4) break;
      const float4 v = sm4[i];
      const float4 o = make_float4(__fmul_rn(v.x, inv) * nw[q].x, __fmul_rn(v.y, inv) * nw[q].y,
                                   __fmul_rn(v.z, inv) * nw[q].z, __fmul_rn(v.w, inv) * nw[q].w);
      if (x4) x4[i] = o;
      if (normed_in_sm) sm4[i] = o;  // the thread's own element: read above, no other thread touches it
    }
  }
  if (normed_in_sm) __syncthreads();
}

}  // namespace ds41::cuda::dev
