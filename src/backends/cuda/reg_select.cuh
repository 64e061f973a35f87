// ds41 backends/cuda: the register select — the k best of a row of up to 256 x KPT scores by one CTA of 256
// threads with every key in registers, in the house tie order of src/ops/backend.h (larger score first, equal
// scores lower index first, -inf and NaN never selected, +inf selected; -0 folded onto +0). The same Threshold
// as radix_select.cuh's selects (the k-th key T and the number of ties at T to take), the same emit calls.
//
// NT = 256 by default (KPT 4 / 8 / 16 / 24 / 40); DS41_TOPK_REG_THREADS=512 takes 512 (KPT 2 / 4 / 8 / 12 / 20:
// half the compares per thread and round, twice the warps per barrier).
//
// Why: the radix selects build shared-memory histograms (warp-aggregated atomics, bin scans, a copy of the
// chosen bin) and emit in chunks of blockDim entries with two barriers each. At the decode shapes (4,096
// ratio-1 scores, k = 512) that one-CTA chain took 26 us on an H100 (ncu, session of 2026-12-07 09:38 UTC), on
// the critical path of every index layer. Here each thread keeps its KPT keys in registers and T is found by a
// radix-4 search over the key's 32 bits: in round r every thread counts its keys >= T | d << (30 - 2r) for d
// = 1, 2, 3 (comparisons only), a warp reduction (redux.sync) and one barrier give the block's three counts,
// and T takes the largest d whose count still reaches k. 16 rounds, one barrier each, no atomics; the
// emit is one more barrier (the warps' counts of keys > T and == T) and a ballot per register.
//
// Layout: warp w owns the contiguous entries [32 KPT w, 32 KPT (w + 1)); lane l holds entry 32 KPT w + 32 j + l
// in key[j] (coalesced loads, KPT of them in flight per thread), so a warp walks its entries in index order and
// the emit ranks are running ballot counts plus the warps before it.
#pragma once

#include <cstdint>

#include "backends/cuda/radix_select.cuh"

namespace ds41::cuda::sel {

constexpr int kRegThreads = 256;   // the default CTA
constexpr int kRegMaxWarps = 16;   // CTAs of up to 512 threads (DS41_TOPK_REG_THREADS=512)

struct RegShared {
  uint2 cnt[2][kRegMaxWarps];  // a round's per-warp counts (double-buffered by round: one barrier per round)
  uint2 warp_ge[kRegMaxWarps];  // the emit's per-warp counts (x: keys > T, y: keys == T)
};

__device__ __forceinline__ uint32_t warp_sum_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(kFull, v);
#else
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
#endif
}

// The sums over the block of the threads' (a, b) (each field of a and b a 16-bit count: block totals < 2^16).
// All threads get the sums; buf alternates between calls so that one barrier suffices (a thread writes buffer
// p again only after the next call's barrier, which every thread reaches after reading buffer p).
template <int NW>
__device__ __forceinline__ uint2 block_sum2(uint32_t a, uint32_t b, RegShared& sh, int buf) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  a = warp_sum_u32(a);
  b = warp_sum_u32(b);
  if (lane == 0) sh.cnt[buf][warp] = make_uint2(a, b);
  __syncthreads();
  uint2 s = make_uint2(0u, 0u);
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const uint2 v = sh.cnt[buf][w];
    s.x += v.x;
    s.y += v.y;
  }
  return s;
}

// The k best of load(0..m), m <= NT KPT <= 65,535, k >= 0: calls emit(i, selected, pos) for every i < m in
// ascending index order per warp (pos: the entry's rank among the selected in ascending index order, meaningful
// when selected) and returns the number selected (min(k, selectable entries)). blockDim.x == NT (256 or 512); all
// threads call it. Ends with a barrier (sh may be reused).
template <int KPT, int NT, typename Load, typename Emit>
__device__ int64_t reg_select(const Load& load, int64_t m, int64_t k, RegShared& sh, const Emit& emit) {
  static_assert(KPT >= 1 && KPT * NT < 65536, "16-bit packed counts");
  static_assert(NT % 32 == 0 && NT / 32 <= kRegMaxWarps, "CTA size");
  constexpr int NW = NT / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t base = static_cast<int64_t>(warp) * 32 * KPT + lane;
  uint32_t key[KPT];  // 0: not selectable (every selectable key is >= order_key(-FLT_MAX) = 2^23)
  {
    float x[KPT];
#pragma unroll
    for (int j = 0; j < KPT; ++j) {
      const int64_t i = base + 32 * j;
      x[j] = i < m ? load(i) : -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < KPT; ++j) key[j] = selectable(x[j]) ? order_key(x[j]) : 0u;
  }
  const uint32_t kk = k < 65536 ? static_cast<uint32_t>(k) : 65536u;  // counts never exceed m < 2^16
  // Round 0 also counts the selectable keys: at most k of them, every one is taken (take_all).
  uint32_t n0 = 0;
#pragma unroll
  for (int j = 0; j < KPT; ++j) n0 += key[j] != 0u ? 1u : 0u;
  uint32_t T = 0u;
  bool take_all = false;
#pragma unroll 1
  for (int r = 0; r < 16; ++r) {
    const int shift = 30 - 2 * r;
    const uint32_t c1 = T | (1u << shift), c2 = T | (2u << shift), c3 = T | (3u << shift);
    uint32_t n1 = 0, n2 = 0, n3 = 0;
#pragma unroll
    for (int j = 0; j < KPT; ++j) {
      n1 += key[j] >= c1 ? 1u : 0u;
      n2 += key[j] >= c2 ? 1u : 0u;
      n3 += key[j] >= c3 ? 1u : 0u;
    }
    const uint2 s = block_sum2<NW>(n1 | (n2 << 16), n3 | (r == 0 ? n0 << 16 : 0u), sh, r & 1);
    if (r == 0 && (s.y >> 16) <= kk) {  // uniform
      take_all = true;
      break;
    }
    const uint32_t s1 = s.x & 0xffffu, s2 = s.x >> 16, s3 = s.y & 0xffffu;
    T = s3 >= kk ? c3 : (s2 >= kk ? c2 : (s1 >= kk ? c1 : T));
  }
  // T: the k-th best key (the largest key with at least k keys >= it); keys > T number < k.
  uint32_t ngt = 0, neq = 0;
#pragma unroll
  for (int j = 0; j < KPT; ++j) {
    ngt += (take_all ? key[j] != 0u : key[j] > T) ? 1u : 0u;
    neq += (!take_all && key[j] == T) ? 1u : 0u;
  }
  ngt = warp_sum_u32(ngt);
  neq = warp_sum_u32(neq);
  if (lane == 0) sh.warp_ge[warp] = make_uint2(ngt, neq);
  __syncthreads();
  int64_t run_gt = 0, run_eq = 0, tot_gt = 0, tot_eq = 0;
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const uint2 v = sh.warp_ge[w];
    if (w < warp) {
      run_gt += v.x;
      run_eq += v.y;
    }
    tot_gt += v.x;
    tot_eq += v.y;
  }
  const int64_t take_eq = take_all ? 0 : k - tot_gt;  // >= 1 when not take_all
  const uint32_t lt_mask = (1u << lane) - 1u;
#pragma unroll
  for (int j = 0; j < KPT; ++j) {
    const int64_t i = base + 32 * j;
    const bool gt = take_all ? key[j] != 0u : key[j] > T;
    const bool eq = !take_all && key[j] == T;
    const unsigned gt_b = __ballot_sync(kFull, gt), eq_b = __ballot_sync(kFull, eq);
    if (i < m) {
      const int64_t gt_before = run_gt + __popc(gt_b & lt_mask), eq_before = run_eq + __popc(eq_b & lt_mask);
      const bool s = gt || (eq && eq_before < take_eq);
      emit(i, s, gt_before + min(eq_before, take_eq));
    }
    run_gt += __popc(gt_b);
    run_eq += __popc(eq_b);
  }
  __syncthreads();
  return tot_gt + min(tot_eq, take_eq);
}

}  // namespace ds41::cuda::sel
