// ds41 backends/cuda: the block-wide exclusive scan shared by the MoE bucketing (moe_kernels.cu
// bucket_scan_kernel, fused_moe_kernels.cu moe_route_kernel) and the expert GEMV's unit scan
// (linear_kernels.cu expert_units): every thread sums a contiguous range of items (thread_range),
// then one Hillis-Steele scan over the threads' sums in shared memory. Integer sums: the result does
// not depend on the order, the shape is only what the three kernels had in common.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

// Thread threadIdx.x's contiguous share [begin, end) of n items over the block's threads.
struct ThreadRange {
  int64_t begin, end;
};
__device__ __forceinline__ ThreadRange thread_range(int64_t n) {
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t b = min(n, static_cast<int64_t>(threadIdx.x) * per);
  return ThreadRange{b, min(n, b + per)};
}

// Exclusive scan of one int per thread over the block (part: blockDim.x ints of shared memory).
// Returns the sum of the values of the threads before this one; *total gets the block's sum (every
// thread). Every thread of the block calls it (barriers); part is not written after the last
// barrier, so the caller may reuse it after its own next barrier.
__device__ __forceinline__ int block_exclusive_scan(int v, int* part, int* total) {
  const int t = threadIdx.x, T = blockDim.x;
  part[t] = v;
  __syncthreads();
  for (int off = 1; off < T; off <<= 1) {  // Hillis-Steele inclusive scan
    const int u = t >= off ? part[t - off] : 0;
    __syncthreads();
    part[t] += u;
    __syncthreads();
  }
  *total = part[T - 1];
  return part[t] - v;
}

// The same exclusive scan through warp shuffles and ONE barrier (blockDim.x a multiple of 32): each
// warp scans its lanes, lane 31 leaves the warp's sum in wtot (blockDim.x / 32 ints of shared memory),
// every thread adds the sums of the warps before its own after the barrier. For a scan on a latency
// chain (the expert GEMV's units: 1 barrier instead of 2 log2(blockDim.x)). wtot is read after the
// barrier: the caller barriers before writing it again.
__device__ __forceinline__ int block_exclusive_scan_shfl(int v, int* wtot, int* total) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int nw = static_cast<int>(blockDim.x >> 5);
  int incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) wtot[warp] = incl;
  __syncthreads();
  int before = 0, sum = 0;
  for (int w = 0; w < nw; ++w) {
    const int s = wtot[w];
    before += w < warp ? s : 0;
    sum += s;
  }
  *total = sum;
  return before + incl - v;
}

}  // namespace ds41::cuda::dev
