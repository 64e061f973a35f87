// ds41 backends/cuda: the next mHC site's collapse and norm carried by the launch that expands into the
// streams (linear_epilogue.h CollapseNormNext; MODEL_SPEC 3.3). The collapse of a channel comes from
// the stream values the expand just wrote (hc_expand_device.cuh hc_expand_channel's `cw`); this file
// has the device form of the arguments, the per-row counter that elects the row's last block, and that
// block's norm of the row in run_rms_norm's order (rms_norm_device.cuh). One definition for the MoE's
// combine-expand (fused_moe_kernels.cu) and wo_b's GEMV epilogue (tc_gemv_kernels.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/rms_norm_device.cuh"

namespace ds41::cuda::dev {

constexpr int64_t kMaxNextH = 10240;  // a launcher's bound on the row it stages (40 KB of shared memory)

// CollapseNormNext on the device (x == nullptr: off).
struct NextSite {
  const float* w = nullptr;            // [rows, c]
  const float* norm_weight = nullptr;  // [h], nullable: 1
  float eps = 0.0f;
  float* x = nullptr;  // [rows, h]
  uint32_t* counters = nullptr;
  int sum_threads = 0;  // rms_norm_sum_threads(n, h) of the call
};

// Every thread of the block calls it after its writes of the collapsed values: true in the block that
// counts last on counters[slot] of `blocks` (that block resets the counter; the other blocks' writes
// are visible to it). flag: a shared int.
__device__ __forceinline__ bool last_block_of(uint32_t* counters, int64_t slot, uint32_t blocks, int* flag) {
  __threadfence();  // this block's writes, visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(&counters[slot], 1u);
    *flag = done + 1 == blocks;
    if (*flag) counters[slot] = 0;  // zero again for the next call (kernels of the stream run in order)
  }
  __syncthreads();
  const bool last = *flag != 0;
  if (last) __threadfence();
  return last;
}

// The row xr (h collapsed values written by the row's blocks) normalized in place as run_rms_norm
// does: loaded through L2 into `row` (h floats of shared memory, 16-byte aligned), rms_inv_like_rms_norm
// with the call's sum_threads, then fl(fl(v inv) weight) as hc_collapse_norm_quads_kernel. Where h % 4 ==
// 0 and x and the weight are 16-byte aligned, float4 loads and stores with 32-bit quad offsets (the
// quads kernel's form: its scalar predecessor spent most of its instructions on 64-bit addressing and
// bounds checks); the same values either way. Every thread of the block calls it (barriers); scratch:
// 32 doubles of shared memory.
__device__ __forceinline__ void next_site_norm_row(const NextSite& nx, float* xr, int64_t h, float* row,
                                                   double* scratch) {
  const int64_t T = blockDim.x;
  const bool quads = (h & 3) == 0 && h < (int64_t{1} << 31) &&
                     ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(nx.norm_weight) |
                       reinterpret_cast<uintptr_t>(row)) & 15) == 0;
  if (quads) {
    constexpr int kQ = 5;  // quads per thread in flight (h = 5120 at 256 threads: one round)
    const int h4 = static_cast<int>(h >> 2), t = threadIdx.x, T4 = blockDim.x;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* r4 = reinterpret_cast<float4*>(row);
    for (int q0 = t; q0 < h4; q0 += kQ * T4) {
      float4 v[kQ];
#pragma unroll
      for (int u = 0; u < kQ; ++u) v[u] = q0 + u * T4 < h4 ? __ldcg(x4 + q0 + u * T4) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < kQ; ++u)
        if (q0 + u * T4 < h4) r4[q0 + u * T4] = v[u];
    }
  } else {
    constexpr int kB = 10;  // elements per thread in flight
    for (int64_t b0 = threadIdx.x; b0 < h; b0 += kB * T) {
      float v[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) v[u] = b0 + u * T < h ? __ldcg(xr + b0 + u * T) : 0.0f;
#pragma unroll
      for (int u = 0; u < kB; ++u)
        if (b0 + u * T < h) row[b0 + u * T] = v[u];
    }
  }
  __syncthreads();
  const float inv = rms_inv_like_rms_norm([&](int64_t i) { return row[i]; }, h, nx.sum_threads, nx.eps, scratch);
  if (quads) {
    constexpr int kQ = 5;
    const int h4 = static_cast<int>(h >> 2), t = threadIdx.x, T4 = blockDim.x;
    float4* x4 = reinterpret_cast<float4*>(xr);
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const float4* w4 = reinterpret_cast<const float4*>(nx.norm_weight);
    const float4 ones = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    for (int q0 = t; q0 < h4; q0 += kQ * T4) {
      float4 nw[kQ];
#pragma unroll
      for (int u = 0; u < kQ; ++u) nw[u] = (q0 + u * T4 < h4 && w4) ? w4[q0 + u * T4] : ones;
#pragma unroll
      for (int u = 0; u < kQ; ++u) {
        const int i = q0 + u * T4;
        if (i >= h4) break;
        const float4 v = r4[i];
        x4[i] = make_float4(__fmul_rn(v.x, inv) * nw[u].x, __fmul_rn(v.y, inv) * nw[u].y,
                            __fmul_rn(v.z, inv) * nw[u].z, __fmul_rn(v.w, inv) * nw[u].w);
      }
    }
  } else {
    constexpr int kB = 10;
    for (int64_t b0 = threadIdx.x; b0 < h; b0 += kB * T) {
      float nw[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) nw[u] = (b0 + u * T < h && nx.norm_weight) ? nx.norm_weight[b0 + u * T] : 1.0f;
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const int64_t i = b0 + u * T;
        if (i < h) xr[i] = __fmul_rn(row[i], inv) * nw[u];
      }
    }
  }
  __syncthreads();  // `row` and scratch are free again (a caller may normalize another row next)
}

}  // namespace ds41::cuda::dev
