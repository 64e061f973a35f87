// ds41 backends/cuda: the bulk copy engine (sm_90: cp.async.bulk global -> shared) completing on a
// shared-memory mbarrier. One instruction moves a contiguous run of bytes (16-byte aligned source and
// destination, a multiple of 16 bytes) in the background; the barrier's phase completes when the
// bytes announced by arrive.expect_tx have landed and the expected arrivals (one here) were made.
// A waiter then sees the bytes (the barrier's completion orders them). Used by the decode GEMV's
// bulk weight ring (tc_gemv_kernels.cu). Under the host SIMT emulator a copy is an immediate memcpy
// and a barrier is a no-op: the emulator checks the data path, not the asynchrony.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace ds41::cuda::dev {

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ unsigned bulk_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// A barrier expecting `count` arrivals per phase; then fence.mbarrier_init so the copy engine sees it.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bulk_smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// This thread's arrival, announcing `bytes` of copies that complete on the barrier's current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bulk_smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait_parity(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT_%=;\n"
      "}\n" ::"r"(bulk_smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned), completing on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          bulk_smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(bulk_smem_addr(bar))
      : "memory");
}
#else  // the host SIMT emulator
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned) { *bar = 0; }
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t*, unsigned) {}
__device__ __forceinline__ void mbar_wait_parity(uint64_t*, unsigned) {}
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, uint64_t*) {
  std::memcpy(dst, src, bytes);
}
#endif

}  // namespace ds41::cuda::dev
