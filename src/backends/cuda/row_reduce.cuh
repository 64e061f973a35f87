// ds41 backends/cuda: warp / block reductions and launch-size helpers shared by the dense, MoE,
// mHC and Engram kernels (device code only; included by .cu files). Reductions run in a fixed
// shuffle tree, so a given launch is deterministic run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. scratch: at least 32 elements of shared memory; the call synchronises the block.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T t = lane < nw ? scratch[lane] : T(0);
  return warp_sum(t);
}

}  // namespace ds41::cuda::dev

namespace ds41::cuda {

inline unsigned grid_1d(int64_t items, int threads) {
  int64_t b = (items + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 0x7fffffff ? 0x7fffffff : b));
}

}  // namespace ds41::cuda
