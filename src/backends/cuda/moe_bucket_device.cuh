// ds41 backends/cuda: the bucketing of a routing's n * k (row, slot) pairs by expert in one block
// (n * k <= moe::kChunk): the tail of the fused routing kernel (fused_moe_kernels.cu moe_route_kernel)
// and of the MoE entry kernel (tc_gemv_kernels.cu), so both write the same integers. Each pair's rank
// among the earlier pairs of its expert, a shared-memory histogram, an exclusive scan over the
// experts, positions base + rank: equal to bucket_count / bucket_scan / bucket_place by construction
// (the stable order by expert, then row and slot).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/block_scan.cuh"
#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/moe_device.cuh"

namespace ds41::cuda::moe {

// Writes a.offsets (E + 1), a.perm_rows / a.perm_weight (by position), a.slot_pos (by pair). alone: the
// pairs are the block's own picks of one row still in sm (sel / wsel: no L2 round trip), else they are
// read from a.experts / a.weights through L2 (other blocks wrote them; the caller fenced and counted).
// ex: kChunk ints, part: blockDim.x ints of shared memory; sm.bs is reused as the histogram. Every
// thread of the block calls it (barriers); blockDim.x >= n * k.
__device__ __forceinline__ void bucket_pairs(const MoeRouteArgs& a, RouterSmem& sm, int* ex, int* part, bool alone) {
  const int64_t E = a.n_experts, k = a.k;
  if (alone && a.n == 1) {
    // One row's picks (a decode step: the MoE entry, a one-row route): the same integers from the k picks
    // alone, without the histogram, the scan and their barriers. offsets[i] = the valid picks of an expert
    // below i (offsets[E]: all valid picks); pick t's position = the valid picks ordered before it (a
    // lower expert, or the same expert at an earlier slot): the stable order by expert, then slot.
    for (int64_t i = threadIdx.x; i <= E; i += blockDim.x) {
      int below = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int e = sm.sel[j];
        below += (e >= 0 && e < E && e < i) ? 1 : 0;
      }
      a.offsets[i] = below;
    }
    const int64_t t = threadIdx.x;
    if (t < k) {
      const int e = sm.sel[t];
      if (e < 0 || e >= E) {
        a.slot_pos[t] = -1;
      } else {
        int pos = 0;
        for (int64_t j = 0; j < k; ++j) {
          const int f = sm.sel[j];
          pos += (f >= 0 && f < E && (f < e || (f == e && j < t))) ? 1 : 0;
        }
        a.perm_rows[pos] = 0;
        a.perm_weight[pos] = sm.wsel[t];
        a.slot_pos[t] = pos;
      }
    }
    return;
  }
  int* cnt = reinterpret_cast<int*>(sm.bs);  // the router's scratch, free now: E ints
  const int t = threadIdx.x;
  const int64_t pairs = a.n * k;
  const int e = t < pairs ? (alone ? sm.sel[t] : __ldcg(a.experts + t)) : -1;
  const bool valid = e >= 0 && e < E;
  ex[t] = valid ? e : -1;
  for (int64_t i = t; i < E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  int rank = 0;
  if (valid) {
    for (int u = 0; u < t; ++u) rank += ex[u] == e;
    atomicAdd(&cnt[e], 1);  // the count is order-independent
  }
  __syncthreads();
  // Exclusive scan of cnt: thread t owns a contiguous range of experts.
  const dev::ThreadRange tr = dev::thread_range(E);
  int s = 0;
  for (int64_t i = tr.begin; i < tr.end; ++i) s += cnt[i];
  int total = 0;
  int run = dev::block_exclusive_scan_shfl(s, part, &total);  // one barrier (integers: any order)
  for (int64_t i = tr.begin; i < tr.end; ++i) {
    const int c = cnt[i];
    cnt[i] = run;  // the expert's base
    a.offsets[i] = run;
    run += c;
  }
  if (t == 0) a.offsets[E] = total;
  __syncthreads();
  if (t < pairs) {
    if (!valid) {
      a.slot_pos[t] = -1;
    } else {
      const int64_t pos = static_cast<int64_t>(cnt[e]) + rank;
      a.perm_rows[pos] = t / k;
      a.perm_weight[pos] = alone ? sm.wsel[t] : __ldcg(a.weights + t);
      a.slot_pos[t] = pos;
    }
  }
}

}  // namespace ds41::cuda::moe
