// ds41 backends/cuda: one block of the mHC site map's fused form (MODEL_SPEC 3.3): the split-K partial block
// (hc::hc_map_partial_block), its count on its group's counter, and the group's finish by the block that
// completes it (hc::hc_map_finish_row_warp4 at C = 4, one warp per row; else row after row). The map part of
// fused_rows_kernels.cu's hc_site_kernel, and of the launches that carry a site's map as extra blocks
// (HcMapFold: the decode step's dense and expert GEMVs, tc_gemv_kernels.cu), so every form computes pre / post /
// comb with the same operations in the same order (the same geometry: hc::hc_split).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/mhc_device.cuh"

namespace ds41::cuda::dev {

// Map block b of the site's hc::hc_split(n, c, h) grid (b < groups x splits); blockDim.x == hc::kThreads; every
// thread calls it. The site's counters (one per group of hc::kHcRows rows) are zero before and after the call.
template <int kJ, bool kVec, int kC>
__device__ __forceinline__ void hc_site_map_block(const HcSiteArgs& s, int64_t splits, int64_t steps, int64_t b) {
  __shared__ double tot[hc::kMaxC * hc::kMaxC + 2 * hc::kMaxC + 1];
  __shared__ float m[(2 + hc::kMaxC) * hc::kMaxC];
  __shared__ int last;
  const HcMapDeviceArgs& a = s.map;
  double* part = static_cast<double*>(a.workspace);
  hc::hc_map_partial_block<kJ, kVec>(a, splits, steps, part, b);
  const int64_t g = b / splits;
  __threadfence();  // this block's partials, visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(&s.counters[g], 1u);
    last = done + 1 == static_cast<uint32_t>(splits);
    if (last) s.counters[g] = 0;  // zero again for the next call (kernels of the stream run in order)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t r0 = g * hc::kHcRows, r1 = min(a.n, r0 + hc::kHcRows);
  if constexpr (kC == 4) {  // warp w finishes row r0 + w (kHcRows == the block's 8 warps)
    static_assert(hc::kHcRows == hc::kThreads / 32, "one warp per row of a group");
    __shared__ double wtot[hc::kHcRows][32];
    __shared__ float wm[hc::kHcRows][32];
    const int w = threadIdx.x >> 5;
    if (r0 + w < r1) hc::hc_map_finish_row_warp4(a, splits, part, r0 + w, wtot[w], wm[w]);
  } else {
    for (int64_t r = r0; r < r1; ++r) {
      hc::hc_map_finish_row<kC>(a, splits, part, r, tot, m);
      __syncthreads();  // the tail's warps are done with m before the next row
    }
  }
}

}  // namespace ds41::cuda::dev
