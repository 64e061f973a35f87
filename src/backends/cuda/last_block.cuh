// ds41 backends/cuda: the "last block" count of a grid whose blocks each write partial results that the
// block counting last reads and finishes (the decode attention's fused split combine, the MoE entry's
// routing tail): every thread of every block calls it once its writes are issued; it returns true,
// block-uniform, in the block that completes the count (which zeroes the counter for the next call: the
// kernels of a stream run in order), whose threads may then read every block's writes through L2
// (__ldcg). Why a helper: the ordering is the subtle part, and both forms below must stay the same.
//
// one_fence (launch.h one_fence_enabled, DS41_ONE_FENCE=1, opt-in): a barrier, then thread 0 alone
// fences (fence.sc.gpu, cumulative: the barrier ordered the block's writes before it) and counts; in the
// last block thread 0 fences again after its count before the barrier that releases the block: the
// pattern of cooperative groups' grid sync. Otherwise (the default) every thread fences before the count
// and after it (ncu put 4 % of the attention kernel's stall samples on the 256 threads' MEMBAR.SC; the one
// fence measured neutral in decode). Which block is last, and what it reads, are the same either way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

__device__ __forceinline__ bool count_last_block(uint32_t* counter, uint32_t total, bool one_fence) {
  __shared__ bool last;
  if (!one_fence) __threadfence();  // this thread's writes, visible before the block is counted
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    if (one_fence) __threadfence();  // the block's writes (ordered before it by the barrier)
    const uint32_t done = atomicAdd(counter, 1u);
    last = done + 1 == total;
    if (last) {
      *counter = 0;  // zero again for the next call
      if (one_fence) __threadfence();  // the other blocks' writes, visible to the block after the barrier
    }
  }
  __syncthreads();
  if (!last) return false;  // block-uniform
  if (!one_fence) __threadfence();
  return true;
}

}  // namespace ds41::cuda::dev
