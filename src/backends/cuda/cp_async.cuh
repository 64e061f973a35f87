// ds41 backends/cuda: cp.async (sm_80+) — copies from global into shared memory that complete in the
// background, in per-thread groups (commit_group; wait_group N: all but the newest N of the
// thread's groups have landed and are visible to it; other threads see them after a barrier, e.g.
// __syncwarp for a warp's own stages). Under the host SIMT emulator a copy is a plain immediate copy.
// Used by the shared-memory rings of the decode GEMVs (linear_kernels.cu; tc_gemv_kernels.cu for the
// scale words beside its bulk copies, bulk_copy.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace ds41::cuda::dev {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes, L2 only (no L1 allocation); dst and src 16-byte aligned.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// The same with the L2::256B prefetch hint (a miss also brings the next bytes of the 256-byte
// block into L2: the following steps of a streamed weight row are L2 hits).
__device__ __forceinline__ void cp_async16_l2_256(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
// 8 / 4 bytes (through L1: .cg takes 16 only); dst and src aligned to the size.
__device__ __forceinline__ void cp_async8_l2_256(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global.L2::256B [%0], [%1], 8;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else  // the host SIMT emulator
__device__ __forceinline__ void cp_async16(void* dst, const void* src) { std::memcpy(dst, src, 16); }
__device__ __forceinline__ void cp_async16_l2_256(void* dst, const void* src) { std::memcpy(dst, src, 16); }
__device__ __forceinline__ void cp_async8_l2_256(void* dst, const void* src) { std::memcpy(dst, src, 8); }
__device__ __forceinline__ void cp_async4(void* dst, const void* src) { std::memcpy(dst, src, 4); }
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}
#endif

// wait_group depth - 1 for a runtime ring depth of 2, 3, 4 or 8 stages (the immediate must be a
// constant): the oldest of the newest `depth` groups has landed. Other depths wait for all.
__device__ __forceinline__ void cp_async_wait_ring(int depth) {
  switch (depth) {
    case 8: cp_async_wait<7>(); break;
    case 4: cp_async_wait<3>(); break;
    case 3: cp_async_wait<2>(); break;
    case 2: cp_async_wait<1>(); break;
    default: cp_async_wait<0>(); break;
  }
}

}  // namespace ds41::cuda::dev
