// ds41 backends/cuda: block-wide top-k selection of one row with the house tie order
// (src/ops/backend.h): larger score first, equal scores -> lower index first, -inf never selected,
// +inf selected. Used by topk_kernels.cu for the index top-k and the candidate pool.
//
// One CTA per row. Scores map to order-preserving 32-bit keys (-0 folded onto +0, since the CPU
// compares them equal). A radix select (4 passes of 8 bits, shared-memory histograms with
// warp-aggregated atomics) finds the key T of the k-th best entry and take_eq, the number of
// entries equal to T that are selected; the selection is then every entry with key > T plus the
// first take_eq entries with key == T in index order, emitted in ascending index order by a
// block-wide prefix count. NaN scores are never selected (the CPU's order with NaN is unspecified).
// When the row has at most k selectable entries, all of them are taken.
#pragma once

#include <cstdint>

namespace ds41::cuda::sel {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kBatch = 4;  // scores loaded per thread per histogram step

__device__ __forceinline__ bool selectable(float x) { return !isnan(x) && x != -INFINITY; }

// Larger float -> larger key; -0 and +0 share a key.
__device__ __forceinline__ uint32_t order_key(float x) {
  uint32_t u = __float_as_uint(x);
  if (u == 0x80000000u) u = 0u;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct Threshold {
  uint32_t key;     // T
  int64_t take_eq;  // entries with key == T to take (lowest indices first)
  bool take_all;    // at most k selectable entries: take every one
};

// Shared memory of one CTA's selection.
struct SelectShared {
  uint32_t hist[256];
  uint32_t prefix, mask;
  int64_t remaining;
  int take_all;
  uint32_t warp_gt[32], warp_eq[32];
};

// The threshold of the k best entries of load(0..t). All threads of the CTA call it (blockDim a
// multiple of 32, at most 1024); every thread gets the same result.
template <typename Load>
__device__ Threshold select_threshold(const Load& load, int64_t t, int64_t k, SelectShared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nthreads = blockDim.x;
  if (k <= 0) return Threshold{0xffffffffu, 0, false};  // selects nothing (no selectable key is 2^32-1)
  if (tid == 0) {
    sh.prefix = 0u;
    sh.mask = 0u;
    sh.remaining = k;
    sh.take_all = 0;
  }
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = tid; b < 256; b += nthreads) sh.hist[b] = 0u;
    __syncthreads();
    const uint32_t prefix = sh.prefix, mask = sh.mask;
    // kBatch independent loads per thread per step (memory-level parallelism), then the histogram
    // updates; the trip count is uniform over the CTA (full-warp intrinsics).
    for (int64_t base = 0; base < t; base += kBatch * nthreads) {
      float x[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = base + j * nthreads + tid;
        x[j] = i < t ? load(i) : -INFINITY;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const uint32_t key = order_key(x[j]);
        const bool ok = selectable(x[j]) && (key & mask) == prefix;
        const int bin = ok ? static_cast<int>((key >> shift) & 255u) : -1 - lane;  // unique when !ok
        const unsigned peers = __match_any_sync(kFull, bin);
        if (ok && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[bin], static_cast<uint32_t>(__popc(peers)));
      }
    }
    __syncthreads();
    // Warp 0 picks the bin holding the remaining-th best entry: lane L owns the 8 bins
    // 255 - 8L .. 248 - 8L (lane 0 the highest), a warp prefix sum over lanes gives the count above
    // each lane's bins, the first lane whose inclusive count reaches `remaining` scans its 8 bins.
    if (warp == 0) {
      const int hi = 255 - 8 * lane;
      int64_t c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) sum += (c[j] = sh.hist[hi - j]);
      int64_t incl = sum;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int64_t y = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += y;
      }
      const int64_t total = __shfl_sync(kFull, incl, 31);
      if (pass == 0 && total <= k) {
        if (lane == 0) sh.take_all = 1;
      } else {
        const int64_t remaining = sh.remaining;
        const unsigned reach = __ballot_sync(kFull, incl >= remaining);  // nonzero: total >= remaining
        if (lane == __ffs(reach) - 1) {
          int64_t cum = incl - sum;  // entries in higher bins
          int chosen = hi - 7;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (cum + c[j] >= remaining) {
              chosen = hi - j;
              break;
            }
            cum += c[j];
          }
          sh.remaining = remaining - cum;  // entries of the chosen bin still to take
          sh.prefix = prefix | (static_cast<uint32_t>(chosen) << shift);
          sh.mask = mask | (255u << shift);
        }
      }
    }
    __syncthreads();
    if (sh.take_all) break;  // uniform
  }
  Threshold th{sh.prefix, sh.remaining, sh.take_all != 0};
  if (th.take_all) {
    th.key = 0u;
    th.take_eq = 0;
  }
  __syncthreads();  // sh may be reused by the caller
  return th;
}

// Calls emit(i, selected, pos) for every i < t in index order chunks (pos = the entry's rank among
// the selected ones in ascending index order; meaningful when selected). Returns the number
// selected. All threads of the CTA call it.
template <typename Load, typename Emit>
__device__ int64_t select_emit(const Load& load, int64_t t, const Threshold& th, SelectShared& sh,
                               const Emit& emit) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nwarps = blockDim.x / 32;
  const uint32_t lt_mask = (1u << lane) - 1u;
  int64_t run_gt = 0, run_eq = 0;
  float next = tid < t ? load(tid) : -INFINITY;  // the next chunk's score, loaded one chunk ahead
  for (int64_t base = 0; base < t; base += blockDim.x) {
    const int64_t i = base + tid;
    const float x = next;
    if (i + blockDim.x < t) next = load(i + blockDim.x);
    bool gt = false, eq = false;
    if (i < t) {
      if (selectable(x)) {
        const uint32_t key = order_key(x);
        gt = th.take_all || key > th.key;
        eq = !th.take_all && key == th.key;
      }
    }
    const unsigned gt_b = __ballot_sync(kFull, gt), eq_b = __ballot_sync(kFull, eq);
    if (lane == 0) {
      sh.warp_gt[warp] = __popc(gt_b);
      sh.warp_eq[warp] = __popc(eq_b);
    }
    __syncthreads();
    int64_t gt_before = run_gt + __popc(gt_b & lt_mask), eq_before = run_eq + __popc(eq_b & lt_mask);
    int64_t tot_gt = 0, tot_eq = 0;
    for (int w = 0; w < nwarps; ++w) {
      if (w == warp) {
        gt_before += tot_gt;
        eq_before += tot_eq;
      }
      tot_gt += sh.warp_gt[w];
      tot_eq += sh.warp_eq[w];
    }
    if (i < t) {
      const bool s = gt || (eq && eq_before < th.take_eq);
      emit(i, s, gt_before + min(eq_before, th.take_eq));
    }
    run_gt += tot_gt;
    run_eq += tot_eq;
    __syncthreads();  // warp_gt / warp_eq are rewritten by the next chunk
  }
  return run_gt + min(run_eq, th.take_eq);
}

}  // namespace ds41::cuda::sel
