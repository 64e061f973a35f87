// ds41 backends/cuda: L2 prefetch of global memory (prefetch.global.L2): a hint that brings a
// 128-byte line into L2 and hands nothing to the thread, so no register waits for it and a kernel
// may issue it before its PDL wait (pdl.cuh) for data no earlier kernel of the stream writes (the
// weights). Used by the decode GEMVs (linear_kernels.cu, tc_gemv_kernels.cu) to put a warp's whole
// next task in flight at once. A no-op under the host SIMT emulator.
#pragma once

#include <cstdint>

#include "backends/cuda/l2_prefetch_kernels.h"

namespace ds41::cuda::dev {

__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

// Bytes per bulk prefetch of l2_prefetch_chunks.
constexpr int64_t kL2Chunk = int64_t{16} << 10;

// Chunks part, part + parts, ... of r's regions laid end to end (up to cap bytes, kL2Chunk each):
// cp.async.bulk.prefetch.L2 on sm_90 (16-byte aligned, whole 16-byte units inside the region), one
// prefetch.global.L2 per 128-byte line otherwise. The callers spread the parts over many SMs: each
// SM's copy engine walks its own bulk prefetches line by line.
__device__ __forceinline__ void l2_prefetch_chunks(const L2Regions& r, int64_t cap, int64_t part, int64_t parts) {
  int64_t at = 0;  // bytes of the earlier regions
  for (int i = 0; i < r.count && at < cap; ++i) {
    const int64_t len = r.bytes[i] < cap - at ? r.bytes[i] : cap - at;
    const uintptr_t base = reinterpret_cast<uintptr_t>(r.ptr[i]);
    for (int64_t off = part * kL2Chunk; off < len; off += parts * kL2Chunk) {
      const uintptr_t a = base + off, e = base + (len < off + kL2Chunk ? len : off + kL2Chunk);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const uintptr_t a16 = (a + 15) & ~uintptr_t{15}, n16 = e > a16 ? (e - a16) & ~uintptr_t{15} : 0;
      if (n16 > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a16), "r"(static_cast<unsigned>(n16))
                     : "memory");
#else
      for (uintptr_t l = a & ~uintptr_t{127}; l < e; l += 128) prefetch_l2(reinterpret_cast<const void*>(l));
#endif
    }
    at += len;
  }
}

}  // namespace ds41::cuda::dev
