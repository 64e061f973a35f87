// ds41 backends/cuda: the device half of run_rms_norm's reduction for fused kernels: the float64
// sum of squares of a row in exactly run_rms_norm's order (elementwise_kernels.h,
// rms_norm_sum_threads) and its float32 rounding steps, so a fused kernel that normalizes rows
// keeps run_rms_norm's bits whatever its own block size.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/row_reduce.cuh"

namespace ds41::cuda::dev {

// inv = float(1 / sqrt(double(float(ss / dim) + eps))) of the row `get(i)`, i in [0, dim), where ss
// is summed as run_rms_norm with T = sum_threads threads sums it: thread t (< T) adds get(t)^2,
// get(t + T)^2, ... in float64 from 0, each warp reduces by dev::warp_sum, then lanes [0, T / 32) of
// the warp totals by warp_sum. This block (blockDim.x a multiple of 32, T <= 1024) plays those T
// threads in rounds of blockDim.x: thread t is t, t + blockDim.x, ... so every warp of T is one
// warp here with the same lanes and the same shuffle tree. Warps of T past the row add +0.0, which
// changes no sum of squares. Every thread of the block must call it (barriers). scratch: 32 doubles
// of shared memory.
template <typename Get>
__device__ __forceinline__ float rms_inv_like_rms_norm(Get&& get, int64_t dim, int sum_threads, float eps,
                                                       double* scratch) {
  const int lane = threadIdx.x & 31, nw = sum_threads >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  for (int vt = threadIdx.x; vt - lane < sum_threads; vt += blockDim.x) {  // whole warps
    double ss = 0.0;
    for (int64_t i = vt; i < dim; i += sum_threads) {
      const double v = get(i);
      ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) scratch[vt >> 5] = ss;
  }
  __syncthreads();
  double tot = lane < nw ? scratch[lane] : 0.0;
  tot = warp_sum(tot);
  const float mean = static_cast<float>(tot / static_cast<double>(dim));
  return static_cast<float>(1.0 / sqrt(static_cast<double>(mean + eps)));
}

}  // namespace ds41::cuda::dev
