// ds41 backends/cuda: the device half of programmatic dependent launch (launch.h has the
// contract). Both are no-ops below sm_90, on a launch without the PDL attribute, and under the
// host SIMT emulator.
#pragma once

namespace ds41::cuda::dev {

// Waits until every kernel earlier in the stream has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream be scheduled now (it still waits for this one in pdl_wait).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The usual prologue of a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_trigger();
}

}  // namespace ds41::cuda::dev
