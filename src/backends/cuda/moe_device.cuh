// ds41 backends/cuda: the device code of the MoE router (moe_kernels.cu has the design notes),
// shared by router_kernel (moe_kernels.cu) and the fused routing kernel (fused_moe_kernels.cu), so
// both select and weigh experts with the same operations in the same order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::moe {

constexpr int kThreads = 256;
constexpr int kChunk = 256;  // pairs per bucketing chunk (one block)
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxK = 32;

__device__ __forceinline__ float softplus_ref(float x) {
  const double d = x;
  return static_cast<float>((d < 0.0 ? 0.0 : d) + log1p(exp(-fabs(d))));
}

// (v, i) better than (bv, bi) in the house tie order; i < 0 means "none".
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// The two-stage selection (route_row): each thread holds at most kPickPer experts (e = t, t + 256),
// each warp picks its own k best, then warp 0 picks the k best of those 8 k candidates.
constexpr int kPickPer = 2;
constexpr int64_t kPickMaxK = 8;
constexpr int kPickCands = (kThreads / 32) * static_cast<int>(kPickMaxK);
static_assert(kPickCands <= 32 * kPickPer, "warp 0 holds every candidate in its lanes' pairs");

// The shared memory of route_row.
struct RouterSmem {
  float sc[kMaxExperts];
  float bs[kMaxExperts];
  float wv[kThreads / 32];
  int wi[kThreads / 32];
  int sel[kMaxK];
  float wsel[kMaxK];  // the selected experts' weights (route_row's last step), for a caller in the block
  float cand_v[kPickCands];  // the two-stage selection's candidates: warp w's picks at kPickMaxK w
  int cand_i[kPickCands];
  float cand_v2[kPickMaxK];
  unsigned long long cand_key[kPickCands];  // the sorted selection's candidates (pick_key64): warp w's at kPickMaxK w
};

// The warp's best (bv, bi) of its lanes' by the xor tree: every lane ends with the same pair, since
// better() is a total order on distinct indices (-1, none, never wins).
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

// The warp's largest (kMax) or smallest unsigned value: redux.sync (sm_80+); a xor tree of shuffles under the host
// emulator (the same result).
template <bool kMax>
__device__ __forceinline__ uint32_t warp_extreme_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return kMax ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = (kMax ? w > v : w < v) ? w : v;
  }
  return v;
#endif
}

// The bias row r routes with: bias_vl for an image row (vl[r], where bias_vl is given), else bias (nullable).
__device__ __forceinline__ const float* row_bias(const float* bias, const float* bias_vl, const uint8_t* vl,
                                                 int64_t r) {
  return (vl && vl[r] && bias_vl) ? bias_vl : bias;
}

// A float's order as an unsigned key for redux.sync: larger value, larger key; equal values (-0 and +0 too),
// equal keys; NaN key 1, below every number (-inf's key is 0x007fffff); 0 is kept for "none".
__device__ __forceinline__ uint32_t pick_key(float v) {
  if (v != v) return 1u;
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One pick of a warp: the best (v, i) over the lanes' pairs (value, index), -1 indices never: the largest
// key, then the smallest index (better()'s order for numbers; a NaN below every number). Each lane's own best
// first, then the warp's largest key (redux.sync max) and the smallest index among the lanes holding it
// (redux.sync min): two reductions instead of five rounds of two shuffles (the router's picks are on the
// decode's critical path). bv is the winning lane's own value.
__device__ __forceinline__ void warp_pick(const float (&v)[kPickPer], const int (&id)[kPickPer], float& bv,
                                          int& bi) {
  uint32_t key = id[0] >= 0 ? pick_key(v[0]) : 0u;
  bv = v[0];
  bi = id[0];
#pragma unroll
  for (int u = 1; u < kPickPer; ++u) {
    const uint32_t ku = id[u] >= 0 ? pick_key(v[u]) : 0u;
    if (ku > key || (ku == key && ku != 0u && (bi < 0 || id[u] < bi))) {
      key = ku;
      bv = v[u];
      bi = id[u];
    }
  }
  const uint32_t kmax = warp_extreme_u32<true>(key);
  const uint32_t cand = (key == kmax && key != 0u) ? static_cast<uint32_t>(bi) : 0xffffffffu;
  const uint32_t imin = warp_extreme_u32<false>(cand);
  const int src = __ffs(__ballot_sync(0xffffffffu, cand == imin && imin != 0xffffffffu)) - 1;
  bv = __shfl_sync(0xffffffffu, bv, src < 0 ? 0 : src);
  bi = imin == 0xffffffffu ? -1 : static_cast<int>(imin);
}

// k picks of one warp over its lanes' pairs (an entry with index -1 is none): pick j to out_v / out_i
// [j] (lane 0 writes), the owner lane drops it before the next pick.
__device__ __forceinline__ void warp_picks(float (&v)[kPickPer], int (&id)[kPickPer], int64_t k, float* out_v,
                                           int* out_i) {
  const int lane = threadIdx.x & 31;
  for (int64_t j = 0; j < k; ++j) {
    float bv;
    int bi;
    warp_pick(v, id, bv, bi);
    if (lane == 0) {
      out_v[j] = bv;
      out_i[j] = bi;
    }
#pragma unroll
    for (int u = 0; u < kPickPer; ++u)
      if (bi >= 0 && id[u] == bi) id[u] = -1;
  }
}

// The house order of (value, index) as one unsigned 64-bit key, larger = picked first: pick_key(v) above,
// then the smaller index (its complement below); 0 for "none" (id < 0), below every entry.
__device__ __forceinline__ uint64_t pick_key64(float v, int id) {
  if (id < 0) return 0;
  return (static_cast<uint64_t>(pick_key(v)) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
}
// The index of a pick_key64 key (-1 for "none").
__device__ __forceinline__ int pick_index(uint64_t key) {
  return key == 0 ? -1 : static_cast<int>(~static_cast<uint32_t>(key));
}

__device__ __forceinline__ uint64_t shfl_xor_u64(uint64_t v, int m) {
  const uint32_t lo = __shfl_xor_sync(0xffffffffu, static_cast<uint32_t>(v), m);
  const uint32_t hi = __shfl_xor_sync(0xffffffffu, static_cast<uint32_t>(v >> 32), m);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The warp's largest pick_key64 key (every lane gets it): the largest high word by redux.sync, then the
// largest low word among the lanes holding it.
__device__ __forceinline__ uint64_t warp_max_key64(uint64_t key) {
  const uint32_t hi = warp_extreme_u32<true>(static_cast<uint32_t>(key >> 32));
  const uint32_t lo = warp_extreme_u32<true>(static_cast<uint32_t>(key >> 32) == hi ? static_cast<uint32_t>(key) : 0u);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// A warp's 64 keys (element lane in k[0], element 32 + lane in k[1]) sorted descending by a bitonic network:
// element 0 (lane 0's k[0]) the largest. 21 compare-exchange stages, 20 of them one shuffle pair per slot:
// a pick list in ~21 dependent shuffles instead of k rounds of reductions, votes and shuffles (the router's
// picks: a single block's chain on the decode step's critical path). Measured on an H100 (session of
// 2026-12-07 14:51 UTC) it was not faster than the picks (~440 instructions per sort, 64-bit compares), so
// it is opt-in (DS41_ROUTE_SORT=1). Keys are distinct except for "none" (0), so the order is the same total
// order as the picks'.
__device__ __forceinline__ void warp_sort64_desc(uint64_t (&k)[2]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int size = 2; size <= 64; size <<= 1) {
#pragma unroll
    for (int j = size >> 1; j > 0; j >>= 1) {
      if (j == 32) {  // elements lane and lane + 32 (size 64: the whole list descends)
        const uint64_t a = k[0], b = k[1];
        k[0] = a > b ? a : b;
        k[1] = a > b ? b : a;
        continue;
      }
#pragma unroll
      for (int sl = 0; sl < 2; ++sl) {
        const int i = lane + 32 * sl;
        const uint64_t o = shfl_xor_u64(k[sl], j);
        // The pair (i, i ^ j) of a block of `size` that descends where (i & size) == 0 (ascends otherwise):
        // its lower element keeps the larger key in a descending block.
        const bool keep_max = ((i & j) == 0) == ((i & size) == 0);
        k[sl] = keep_max ? (k[sl] > o ? k[sl] : o) : (k[sl] < o ? k[sl] : o);
      }
    }
  }
}

// A pick's routing weight, by every lane of a warp: lane j holds pick j's expert e (-1: none) and unbiased score
// s (j < k <= 32). The picks' scores are summed in pick order (every lane adds the same values in the same order:
// the same float), then s / (sum + 1e-20) * route_scale, 0 for none: route_row's weights, also the MoE entry's
// split routing's (tc_gemv_kernels.cu split_route_tail).
__device__ __forceinline__ float pick_weight(int e, float s, int k, float route_scale) {
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int ej = __shfl_sync(0xffffffffu, e, j);
    const float v = __shfl_sync(0xffffffffu, s, j);
    if (ej >= 0) sum = __fadd_rn(sum, v);
  }
  return e >= 0 ? __fmul_rn(__fdiv_rn(s, __fadd_rn(sum, 1e-20f)), route_scale) : 0.0f;
}

// Row r's routing by one kThreads-thread block (every thread calls it: barriers). The k picks are
// the k best of the biased scores in the house tie order (score desc, index asc), -inf never picked
// (a pick without a selectable expert is -1), as the CPU's best_k. two_stage (up to 512 experts and
// 8 picks): every warp picks the k best of its experts at once, then warp 0 the k best of their
// 8 k picks: two barriers in all. Otherwise k block-wide rounds, each a warp tree, a barrier, thread
// 0's scan of the warps' bests and a barrier (ncu: the router as a 12 us single-block kernel on the
// decode's critical path). The same picks either way for every input without NaN.
// sel_mode: 0 the block-wide rounds; 1 the two stages by k picks each (warp_picks); 2 the two stages by
// sorting (warp_sort64_desc: each warp's 64 keys, then warp 0's 64 candidates; the first k are the picks).
// Modes 1 and 2 give the same picks in the same order (one total order of pick_key64 keys).
__device__ __forceinline__ void route_row(const float* __restrict__ logits, int64_t E,
                                          const float* __restrict__ bias, const float* __restrict__ bias_vl,
                                          const uint8_t* __restrict__ vl, int64_t k, float temp,
                                          float route_scale, int32_t* __restrict__ experts,
                                          float* __restrict__ weights, int64_t r, RouterSmem& sm,
                                          int sel_mode) {
  float* sc = sm.sc;
  float* bs = sm.bs;
  float* wv = sm.wv;
  int* wi = sm.wi;
  int* sel = sm.sel;
  const float* bvec = row_bias(bias, bias_vl, vl, r);
  // Two experts per thread and round (e and e + blockDim.x): all four loads first, then the two fp64
  // softplus chains side by side (independent: the scheduler interleaves them), so a thread with two
  // experts (E = 384: warps 0-3) waits one chain's latency, not two (ncu, H100: the router one block of
  // ~11 cycles per issued instruction, latency bound). Each expert's operations are unchanged.
  const int64_t stride = blockDim.x;
  for (int64_t e0 = threadIdx.x; e0 < E; e0 += 2 * stride) {
    const int64_t e1 = e0 + stride;
    const bool two = e1 < E;
    const float lg0 = logits[r * E + e0], b0 = bvec ? bvec[e0] : 0.0f;
    const float lg1 = two ? logits[r * E + e1] : 0.0f, b1 = (two && bvec) ? bvec[e1] : 0.0f;
    const float s0 = sqrtf(softplus_ref(__fdiv_rn(lg0, temp)));
    const float s1 = sqrtf(softplus_ref(__fdiv_rn(lg1, temp)));
    sc[e0] = s0;
    bs[e0] = __fadd_rn(s0, b0);
    if (two) {
      sc[e1] = s1;
      bs[e1] = __fadd_rn(s1, b1);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float ninf = -__int_as_float(0x7f800000);
  if (E <= kPickPer * static_cast<int64_t>(blockDim.x) && k <= kPickMaxK && blockDim.x == kThreads &&
      sel_mode == 2) {
    static_assert(kPickPer == 2 && kThreads / 32 * kPickMaxK == 64, "a warp's 64 keys, then 64 candidates");
    uint64_t key[2];
#pragma unroll
    for (int u = 0; u < kPickPer; ++u) {
      const int e = threadIdx.x + u * kThreads;  // this thread's own scores (no other thread's)
      const bool ok = e < E && bs[e] != ninf;    // -inf is never picked
      key[u] = ok ? pick_key64(bs[e], e) : 0;
    }
    warp_sort64_desc(key);
    uint64_t* cand = reinterpret_cast<uint64_t*>(sm.cand_key);
    if (lane < kPickMaxK) cand[warp * kPickMaxK + lane] = lane < k ? key[0] : 0;  // the warp's k best
    __syncthreads();
    if (warp == 0) {  // the k best of the warps' k best (every global pick is among its warp's)
      key[0] = cand[lane];
      key[1] = cand[lane + 32];
      warp_sort64_desc(key);
      if (lane < k) sel[lane] = pick_index(key[0]);
    }
    __syncthreads();
  } else if (E <= kPickPer * static_cast<int64_t>(blockDim.x) && k <= kPickMaxK && blockDim.x == kThreads &&
             sel_mode == 1) {
    float v[kPickPer];
    int id[kPickPer];
#pragma unroll
    for (int u = 0; u < kPickPer; ++u) {
      const int e = threadIdx.x + u * kThreads;
      const bool ok = e < E && bs[e] != ninf;  // -inf is never picked
      v[u] = ok ? bs[e] : 0.0f;
      id[u] = ok ? e : -1;
    }
    warp_picks(v, id, k, sm.cand_v + warp * kPickMaxK, sm.cand_i + warp * kPickMaxK);
    __syncthreads();
    if (warp == 0) {  // the k best of the warps' picks (every global pick is among its warp's k best)
#pragma unroll
      for (int u = 0; u < kPickPer; ++u) {
        const int c = lane + 32 * u;  // candidate c: pick c % kPickMaxK of warp c / kPickMaxK
        const bool ok = c < kPickCands && c % kPickMaxK < k;
        v[u] = ok ? sm.cand_v[c] : 0.0f;
        id[u] = ok ? sm.cand_i[c] : -1;
      }
      warp_picks(v, id, k, sm.cand_v2, sel);
    }
    __syncthreads();
  } else {
    for (int64_t j = 0; j < k; ++j) {
      float bv = 0.0f;
      int bi = -1;
      for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
        const float v = bs[e];
        if (v == ninf) continue;  // -inf (and already selected) entries are never selected
        if (better(v, static_cast<int>(e), bv, bi)) {
          bv = v;
          bi = static_cast<int>(e);
        }
      }
      warp_best(bv, bi);
      if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float v = wv[0];
        int i = wi[0];
        for (int w = 1; w < kThreads / 32; ++w)
          if (better(wv[w], wi[w], v, i)) {
            v = wv[w];
            i = wi[w];
          }
        sel[j] = i;
        if (i >= 0) bs[i] = ninf;
      }
      __syncthreads();
    }
  }
  // The weights: the sum of the picks' scores in pick order (every thread of warp 0 adds the same
  // values in the same order: the same float), then pick j's division by thread j (k divisions side by
  // side instead of one thread's chain of k). The same operations per weight as one thread's loop.
  if (warp == 0) {
    // Lane j loads pick j's score (k <= kMaxK = 32: one load per lane, side by side); pick_weight adds them
    // by shuffles in pick order.
    static_assert(kMaxK <= 32, "one pick per lane of warp 0");
    const int sj = lane < k ? sel[lane] : -1;
    const float scj = sj >= 0 ? sc[sj] : 0.0f;
    const float w = pick_weight(sj, scj, static_cast<int>(k), route_scale);
    if (lane < k) {
      experts[r * k + lane] = sj;
      weights[r * k + lane] = w;
      sm.wsel[lane] = w;
    }
  }
}

}  // namespace ds41::cuda::moe
