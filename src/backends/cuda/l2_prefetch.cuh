// ds41 backends/cuda: L2 prefetch of global memory (prefetch.global.L2): a hint that brings a
// 128-byte line into L2 and hands nothing to the thread, so no register waits for it and a kernel
// may issue it before its PDL wait (pdl.cuh) for data no earlier kernel of the stream writes (the
// weights). Used by the CUDA-core persistent GEMV (linear_kernels.cu) for its first W rows. (Whole
// tasks of the tensor-core GEMV prefetched this way measured slower on the H100: docs/gpu_kernels.md.)
// A no-op under the host SIMT emulator.
#pragma once

namespace ds41::cuda::dev {

__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

}  // namespace ds41::cuda::dev
