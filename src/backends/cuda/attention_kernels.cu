// ds41 backends/cuda: sparse attention core (MODEL_SPEC 3.4.7) over per-row entry lists (window rows
// plus selected compressed entries, or prefill rows): s_j = scale * q_h . v_j, the sink enlarging
// the denominator only, a row without entries -> 0. Single shared latent: each entry is key and value.
//
// Two kernels, both with an online softmax (running max m, running denominator l, accumulator
// rescaled when m grows; equal to the CPU's two-pass max-then-sum form up to rounding):
// - tiled (more than 16 rows: prefill): one CTA per (query row, group of kHeads heads); the group
//   shares the row's entries, so each tile of kTile entries is loaded into shared memory once for
//   kHeads heads; m is seeded with the sink and l with exp(sink - sink) = 1; scores are warp dot
//   products, P.V keeps kHeads x ceil(head_dim / 256) float accumulators per thread.
// - split (up to 16 rows: decode): one CTA per (row, kSplitHeads heads), its warps splitting the
//   row's entries (no barrier in the loop, the next row prefetched), merged at the end; head_dim
//   128 k with aligned rows takes sparse_attention_split_vec_kernel (float4 lanes, fmaf).
//
// Float accumulation (the CPU uses double): the output is a convex combination of <= 640 entries, so
// the float sums add a relative error of at most ~640 * 2^-24 ~ 4e-5 of max|v| (typically ~1e-6);
// the parity test's tolerance (tests/parity/cuda/attention_parity_test.cpp) says so.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/sparse_attention_tc_kernels.h"
#include "backends/cuda/last_block.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rope_table.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kHeads = 4;     // heads per CTA
constexpr int kTile = 16;     // entries per shared-memory tile
constexpr int kMaxDim = 512;  // head_dim limit (registers: kMaxDim / kThreads per head)
constexpr int kDimPerThread = kMaxDim / kThreads;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

size_t smem_bytes(int64_t d) {
  return sizeof(float) * (static_cast<size_t>(kHeads + kTile) * d + kHeads * kTile + 2 * kHeads);
}

__global__ void __launch_bounds__(kThreads)
    sparse_attention_kernel(int64_t n_heads, int64_t d, const float* __restrict__ q,
                            const int64_t* __restrict__ kv_offsets, const int32_t* __restrict__ kv_index,
                            const float* __restrict__ kv, const float* __restrict__ sink, float scale,
                            float* __restrict__ out) {
  dev::pdl_enter();
  extern __shared__ float smem[];
  float* q_s = smem;                     // [kHeads][d]
  float* kv_s = q_s + kHeads * d;        // [kTile][d]
  float* p_s = kv_s + kTile * d;         // [kHeads][kTile]: scores, then probabilities
  float* corr_s = p_s + kHeads * kTile;  // [kHeads]: rescale factor of this tile
  float* l_s = corr_s + kHeads;          // [kHeads]: final denominators

  const int64_t groups = (n_heads + kHeads - 1) / kHeads;
  const int64_t r = blockIdx.x / groups;
  const int64_t h0 = (blockIdx.x % groups) * kHeads;
  const int nh = static_cast<int>(min(static_cast<int64_t>(kHeads), n_heads - h0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t k0 = kv_offsets[r], k1 = kv_offsets[r + 1];
  float* o = out + (r * n_heads + h0) * d;

  if (k1 <= k0) {  // a row without entries yields 0 (uniform over the CTA)
    for (int64_t i = tid; i < nh * d; i += kThreads) o[i] = 0.0f;
    return;
  }
  const float* qr = q + (r * n_heads + h0) * d;
  for (int64_t i = tid; i < kHeads * d; i += kThreads) q_s[i] = i < nh * d ? qr[i] : 0.0f;

  // Softmax state of head `warp` (warps 0..kHeads-1, replicated over lanes).
  float m = warp < nh ? sink[h0 + warp] : 0.0f;
  float l = 1.0f;
  float acc[kHeads][kDimPerThread];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
#pragma unroll
    for (int j = 0; j < kDimPerThread; ++j) acc[h][j] = 0.0f;

  for (int64_t e0 = k0; e0 < k1; e0 += kTile) {
    const int ne = static_cast<int>(min(static_cast<int64_t>(kTile), k1 - e0));
    for (int64_t i = tid; i < ne * d; i += kThreads) {
      const int64_t e = i / d, c = i % d;
      kv_s[i] = kv[static_cast<int64_t>(kv_index[e0 + e]) * d + c];
    }
    __syncthreads();
    // Scores: one warp per (head, entry) pair, lanes strided over head_dim.
    for (int p = warp; p < kHeads * kTile; p += kWarps) {
      const int h = p / kTile, e = p % kTile;
      if (h < nh && e < ne) {  // uniform over the warp
        float s = 0.0f;
        for (int64_t c = lane; c < d; c += 32) s += q_s[h * d + c] * kv_s[e * d + c];
        s = warp_sum(s);
        if (lane == 0) p_s[p] = s * scale;
      } else if (lane == 0) {
        p_s[p] = -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax update: warp h handles head h, lanes over the tile's entries.
    if (warp < kHeads) {
      const float s = lane < kTile ? p_s[warp * kTile + lane] : -INFINITY;
      const float new_m = fmaxf(m, warp_max(s));
      const float p = (lane < kTile && s != -INFINITY) ? expf(s - new_m) : 0.0f;
      const float sum = warp_sum(p);
      const float corr = new_m == m ? 1.0f : expf(m - new_m);
      l = l * corr + sum;
      m = new_m;
      if (lane < kTile) p_s[warp * kTile + lane] = p;
      if (lane == 0) corr_s[warp] = corr;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kDimPerThread; ++j) {
      const int64_t c = tid + j * kThreads;
      if (c >= d) break;
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float a = acc[h][j] * corr_s[h];
        for (int e = 0; e < ne; ++e) a += p_s[h * kTile + e] * kv_s[e * d + c];
        acc[h][j] = a;
      }
    }
    __syncthreads();  // the next tile overwrites kv_s and p_s
  }
  if (warp < kHeads && lane == 0) l_s[warp] = l;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kDimPerThread; ++j) {
    const int64_t c = tid + j * kThreads;
    if (c >= d) break;
#pragma unroll
    for (int h = 0; h < kHeads; ++h)
      if (h < nh) o[h * d + c] = acc[h][j] / l_s[h];
  }
}

// Decode-shaped calls (few rows): the tiled kernel would give each row only n_heads / kHeads CTAs
// walking its entries tile after tile. Here a CTA serves (row, kSplitHeads heads, split sp): the
// row's entries [k0 + sp * chunk, k0 + (sp + 1) * chunk) (all of them when splits == 1). Its 8 warps
// split those entries (warp w takes entries w, w + 8, ...), each warp with its own online softmax
// (lanes hold channels lane + 32 j), no barrier until the end, where the warps' states are merged
// in warp order: M = max m_w, L = sum_w l_w exp(m_w - M), acc = sum_w exp(m_w - M) acc_w. The sink
// seeds warp 0 of split 0 only (m = sink, l = 1); the other warps start empty (m = -inf, l = 0).
// splits == 1: out = acc / L. splits > 1 (flash-decoding, at 1..4 rows the (row, head group) CTAs
// alone would leave most SMs idle): (M, L, acc) go to the workspace and sparse_attention_combine_kernel
// merges the splits in split order (deterministic). A split past the row's end writes M = -inf, L = 0
// and no acc (the combine skips it); a row without entries is left to the combine (zeros).
constexpr int kSplitHeads = 2;  // the output loop below picks big_l[0] / big_l[1]
static_assert(kSplitHeads == 2);
constexpr int kLaneDims = kMaxDim / 32;  // channels per lane
constexpr int64_t kSplitMaxRows = 16;    // rows up to which run_sparse_attention takes this kernel
constexpr int64_t kTargetCtas = 264;     // ~2 CTAs per SM on a 132-SM H200
constexpr int64_t kInvariantRowsPerPass = 64;  // row_invariant calls: rows per split + combine pass
constexpr int64_t kMinSplitEntries = 32; // entries per split at least (4 per warp)
constexpr int kCombineThreads = 128;

// A split CTA's place (the block order is (row, split, head group): the head groups of one split,
// which read the same entries, run side by side for L2 reuse) and its entries [e0, e1). The last
// split takes whatever is left, so entries past splits * chunk (a row longer than
// max_entries_per_row claimed) are never dropped.
struct SplitCta {
  int64_t r, sp, h0, e0, e1;
  int nh;
};
// False when the CTA has no entries, after writing what it owes: a row without entries at one split
// yields 0 (d channels per head; uniform over the CTA); a split past the row's end (only sp > 0: chunk
// >= 1) the empty state M = -inf, L = 0; with splits, an empty row is left to the combine (zeros).
__device__ __forceinline__ bool split_cta(int64_t n_heads, int64_t d, const int64_t* __restrict__ kv_offsets,
                                          float* __restrict__ out, int64_t splits, int64_t chunk,
                                          float* __restrict__ part_ml, SplitCta& c) {
  const int64_t groups = (n_heads + kSplitHeads - 1) / kSplitHeads;
  const int64_t rs = blockIdx.x / groups;
  c.r = rs / splits;
  c.sp = rs % splits;
  c.h0 = (blockIdx.x % groups) * kSplitHeads;
  c.nh = static_cast<int>(min(static_cast<int64_t>(kSplitHeads), n_heads - c.h0));
  const int tid = threadIdx.x;
  const int64_t k0 = kv_offsets[c.r], k1 = kv_offsets[c.r + 1];
  if (k1 <= k0) {
    if (splits == 1) {
      float* o = out + (c.r * n_heads + c.h0) * d;
      for (int64_t i = tid; i < c.nh * d; i += kThreads) o[i] = 0.0f;
    }
    return false;
  }
  c.e0 = splits == 1 ? k0 : k0 + c.sp * chunk;
  c.e1 = c.sp == splits - 1 ? k1 : min(k1, c.e0 + chunk);
  if (c.e1 <= c.e0) {
    float* ml = part_ml + ((c.r * splits + c.sp) * n_heads + c.h0) * 2;
    if (tid < c.nh) {
      ml[2 * tid] = -INFINITY;
      ml[2 * tid + 1] = 0.0f;
    }
    return false;
  }
  return true;
}

// q_n_freq > 0: the query's rotation table of row r, run_rope's angle float(pos) * inv_freq[i] in
// float and its cos / sin in double rounded to float, at q_cs[2i], q_cs[2i + 1], computed once per CTA
// (in the lanes' q loads the double sincos took the kernel from 128 to 172 registers: one CTA per SM
// instead of two, measured on an H100). Every thread calls it (a barrier when q_n_freq > 0).
// The split kernels fill it before their PDL wait (split_row gives r from the block index alone): the
// positions are the step plan's upload and inv_freq a weight, written by no kernel of the step (launch.h
// contract 1), so the fp64 sincos chain and its two loads overlap the previous kernel's tail instead of
// leading the CTA's critical path. DS41_PRE_WAIT=0 fills it after the wait (launch.h; the same bits).
__device__ __forceinline__ void q_rope_table(const int64_t* __restrict__ q_pos, const float* __restrict__ q_inv_freq,
                                             int64_t q_n_freq, int64_t r, float* q_cs) {
  if (q_n_freq <= 0) return;  // CTA-uniform
  dev::rope_table_fill(static_cast<float>(q_pos[r]), q_inv_freq, q_n_freq, false, q_cs, threadIdx.x, kThreads);
  __syncthreads();
}

// The row of a split CTA (split_cta's c.r) from the block index alone.
__device__ __forceinline__ int64_t split_row(int64_t n_heads, int64_t splits) {
  const int64_t groups = (n_heads + kSplitHeads - 1) / kSplitHeads;
  return (blockIdx.x / groups) / splits;
}

// The split kernels' prologue: the query's table (table_early: before the PDL wait), then the wait.
__device__ __forceinline__ void split_prologue(const int64_t* __restrict__ q_pos, const float* __restrict__ q_inv_freq,
                                               int64_t q_n_freq, int64_t n_heads, int64_t splits, bool table_early,
                                               float* q_cs) {
  if (table_early) q_rope_table(q_pos, q_inv_freq, q_n_freq, split_row(n_heads, splits), q_cs);
  dev::pdl_enter();
}

// The warps' softmax states merged per head, in warp order: M = max_w m_w, L = sum_w l_w exp(m_w - M)
// (warps that saw nothing, m_w = -inf, skipped).
__device__ __forceinline__ void merge_warp_ml(const float (&m_s)[kWarps][kSplitHeads],
                                              const float (&l_s)[kWarps][kSplitHeads], float (&big_m)[kSplitHeads],
                                              float (&big_l)[kSplitHeads]) {
#pragma unroll
  for (int h = 0; h < kSplitHeads; ++h) {
    big_m[h] = m_s[0][h];
    for (int w = 1; w < kWarps; ++w) big_m[h] = fmaxf(big_m[h], m_s[w][h]);
    big_l[h] = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (m_s[w][h] != -INFINITY) big_l[h] += l_s[w][h] * expf(m_s[w][h] - big_m[h]);
  }
}

// A split's (M, L) per head into the workspace for the combine.
__device__ __forceinline__ void write_split_ml(float* __restrict__ part_ml, int64_t n_heads, int64_t splits,
                                               const SplitCta& c, const float (&big_m)[kSplitHeads],
                                               const float (&big_l)[kSplitHeads]) {
  float* ml = part_ml + ((c.r * splits + c.sp) * n_heads + c.h0) * 2;
  const int tid = threadIdx.x;
  if (tid < c.nh) {
    ml[2 * tid] = tid == 0 ? big_m[0] : big_m[kSplitHeads - 1];
    ml[2 * tid + 1] = tid == 0 ? big_l[0] : big_l[kSplitHeads - 1];
  }
}

__global__ void __launch_bounds__(kThreads)
    sparse_attention_split_kernel(int64_t n_heads, int64_t d, const float* __restrict__ q,
                                  const int64_t* __restrict__ kv_offsets,
                                  const int32_t* __restrict__ kv_index, const float* __restrict__ kv,
                                  const float* __restrict__ sink, float scale, float* __restrict__ out,
                                  int64_t splits, int64_t chunk, float* __restrict__ part_acc,
                                  float* __restrict__ part_ml, const int64_t* __restrict__ q_pos,
                                  const float* __restrict__ q_inv_freq, int64_t q_n_freq, bool table_early) {
  __shared__ float m_s[kWarps][kSplitHeads], l_s[kWarps][kSplitHeads];
  __shared__ float acc_s[kSplitHeads * kMaxDim];
  __shared__ float q_cs[kMaxDim];  // cos, sin of frequency i at 2i, 2i + 1
  split_prologue(q_pos, q_inv_freq, q_n_freq, n_heads, splits, table_early, q_cs);
  SplitCta cta;
  if (!split_cta(n_heads, d, kv_offsets, out, splits, chunk, part_ml, cta)) return;
  const int64_t r = cta.r, sp = cta.sp, h0 = cta.h0, e0 = cta.e0, e1 = cta.e1;
  const int nh = cta.nh;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool seed = warp == 0 && sp == 0;
  // q_n_freq > 0: q rotated forward as it is loaded, run_rope's arithmetic (rope_kernel): channel
  // c >= off pairs with c ^ 1 (off is even, so the partner is the adjacent lane), the angles' cos /
  // sin from q_rope_table.
  const int64_t q_off = d - 2 * q_n_freq;
  if (!table_early) q_rope_table(q_pos, q_inv_freq, q_n_freq, r, q_cs);
  float qr[kSplitHeads][kLaneDims], acc[kSplitHeads][kLaneDims], m[kSplitHeads], l[kSplitHeads];
#pragma unroll
  for (int h = 0; h < kSplitHeads; ++h) {
    const float* qh = q + (r * n_heads + h0 + h) * d;
#pragma unroll
    for (int j = 0; j < kLaneDims; ++j) {
      const int64_t c = lane + 32 * j;
      float v = (h < nh && c < d) ? qh[c] : 0.0f;
      if (q_n_freq > 0 && 32 * j + 31 >= q_off) {  // uniform over the warp: every lane shuffles
        const float partner = __shfl_xor_sync(0xffffffffu, v, 1);
        if (c >= q_off && c < d) {
          const int64_t f = (c - q_off) >> 1;
          const float cc = q_cs[2 * f], ss = q_cs[2 * f + 1];
          v = ((c - q_off) & 1) == 0 ? __fsub_rn(__fmul_rn(v, cc), __fmul_rn(partner, ss))
                                     : __fadd_rn(__fmul_rn(partner, ss), __fmul_rn(v, cc));
        }
      }
      qr[h][j] = v;
      acc[h][j] = 0.0f;
    }
    m[h] = seed && h < nh ? sink[h0 + h] : -INFINITY;
    l[h] = seed ? 1.0f : 0.0f;
  }
  // Software pipeline: the next entry's row (and the index after it) load while this one computes.
  float v[kLaneDims], vn[kLaneDims];
  auto load_row = [&](float* dst, int32_t row) {
    const float* vp = kv + static_cast<int64_t>(row) * d;
#pragma unroll
    for (int j = 0; j < kLaneDims; ++j) {
      const int64_t c = lane + 32 * j;
      dst[j] = c < d ? vp[c] : 0.0f;
    }
  };
  int64_t e = e0 + warp;
  if (e < e1) load_row(v, kv_index[e]);
  int32_t idx_next = e + kWarps < e1 ? kv_index[e + kWarps] : 0;
  for (; e < e1; e += kWarps) {
    if (e + kWarps < e1) {
      load_row(vn, idx_next);
      idx_next = e + 2 * kWarps < e1 ? kv_index[e + 2 * kWarps] : 0;
    }
#pragma unroll
    for (int h = 0; h < kSplitHeads; ++h) {
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < kLaneDims; ++j) part += qr[h][j] * v[j];
      const float s = warp_sum(part) * scale;
      const float new_m = fmaxf(m[h], s);
      const float corr = new_m == m[h] ? 1.0f : expf(m[h] - new_m);
      const float p = s == -INFINITY ? 0.0f : expf(s - new_m);
      l[h] = l[h] * corr + p;
#pragma unroll
      for (int j = 0; j < kLaneDims; ++j) acc[h][j] = acc[h][j] * corr + p * v[j];
      m[h] = new_m;
    }
#pragma unroll
    for (int j = 0; j < kLaneDims; ++j) v[j] = vn[j];
  }
  if (lane == 0)
#pragma unroll
    for (int h = 0; h < kSplitHeads; ++h) {
      m_s[warp][h] = m[h];
      l_s[warp][h] = l[h];
    }
  __syncthreads();
  float big_m[kSplitHeads], big_l[kSplitHeads];
  merge_warp_ml(m_s, l_s, big_m, big_l);
  for (int w = 0; w < kWarps; ++w) {  // deterministic merge in warp order
    if (warp == w) {
#pragma unroll
      for (int h = 0; h < kSplitHeads; ++h) {
        const float f = m[h] == -INFINITY ? 0.0f : expf(m[h] - big_m[h]);
#pragma unroll
        for (int j = 0; j < kLaneDims; ++j) {
          const int64_t c = lane + 32 * j;
          if (c < d) acc_s[h * kMaxDim + c] = (w == 0 ? 0.0f : acc_s[h * kMaxDim + c]) + acc[h][j] * f;
        }
      }
    }
    __syncthreads();
  }
  if (splits == 1) {
    float* o = out + (r * n_heads + h0) * d;
    for (int64_t i = tid; i < nh * d; i += kThreads) {
      const int64_t h = i / d, c = i % d;
      o[i] = acc_s[h * kMaxDim + c] / (h == 0 ? big_l[0] : big_l[kSplitHeads - 1]);
    }
    return;
  }
  float* pa = part_acc + ((r * splits + sp) * n_heads + h0) * d;
  for (int64_t i = tid; i < nh * d; i += kThreads) pa[i] = acc_s[(i / d) * kMaxDim + i % d];
  write_split_ml(part_ml, n_heads, splits, cta, big_m, big_l);
}

// One CTA per (row, head): M = max_s m_s, L = sum_s l_s exp(m_s - M), out = sum_s exp(m_s - M)
// acc_s / L, splits in order, those with m_s = -inf skipped (a split past the row's end); a row
// without entries yields 0. The split weights exp(m_s - M) and L are computed once per CTA (the
// same expressions in the same order as per channel before: the same bits), then each thread owns
// four channels (float4 loads of every split in flight) instead of recomputing them per channel.
constexpr int64_t kMaxCombineSplits = 512;  // the most splits decode_splits gives is kTargetCtas
static_assert(kMaxCombineSplits >= kTargetCtas);

// The combine of (row r, head h) into o[0, d) (global memory, or shared memory when the kernel
// rotates the head back before writing it) by the kT threads t in [0, kT) of a warp-aligned group,
// with the group's own shared arrays wsp / msp / lsp (>= splits floats each) and big_l_sh; every
// thread of the CTA calls it (each group for its own head of the same row r: the same barriers).
// The partials are read through L2 (__ldcg): in the split kernel's fused tail other CTAs wrote them.
template <int kT>
__device__ __forceinline__ void combine_head_part(int t, int64_t n_heads, int64_t d,
                                                  const int64_t* __restrict__ kv_offsets, int64_t splits,
                                                  const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                                  int64_t r, int64_t h, float* o, float* wsp, float* msp, float* lsp,
                                                  float* big_l_sh) {
  // The splits' (m, l) staged once (one load round for the CTA; ncu: 6.6-8.5 us per call at one
  // row when every thread walked m, then thread 0 walked m and l, one L2 round trip per split).
  // M by a warp max (fmaxf: the same value in any order), the weights per split, then thread 0
  // adds L in split order from shared memory: the same expressions, the same bits. They are loaded
  // together with the row's entry range (one round trip, not two); an empty row uses none of them.
  const int64_t e_begin = kv_offsets[r], e_end = kv_offsets[r + 1];
  const float* ml = part_ml + (r * splits * n_heads + h) * 2;  // split sp at + sp * n_heads * 2
  for (int64_t sp = t; sp < splits; sp += kT) {
    msp[sp] = __ldcg(ml + sp * n_heads * 2);
    lsp[sp] = __ldcg(ml + sp * n_heads * 2 + 1);
  }
  if (e_end <= e_begin) {  // CTA-uniform
    for (int64_t c = t; c < d; c += kT) o[c] = 0.0f;
    return;
  }
  __syncthreads();
  float big_m = -INFINITY;
  for (int64_t sp = t & 31; sp < splits; sp += 32) big_m = fmaxf(big_m, msp[sp]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) big_m = fmaxf(big_m, __shfl_xor_sync(0xffffffffu, big_m, off));
  for (int64_t sp = t; sp < splits; sp += kT) {
    const float m = msp[sp];
    wsp[sp] = m != -INFINITY ? expf(m - big_m) : -1.0f;
  }
  __syncthreads();
  if (t == 0) {
    float big_l = 0.0f;
    for (int64_t sp = 0; sp < splits; ++sp)
      if (wsp[sp] >= 0.0f) big_l += lsp[sp] * wsp[sp];
    *big_l_sh = big_l;
  }
  __syncthreads();
  const float big_l = *big_l_sh;
  const float* pa = part_acc + (r * splits * n_heads + h) * d;  // split sp at + sp * n_heads * d
  const int64_t sstride = n_heads * d;
  const bool vec = (d & 3) == 0 && (reinterpret_cast<uintptr_t>(pa) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(o) & 15u) == 0 && (sstride & 3) == 0;
  if (vec) {
    for (int64_t c = 4 * t; c < d; c += 4 * kT) {
      float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      constexpr int kU = 4;  // splits whose rows are loaded together
      for (int64_t s0 = 0; s0 < splits; s0 += kU) {
        float4 v[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u)
          v[u] = s0 + u < splits && wsp[s0 + u] >= 0.0f
                     ? __ldcg(reinterpret_cast<const float4*>(pa + (s0 + u) * sstride + c))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          if (s0 + u >= splits) break;
          const float w = wsp[s0 + u];
          if (w < 0.0f) continue;
          a.x += v[u].x * w;
          a.y += v[u].y * w;
          a.z += v[u].z * w;
          a.w += v[u].w * w;
        }
      }
      *reinterpret_cast<float4*>(o + c) = make_float4(a.x / big_l, a.y / big_l, a.z / big_l, a.w / big_l);
    }
    return;
  }
  for (int64_t c = t; c < d; c += kT) {
    float a = 0.0f;
    for (int64_t sp = 0; sp < splits; ++sp)
      if (wsp[sp] >= 0.0f) a += __ldcg(pa + sp * sstride + c) * wsp[sp];
    o[c] = a / big_l;
  }
}

// The combine kernel's head: the whole CTA (kCombineThreads) on one head.
__device__ __forceinline__ void sparse_attention_combine_head(int64_t n_heads, int64_t d,
                                                              const int64_t* __restrict__ kv_offsets, int64_t splits,
                                                              const float* __restrict__ part_acc,
                                                              const float* __restrict__ part_ml, int64_t r, int64_t h,
                                                              float* o) {
  __shared__ float wsp[kMaxCombineSplits];  // exp(m_s - M) (>= 0), or -1 for a skipped split
  __shared__ float msp[kMaxCombineSplits], lsp[kMaxCombineSplits];
  __shared__ float big_l_sh;
  combine_head_part<kCombineThreads>(static_cast<int>(threadIdx.x), n_heads, d, kv_offsets, splits, part_acc, part_ml,
                                     r, h, o, wsp, msp, lsp, &big_l_sh);
}

// The inverse rotation of head channels ov[0, d) (shared memory) into o (MODEL_SPEC 7.9): rope_kernel's
// operations with the table cs (rope_table_fill, inverse), channel c by threads t, t + kT, ...
__device__ __forceinline__ void rotate_back_head(const float* ov, const float* cs, int64_t d, int64_t n_freq, float* o,
                                                 int t, int kT) {
  const int64_t off = d - 2 * n_freq;
  for (int64_t c = t; c < d; c += kT) {
    float v = ov[c];
    if (c >= off) {
      const int64_t q = (c - off) >> 1;
      const float e = ov[off + 2 * q], od = ov[off + 2 * q + 1], cc = cs[2 * q], sn = cs[2 * q + 1];
      v = ((c - off) & 1) == 0 ? __fsub_rn(__fmul_rn(e, cc), __fmul_rn(od, sn))
                               : __fadd_rn(__fmul_rn(e, sn), __fmul_rn(od, cc));
    }
    o[c] = v;
  }
}

// The fused combine (SparseAttentionArgs::counters): every split CTA of (row r, head group) counts
// itself on the group's counter once its partials are written (or, past the row's end, its empty
// state); the CTA that completes the group zeroes the counter for the next call and merges the
// group's kSplitHeads heads, one per half of the CTA (128 threads each, the combine kernel's
// operations: the same bits, whichever CTA comes last), rotating them back from shared memory with
// the inverse table when n_freq > 0. One launch fewer per attention layer than split + combine, and
// each group's merge starts when its own splits are done, not when the slowest CTA of the grid is.
// Every thread of the CTA calls it (kThreads == 2 x 128, n_heads even: the host checks); tail: >=
// 3 d + 2 kTailHalfFloats floats of the CTA's shared memory, free by now (16-byte aligned).
constexpr int64_t kFusedMaxSplits = 64;  // splits the fused tail's per-half arrays hold
// A half's arrays in the tail: wsp, msp, lsp (kFusedMaxSplits each) and big_l, padded to 16 bytes.
constexpr int64_t kTailHalfFloats = 3 * kFusedMaxSplits + 4;
__device__ __forceinline__ void split_count_and_combine(int64_t n_heads, int64_t d,
                                                        const int64_t* __restrict__ kv_offsets, int64_t splits,
                                                        const float* __restrict__ part_acc,
                                                        const float* __restrict__ part_ml, float* __restrict__ out,
                                                        uint32_t* __restrict__ counters, int64_t r, int64_t h0,
                                                        const int64_t* __restrict__ rope_pos,
                                                        const float* __restrict__ inv_freq, int64_t n_freq,
                                                        float* tail, bool one_fence) {
  static_assert(kThreads == 2 * 128 && kSplitHeads == 2, "one half of the CTA per head of the group");
  // This CTA's partials counted on the group's counter; the last CTA of the group goes on (last_block.cuh).
  if (!dev::count_last_block(counters + r * (n_heads / kSplitHeads) + h0 / kSplitHeads,
                             static_cast<uint32_t>(splits), one_fence))
    return;  // CTA-uniform
  const int half = static_cast<int>(threadIdx.x) / 128, t = static_cast<int>(threadIdx.x) % 128;
  float* ov = tail + half * d;
  float* cs = tail + 2 * d;
  float* g = tail + 3 * d + half * kTailHalfFloats;
  float* o = out + (r * n_heads + h0 + half) * d;
  if (n_freq > 0)  // the last warp first, as the combine kernel (beside the (m, l) loads)
    dev::rope_table_fill(static_cast<float>(rope_pos[r]), inv_freq, n_freq, true, cs,
                         (threadIdx.x + kThreads - 32) % kThreads, kThreads);
  combine_head_part<128>(t, n_heads, d, kv_offsets, splits, part_acc, part_ml, r, h0 + half, n_freq > 0 ? ov : o, g,
                         g + kFusedMaxSplits, g + 2 * kFusedMaxSplits, g + 3 * kFusedMaxSplits);
  if (n_freq == 0) return;
  __syncthreads();  // ov and cs complete
  rotate_back_head(ov, cs, d, n_freq, o, t, 128);
}

// The split kernel for head_dim = 128 kJ (kJ = 1..4) with 16-byte aligned q and kv rows (the released
// 512 and every width the model uses): the same CTAs, splits, per-warp online softmax and warp-order
// merge, with less work per entry (ncu on the H200: the scalar kernel issued ~480 instructions per
// entry and warp, most of them the 64-bit addressing of 16 scalar loads per lane, and was instruction
// bound at 26-33 us per layer):
// - lane owns channels 128 j + 4 lane + [0, 4) (a float4 per j): a row is kJ 16-byte loads per lane
//   with the addressing computed once per row;
// - the q . v dot is four fmaf chains per head (channels 4 lane + 128 j + i in chain i), then the
//   warp's xor tree (identical in every lane, so the branch below is warp-uniform);
// - the rescale of (l, acc) by exp(m - m') runs only when the maximum grows (corr = 1 otherwise,
//   which the scalar kernel multiplies by), and acc += p v is one fmaf per channel;
// - the warps' states meet in shared memory once (one barrier) and each thread merges its channels
//   over the warps in warp order with the scalar kernel's expressions (sum = 0 + a_0 f_0 + a_1 f_1 ...).
// The query's rotation (q_n_freq > 0) is rope_kernel's arithmetic on the pairs (c, c + 1), both in the
// lane's float4 (q_off is even). Float sums in another order than the scalar kernel and fused
// multiply-adds: the same tolerance to the CPU op (convex weights, float accumulation), run to run
// bit-identical, and a row's result does not depend on the other rows of the call.
//
// kP (the prefetch ring, DS41_ATTN_PREFETCH): 0 keeps one entry in flight per warp (the next row in
// registers while this one is multiplied), so a warp's ~10 entries of a batch-1 step cost ~10 dependent
// L2 round trips. kP > 0 streams the warp's entries through kP slots of shared memory by cp.async
// (kP - 1 entries in flight beside the one multiplied, no registers held for them): each lane copies
// exactly the 16-byte pieces it later reads (channels 128 j + 4 lane), so the lane's own wait_group
// orders them and no barrier is needed; the entry indices come 32 at a time, one per lane, through a
// shuffle. The same v values reach the same arithmetic in the same order: the same bits as kP = 0.
template <int kJ, int kP>
__global__ void __launch_bounds__(kThreads, 2)
    sparse_attention_split_vec_kernel(int64_t n_heads, const float* __restrict__ q,
                                      const int64_t* __restrict__ kv_offsets, const int32_t* __restrict__ kv_index,
                                      const float* __restrict__ kv, const float* __restrict__ sink, float scale,
                                      float* __restrict__ out, int64_t splits, int64_t chunk,
                                      float* __restrict__ part_acc, float* __restrict__ part_ml,
                                      const int64_t* __restrict__ q_pos, const float* __restrict__ q_inv_freq,
                                      int64_t q_n_freq, uint32_t* __restrict__ counters,
                                      const int64_t* __restrict__ out_pos, const float* __restrict__ out_inv_freq,
                                      int64_t out_n_freq, bool table_early, bool merge_shared, bool one_fence) {
  constexpr int kD = 128 * kJ;
  static_assert(kWarps * kSplitHeads * kD >= 3 * kD + 2 * kTailHalfFloats, "the fused combine's tail fits acc_w");
  __shared__ float m_s[kWarps][kSplitHeads], l_s[kWarps][kSplitHeads];
  __shared__ __align__(16) float acc_w[kWarps][kSplitHeads][kD];
  __shared__ float q_cs[kMaxDim];  // cos, sin of frequency i at 2i, 2i + 1
  split_prologue(q_pos, q_inv_freq, q_n_freq, n_heads, splits, table_early, q_cs);
  SplitCta cta;
  // counters (splits > 1): the fused combine (split_count_and_combine): this CTA counts itself, and
  // the group's last CTA merges it and rotates it back by out_pos / out_inv_freq / out_n_freq (the
  // combine kernel's rope_pos, rope_inv_freq, n_freq).
  if (!split_cta(n_heads, kD, kv_offsets, out, splits, chunk, part_ml, cta)) {
    if (counters != nullptr)
      split_count_and_combine(n_heads, kD, kv_offsets, splits, part_acc, part_ml, out, counters, cta.r, cta.h0,
                              out_pos, out_inv_freq, out_n_freq, &acc_w[0][0][0], one_fence);
    return;
  }
  const int64_t r = cta.r, sp = cta.sp, h0 = cta.h0, e0 = cta.e0, e1 = cta.e1;
  const int nh = cta.nh;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool seed = warp == 0 && sp == 0;
  const int64_t q_off = kD - 2 * q_n_freq;
  if (!table_early) q_rope_table(q_pos, q_inv_freq, q_n_freq, r, q_cs);
  float4 qr[kSplitHeads][kJ], acc[kSplitHeads][kJ];
  float m[kSplitHeads], l[kSplitHeads];
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int h = 0; h < kSplitHeads; ++h) {
    const float4* qh = reinterpret_cast<const float4*>(q + (r * n_heads + h0 + h) * kD) + lane;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      float4 v = h < nh ? qh[32 * j] : zero4;
      if (q_n_freq > 0) {
        const int64_t c0 = 128 * j + 4 * lane;
        float* vv = reinterpret_cast<float*>(&v);
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {  // the pair (c, c + 1), c = c0 + 2 pr (even: q_off is even)
          const int64_t c = c0 + 2 * pr;
          if (c >= q_off) {
            const int64_t f = (c - q_off) >> 1;
            const float cc = q_cs[2 * f], ss = q_cs[2 * f + 1], e = vv[2 * pr], o = vv[2 * pr + 1];
            vv[2 * pr] = __fsub_rn(__fmul_rn(e, cc), __fmul_rn(o, ss));
            vv[2 * pr + 1] = __fadd_rn(__fmul_rn(e, ss), __fmul_rn(o, cc));
          }
        }
      }
      qr[h][j] = v;
      acc[h][j] = zero4;
    }
    m[h] = seed && h < nh ? sink[h0 + h] : -INFINITY;
    l[h] = seed ? 1.0f : 0.0f;
  }
  // One entry's row v (this lane's channels) into the online softmax of every head.
  auto consume = [&](const float4 (&v)[kJ]) {
#pragma unroll
    for (int h = 0; h < kSplitHeads; ++h) {
      float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        c0 = __fmaf_rn(qr[h][j].x, v[j].x, c0);
        c1 = __fmaf_rn(qr[h][j].y, v[j].y, c1);
        c2 = __fmaf_rn(qr[h][j].z, v[j].z, c2);
        c3 = __fmaf_rn(qr[h][j].w, v[j].w, c3);
      }
      const float s = warp_sum((c0 + c1) + (c2 + c3)) * scale;
      const float new_m = fmaxf(m[h], s);
      if (new_m != m[h]) {  // warp-uniform: s is the same in every lane
        const float corr = expf(m[h] - new_m);
        l[h] = l[h] * corr;
#pragma unroll
        for (int j = 0; j < kJ; ++j)
          acc[h][j] = make_float4(acc[h][j].x * corr, acc[h][j].y * corr, acc[h][j].z * corr, acc[h][j].w * corr);
        m[h] = new_m;
      }
      const float p = s == -INFINITY ? 0.0f : expf(s - new_m);
      l[h] = l[h] + p;
#pragma unroll
      for (int j = 0; j < kJ; ++j)
        acc[h][j] = make_float4(__fmaf_rn(p, v[j].x, acc[h][j].x), __fmaf_rn(p, v[j].y, acc[h][j].y),
                                __fmaf_rn(p, v[j].z, acc[h][j].z), __fmaf_rn(p, v[j].w, acc[h][j].w));
    }
  };
  if constexpr (kP == 0) {
    float4 v[kJ], vn[kJ];
    auto load_row = [&](float4* dst, int32_t row) {
      const float4* vp = reinterpret_cast<const float4*>(kv + static_cast<int64_t>(row) * kD) + lane;
#pragma unroll
      for (int j = 0; j < kJ; ++j) dst[j] = vp[32 * j];
    };
    int64_t e = e0 + warp;
    if (e < e1) load_row(v, kv_index[e]);
    int32_t idx_next = e + kWarps < e1 ? kv_index[e + kWarps] : 0;
    for (; e < e1; e += kWarps) {
      if (e + kWarps < e1) {
        load_row(vn, idx_next);
        idx_next = e + 2 * kWarps < e1 ? kv_index[e + 2 * kWarps] : 0;
      }
      consume(v);
#pragma unroll
      for (int j = 0; j < kJ; ++j) v[j] = vn[j];
    }
  } else {
    // The warp's entries e0 + warp + i kWarps, i < cnt; entry i in slot i % kP of the warp's ring.
    extern __shared__ __align__(16) float smem[];  // (the name the host emulator's rewrite knows)
    float4* ring = reinterpret_cast<float4*>(smem) + static_cast<int64_t>(warp) * kP * kJ * 32 + lane;
    const int64_t first = e0 + warp;
    const int64_t cnt = first < e1 ? (e1 - first + kWarps - 1) / kWarps : 0;
    int32_t idx_lane = 0;  // entry (i & ~31) + lane's index, for the issue of entries i .. i | 31
    auto issue = [&](int64_t i) {  // warp-uniform i; one cp.async group per call (empty past cnt)
      if (i < cnt) {
        if ((i & 31) == 0) idx_lane = i + lane < cnt ? kv_index[first + (i + lane) * kWarps] : 0;
        const int32_t row = __shfl_sync(kFull, idx_lane, static_cast<int>(i & 31));
        const float4* src = reinterpret_cast<const float4*>(kv + static_cast<int64_t>(row) * kD) + lane;
        float4* dst = ring + (i % kP) * kJ * 32;
#pragma unroll
        for (int j = 0; j < kJ; ++j) dev::cp_async16(dst + 32 * j, src + 32 * j);
      }
      dev::cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < kP; ++i) issue(i);
    for (int64_t i = 0; i < cnt; ++i) {
      dev::cp_async_wait<kP - 1>();  // entry i's group (the oldest of the kP this lane has open)
      float4 v[kJ];
      const float4* src = ring + (i % kP) * kJ * 32;
#pragma unroll
      for (int j = 0; j < kJ; ++j) v[j] = src[32 * j];
      consume(v);
      issue(i + kP);  // into the slot just read (its values are in registers and used)
    }
    dev::cp_async_wait<0>();
  }
#pragma unroll
  for (int h = 0; h < kSplitHeads; ++h) {
    if (lane == 0) {
      m_s[warp][h] = m[h];
      l_s[warp][h] = l[h];
    }
#pragma unroll
    for (int j = 0; j < kJ; ++j) reinterpret_cast<float4*>(acc_w[warp][h])[32 * j + lane] = acc[h][j];
  }
  __syncthreads();
  float big_m[kSplitHeads], big_l[kSplitHeads];
  // The warps' weights exp(m_w - M) per head: computed once per (warp, head) into shared memory
  // (merge_shared, DS41_ATTN_MERGE_SHARED, default on) or by every thread for its channels (merge_warp_ml
  // and the loop's expf, as measured until 2026-12-07: 8 + 16 expf per thread and long unrolled code,
  // ncu's "no instruction" stalls of the merge). The same expressions of the same values, so the same bits.
  __shared__ float f_s[kWarps][kSplitHeads], bm_s[kSplitHeads], bl_s[kSplitHeads];
  if (merge_shared) {
    if (tid < kWarps * kSplitHeads) {
      const int w = tid / kSplitHeads, h = tid % kSplitHeads;
      float bm = m_s[0][h];
      for (int u = 1; u < kWarps; ++u) bm = fmaxf(bm, m_s[u][h]);
      f_s[w][h] = m_s[w][h] == -INFINITY ? 0.0f : expf(m_s[w][h] - bm);
      if (w == 0) bm_s[h] = bm;
    }
    __syncthreads();
    if (tid < kSplitHeads) {  // merge_warp_ml's L: the same terms (its expf values are f_s) in warp order
      float bl = 0.0f;
      for (int w = 0; w < kWarps; ++w)
        if (m_s[w][tid] != -INFINITY) bl += l_s[w][tid] * f_s[w][tid];
      bl_s[tid] = bl;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kSplitHeads; ++h) {
      big_m[h] = bm_s[h];
      big_l[h] = bl_s[h];
    }
  } else {
    merge_warp_ml(m_s, l_s, big_m, big_l);
  }
  float* o = splits == 1 ? out + (r * n_heads + h0) * kD : part_acc + ((r * splits + sp) * n_heads + h0) * kD;
  for (int i = tid; i < nh * kD / 4; i += kThreads) {  // a float4 of head h's channels
    const int h = (4 * i) / kD, c = 4 * i - h * kD;
    float4 a = zero4;
    for (int w = 0; w < kWarps; ++w) {
      const float f = merge_shared ? f_s[w][h] : m_s[w][h] == -INFINITY ? 0.0f : expf(m_s[w][h] - big_m[h]);
      const float4 x = reinterpret_cast<const float4*>(acc_w[w][h])[c / 4];
      a = make_float4(a.x + x.x * f, a.y + x.y * f, a.z + x.z * f, a.w + x.w * f);
    }
    if (splits == 1) {
      const float L = h == 0 ? big_l[0] : big_l[kSplitHeads - 1];
      a = make_float4(a.x / L, a.y / L, a.z / L, a.w / L);
    }
    reinterpret_cast<float4*>(o + h * kD)[c / 4] = a;
  }
  if (splits > 1) write_split_ml(part_ml, n_heads, splits, cta, big_m, big_l);
  if (counters != nullptr)
    split_count_and_combine(n_heads, kD, kv_offsets, splits, part_acc, part_ml, out, counters, r, h0, out_pos,
                            out_inv_freq, out_n_freq, &acc_w[0][0][0], one_fence);
}

// One CTA per (row, head): sparse_attention_combine_head into the output row, or (n_freq > 0) into
// shared memory, then the head rotated back with rope_kernel's operations (float32 angle p *
// inv_freq, fp64 sincos rounded to float32, the sine negated; the pair's four roundings), the bits
// run_rope(out, ..., inverse) gives after the unrotated combine.
__global__ void __launch_bounds__(kCombineThreads)
    sparse_attention_combine_kernel(int64_t n_heads, int64_t d, const int64_t* __restrict__ kv_offsets,
                                    int64_t splits, const float* __restrict__ part_acc,
                                    const float* __restrict__ part_ml, float* __restrict__ out,
                                    const int64_t* __restrict__ rope_pos, const float* __restrict__ inv_freq,
                                    int64_t n_freq) {
  dev::pdl_enter();
  __shared__ __align__(16) float ov[kMaxDim];
  __shared__ float cs[kMaxDim];
  const int64_t r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  float* o = out + (r * n_heads + h) * d;
  if (n_freq == 0) {
    sparse_attention_combine_head(n_heads, d, kv_offsets, splits, part_acc, part_ml, r, h, o);
    return;
  }
  // The rotation table first, by the last warp (thread t takes frequency (t + kCombineThreads - 32) mod
  // kCombineThreads): its fp64 sincos chains run while warp 0 waits for the splits' (m, l) loads and
  // adds L (before, they ran after the whole combine, on the critical path).
  dev::rope_table_fill(static_cast<float>(rope_pos[r]), inv_freq, n_freq, true, cs,
                       (threadIdx.x + kCombineThreads - 32) % kCombineThreads, kCombineThreads);
  sparse_attention_combine_head(n_heads, d, kv_offsets, splits, part_acc, part_ml, r, h, ov);
  __syncthreads();  // ov and cs complete
  rotate_back_head(ov, cs, d, n_freq, o, static_cast<int>(threadIdx.x), kCombineThreads);
}

// cudaFuncAttributeMaxDynamicSharedMemorySize once per kernel (a kernel's size is fixed by its template
// arguments; a decode step launches it per layer, and a captured step must not repeat host calls).
Status allow_dynamic_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::vector<const void*> done;
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(done.begin(), done.end(), kernel) != done.end()) return ok_status();
  DS41_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
      "sparse_attention_split: shared memory attribute"));
  done.push_back(kernel);
  return ok_status();
}

// The vector split kernel's prefetch ring depth: DS41_ATTN_PREFETCH = 2 or 4 (opt-in until timed; 0 or
// unset: one entry in flight, the register double buffer), or a test's override.
int g_prefetch = -1;
int attention_prefetch_depth() {
  if (g_prefetch >= 0) return g_prefetch;
  static const int env = [] {
    const char* e = std::getenv("DS41_ATTN_PREFETCH");
    if (e == nullptr) return 0;
    const int v = std::atoi(e);
    return v == 2 || v == 4 ? v : 0;
  }();
  return env;
}

// The vector split kernel's warp merge with its weights in shared memory: DS41_ATTN_MERGE_SHARED (default on;
// 0: every thread computes them, as measured until 2026-12-07), or a test's override. The same bits.
int g_merge_shared = -1;
bool attention_merge_shared() {
  if (g_merge_shared >= 0) return g_merge_shared != 0;
  static const bool env = switch_on("DS41_ATTN_MERGE_SHARED");
  return env;
}

// Splits per row of the decode kernel: enough CTAs for ~2 per SM, at least kMinSplitEntries entries
// per split; 1 (no workspace) from kTargetCtas / 2 (row, head group) CTAs on.
int64_t decode_splits(int64_t n, int64_t n_heads, int64_t max_entries) {
  const int64_t ctas = n * ((n_heads + kSplitHeads - 1) / kSplitHeads);
  const int64_t by_ctas = kTargetCtas / ctas;
  const int64_t by_entries = (max_entries + kMinSplitEntries - 1) / kMinSplitEntries;
  return std::max<int64_t>(1, std::min(by_ctas, by_entries));
}

size_t split_bytes(int64_t n, int64_t n_heads, int64_t head_dim, int64_t splits) {
  if (splits <= 1) return 0;
  return static_cast<size_t>(n * splits * n_heads * (head_dim + 2)) * sizeof(float);
}

}  // namespace

size_t sparse_attention_workspace_bytes(int64_t n, int64_t n_heads, int64_t head_dim,
                                        int64_t max_entries_per_row) {
  if (n <= 0 || n_heads <= 0 || head_dim <= 0 || head_dim > kMaxDim || max_entries_per_row <= 0) return 0;
  // The need of every call with n' <= n rows (rows * splits is not monotone in n); splits grow with
  // max_entries_per_row, so the bound also serves every shorter call.
  size_t need = 0;
  for (int64_t m = 1; m <= std::min(n, kSplitMaxRows); ++m)
    need = std::max(need, split_bytes(m, n_heads, head_dim, decode_splits(m, n_heads, max_entries_per_row)));
  // row_invariant: one-row splits for every row, kInvariantRowsPerPass rows a pass.
  need = std::max(need, split_bytes(std::min(n, kInvariantRowsPerPass), n_heads, head_dim,
                                    decode_splits(1, n_heads, max_entries_per_row)));
  return need;
}

int64_t sparse_attention_counter_count(int64_t n, int64_t n_heads) {
  if (n <= 0 || n_heads <= 0) return 0;
  // The fused combine takes one-wave split grids only (n x splits x head groups <= kTargetCtas, splits
  // >= 2): at most kTargetCtas / 2 (row, head group) counters, whatever the call.
  return std::min(n * ((n_heads + kSplitHeads - 1) / kSplitHeads), kTargetCtas / 2);
}

namespace {

// SparseAttentionArgs::rotate_q where the kernel does not rotate q itself: run_rope on q in place.
Status rotate_q_in_place(const SparseAttentionArgs& a, cudaStream_t stream) {
  return run_rope(const_cast<float*>(a.q), a.n, a.n_heads, a.head_dim, a.rope_pos, a.rope_inv_freq, a.rope_n_freq,
                  false, stream);
}

// The decode path (split kernel + combine) with the given splits; a: validated by the caller.
Status run_sparse_attention_decode(const SparseAttentionArgs& a, int64_t splits, cudaStream_t stream) {
  const int64_t split_groups = (a.n_heads + kSplitHeads - 1) / kSplitHeads;
  if (a.n * splits * split_groups > 0x7fffffff)
    return invalid_argument("sparse_attention: n x splits x head groups " + std::to_string(a.n * splits * split_groups) +
                            " too large for one grid");
  auto rotate_back = [&]() -> Status {
    if (a.rope_n_freq == 0) return ok_status();
    return run_rope(a.out, a.n, a.n_heads, a.head_dim, a.rope_pos, a.rope_inv_freq, a.rope_n_freq, true, stream);
  };
  const size_t need = split_bytes(a.n, a.n_heads, a.head_dim, splits);
  if (need > 0 && (!a.workspace || a.workspace_bytes < need))
    return invalid_argument("sparse_attention: workspace of " + std::to_string(a.workspace_bytes) +
                            " bytes, " + std::to_string(need) +
                            " needed (sparse_attention_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(a.workspace) % alignof(float) != 0)
    return invalid_argument("sparse_attention: workspace not 4-byte aligned");
  const int64_t chunk = (a.max_entries_per_row + splits - 1) / splits;
  float* part_acc = splits > 1 ? static_cast<float*>(a.workspace) : nullptr;
  float* part_ml = splits > 1 ? part_acc + a.n * splits * a.n_heads * a.head_dim : nullptr;
  // The forward rotation of q inside the split kernel where its pairs sit on adjacent lanes (an even
  // head_dim - 2 n_freq), else a run_rope launch in place first.
  static const bool fused_rope = switch_on("DS41_Q_ROPE_FUSED");  // measurements: 0 = run_rope first
  const bool rotate_in_kernel = a.rotate_q && fused_rope && (a.head_dim - 2 * a.rope_n_freq) % 2 == 0;
  if (a.rotate_q && !rotate_in_kernel) DS41_RETURN_IF_ERROR(rotate_q_in_place(a, stream));
  const unsigned grid = static_cast<unsigned>(a.n * splits * split_groups);
  const int64_t* rp = rotate_in_kernel ? a.rope_pos : nullptr;
  const float* rf = rotate_in_kernel ? a.rope_inv_freq : nullptr;
  const int64_t rn = rotate_in_kernel ? a.rope_n_freq : int64_t{0};
  const bool table_early = pre_wait_enabled();  // the query table before the PDL wait (launch.h)
  const bool merge_shared = attention_merge_shared();
  // The vector kernel where the width and alignment allow (DS41_ATTN_SPLIT_VEC=0: the scalar one,
  // measurements).
  static const bool vec_allowed = switch_on("DS41_ATTN_SPLIT_VEC");
  const bool vec = vec_allowed && a.head_dim % 128 == 0 && a.head_dim <= kMaxDim &&
                   (reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.kv) |
                    reinterpret_cast<uintptr_t>(a.out) | reinterpret_cast<uintptr_t>(part_acc)) % 16 == 0;
  // The combine fused into the split kernel's last CTA per (row, head group) (split_count_and_combine)
  // where the caller gave counters and the split grid is one wave (<= kTargetCtas CTAs: a batch-1 step).
  // Measured on an H200 (docs/perf/README.md, session of 2026-12-05 23:09 UTC): at one row fused 2.537-
  // 2.539 ms per step against 2.551-2.564 with the launch; at 8 rows (row_invariant: 2,048 split CTAs,
  // ~8 waves) fused 8.378-8.388 against 8.292-8.307, the tails lengthening the waves' CTAs where the
  // combine kernel's 512 CTAs run side by side. The bits are the same either way.
  // DS41_ATTN_FUSED_COMBINE=0: the combine launch always (measurements).
  static const bool fused_allowed = switch_on("DS41_ATTN_FUSED_COMBINE");
  const bool fused = vec && fused_allowed && splits > 1 && splits <= kFusedMaxSplits && a.n_heads % kSplitHeads == 0 &&
                     a.counters != nullptr && a.counters_size >= a.n * split_groups &&
                     static_cast<int64_t>(grid) <= kTargetCtas;
  if (vec) {
    // The prefetch ring's depth (kP of the vector kernel): its slots are dynamic shared memory beside the
    // kernel's static ~34 KB, kWarps x kP x head_dim floats (64 KB at 4 x 512), two CTAs per SM still.
    const int depth = attention_prefetch_depth();
    auto go = [&](auto kernel, int kp) {
      const size_t smem = static_cast<size_t>(kWarps) * kp * a.head_dim * sizeof(float);
      if (smem > 0) DS41_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
      launch(kernel, grid, kThreads, smem, stream, a.n_heads, a.q, a.kv_offsets, a.kv_index, a.kv, a.sink, a.scale,
             a.out, splits, std::max<int64_t>(chunk, 1), part_acc, part_ml, rp, rf, rn,
             fused ? a.counters : nullptr, a.rope_pos, a.rope_inv_freq, a.rope_n_freq, table_early, merge_shared,
             one_fence_enabled());
      return ok_status();
    };
    auto by_depth = [&](auto k0, auto k2, auto k4) {
      return depth == 4 ? go(k4, 4) : depth == 2 ? go(k2, 2) : go(k0, 0);
    };
    auto by_width = [&]() -> Status {
      switch (a.head_dim / 128) {
        case 1:
          return by_depth(sparse_attention_split_vec_kernel<1, 0>, sparse_attention_split_vec_kernel<1, 2>,
                          sparse_attention_split_vec_kernel<1, 4>);
        case 2:
          return by_depth(sparse_attention_split_vec_kernel<2, 0>, sparse_attention_split_vec_kernel<2, 2>,
                          sparse_attention_split_vec_kernel<2, 4>);
        case 3:
          return by_depth(sparse_attention_split_vec_kernel<3, 0>, sparse_attention_split_vec_kernel<3, 2>,
                          sparse_attention_split_vec_kernel<3, 4>);
        default:
          return by_depth(sparse_attention_split_vec_kernel<4, 0>, sparse_attention_split_vec_kernel<4, 2>,
                          sparse_attention_split_vec_kernel<4, 4>);
      }
    };
    const Status st = by_width();
    DS41_RETURN_IF_ERROR(st);
  } else {
    launch(sparse_attention_split_kernel, grid, kThreads, 0, stream, a.n_heads, a.head_dim, a.q, a.kv_offsets,
           a.kv_index, a.kv, a.sink, a.scale, a.out, splits, std::max<int64_t>(chunk, 1), part_acc, part_ml, rp, rf,
           rn, table_early);
  }
  DS41_RETURN_IF_ERROR(last_launch_status("sparse_attention_split"));
  if (splits == 1) return rotate_back();
  if (fused) return ok_status();
  launch(sparse_attention_combine_kernel, static_cast<unsigned>(a.n * a.n_heads), kCombineThreads, 0, stream,
         a.n_heads, a.head_dim, a.kv_offsets, splits, part_acc, part_ml, a.out, a.rope_pos, a.rope_inv_freq,
         a.rope_n_freq);
  return last_launch_status("sparse_attention_combine");
}

}  // namespace

void set_attention_merge_shared_for_tests(int mode) { g_merge_shared = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_attention_prefetch_for_tests(int depth) { g_prefetch = depth == 0 || depth == 2 || depth == 4 ? depth : -1; }

Status run_sparse_attention(const SparseAttentionArgs& a, cudaStream_t stream) {
  if (a.n < 0) return invalid_argument("sparse_attention: n " + std::to_string(a.n) + " is negative");
  if (a.n_heads <= 0)
    return invalid_argument("sparse_attention: n_heads " + std::to_string(a.n_heads) + " must be positive");
  if (a.head_dim <= 0 || a.head_dim > kMaxDim)
    return invalid_argument("sparse_attention: head_dim " + std::to_string(a.head_dim) + " outside [1, " +
                            std::to_string(kMaxDim) + "]");
  if (a.max_entries_per_row < 0)
    return invalid_argument("sparse_attention: max_entries_per_row " + std::to_string(a.max_entries_per_row) +
                            " is negative");
  if (a.rope_n_freq < 0 || 2 * a.rope_n_freq > a.head_dim || (a.rope_n_freq > 0 && (!a.rope_pos || !a.rope_inv_freq)))
    return invalid_argument("sparse_attention: rope_n_freq " + std::to_string(a.rope_n_freq) +
                            " (want 2 * rope_n_freq <= head_dim, rope_pos and rope_inv_freq set)");
  if (a.rotate_q && a.rope_n_freq == 0)
    return invalid_argument("sparse_attention: rotate_q needs rope_n_freq > 0 (the rotation's frequencies)");
  if (a.n == 0) return ok_status();
  if (!a.q || !a.kv_offsets || !a.sink || !a.out || (a.max_entries_per_row > 0 && (!a.kv_index || !a.kv)))
    return invalid_argument("sparse_attention: null q, kv_offsets, kv_index, kv, sink or out");
  // The inverse rotation where it is not fused into the split combine.
  auto rotate_back = [&]() -> Status {
    if (a.rope_n_freq == 0) return ok_status();
    return run_rope(a.out, a.n, a.n_heads, a.head_dim, a.rope_pos, a.rope_inv_freq, a.rope_n_freq, true, stream);
  };
  if (a.row_invariant) {  // the decode path with one-row splits, in passes the workspace holds
    const int64_t splits = decode_splits(1, a.n_heads, a.max_entries_per_row);
    const int64_t per = splits > 1 ? kInvariantRowsPerPass : a.n;
    for (int64_t r0 = 0; r0 < a.n; r0 += per) {
      SparseAttentionArgs p = a;
      p.row_invariant = false;
      p.n = std::min(per, a.n - r0);
      p.q = a.q + r0 * a.n_heads * a.head_dim;
      p.kv_offsets = a.kv_offsets + r0;
      p.out = a.out + r0 * a.n_heads * a.head_dim;
      if (p.rope_pos) p.rope_pos = a.rope_pos + r0;
      DS41_RETURN_IF_ERROR(run_sparse_attention_decode(p, splits, stream));
    }
    return ok_status();
  }
  if (a.n <= kSplitMaxRows) return run_sparse_attention_decode(a, decode_splits(a.n, a.n_heads, a.max_entries_per_row), stream);
  static const bool tc_allowed = switch_on("DS41_TC_ATTENTION");
  // The other paths rotate q in place first (rotate_q).
  if (a.rotate_q) DS41_RETURN_IF_ERROR(rotate_q_in_place(a, stream));
  if (tc_allowed && sparse_attention_tc_supported(a)) {
    DS41_RETURN_IF_ERROR(run_sparse_attention_tc(a, stream));
    return rotate_back();
  }
  const int64_t groups = (a.n_heads + kHeads - 1) / kHeads;
  if (a.n * groups > 0x7fffffff)
    return invalid_argument("sparse_attention: n " + std::to_string(a.n) + " x head groups too large");
  launch(sparse_attention_kernel, static_cast<unsigned>(a.n * groups), kThreads, smem_bytes(a.head_dim), stream, a.n_heads, a.head_dim, a.q, a.kv_offsets, a.kv_index, a.kv, a.sink, a.scale, a.out);
  DS41_RETURN_IF_ERROR(last_launch_status("sparse_attention"));
  return rotate_back();
}

}  // namespace ds41::cuda
