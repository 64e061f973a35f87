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
// does: loaded through L2 into `row` (h floats of shared memory), rms_inv_like_rms_norm with the
// call's sum_threads, then fl(fl(v inv) weight) as hc_collapse_norm_quads_kernel. Every thread of the
// block calls it (barriers); scratch: 32 doubles of shared memory.
__device__ __forceinline__ void next_site_norm_row(const NextSite& nx, float* xr, int64_t h, float* row,
                                                   double* scratch) {
  constexpr int kB = 10;  // elements per thread in flight (h = 5120 at 256 threads: two rounds)
  const int64_t T = blockDim.x;
  for (int64_t b0 = threadIdx.x; b0 < h; b0 += kB * T) {
    float v[kB];
#pragma unroll
    for (int u = 0; u < kB; ++u) v[u] = b0 + u * T < h ? __ldcg(xr + b0 + u * T) : 0.0f;
#pragma unroll
    for (int u = 0; u < kB; ++u)
      if (b0 + u * T < h) row[b0 + u * T] = v[u];
  }
  __syncthreads();
  const float inv = rms_inv_like_rms_norm([&](int64_t i) { return row[i]; }, h, nx.sum_threads, nx.eps, scratch);
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
  __syncthreads();  // `row` and scratch are free again (a caller may normalize another row next)
}

}  // namespace ds41::cuda::dev
