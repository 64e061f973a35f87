// ds41 backends/cuda: indexer scores (MODEL_SPEC 3.4.6) on the tensor cores, bit-identical to the
// float kernel of indexer_kernels.cu and so to the CPU reference (the selections downstream must
// not move): out[r, t] = sum_h w[r, h] * relu(q[r, h] . key[key_begin[r] + t]) * scale (float
// relu and scale, double sum in head order), -inf for visible[r] <= t < t_stride.
//
// Why the mma can give the CPU's bits: the CPU's dot (dot_f32: 8 float lane sums, then double) is
// order-dependent only when a partial sum rounds. Indexer queries and keys are Q_idx values (E2M1 x
// a power of two per 32 channels, 3.9): few significant bits, so usually no partial sum of any
// order rounds. A per-row certificate decides it: for a row x of head_dim 128 let H = max floor(log2
// |x_i|) and L = the lowest set-bit exponent over its nonzero x_i. Every product q_i k_i is then a
// multiple of 2^(Lq + Lk) below 2^(Hq + Hk + 2), every partial sum of the 128 products (in any order)
// a multiple of 2^(Lq + Lk) below 2^(Hq + Hk + 9); when D = H - L satisfies Dq + Dk <= 15 all of
// them fit a float's 24-bit significand, so every addition — the CPU's, the mma's — is exact and
// both give the exact dot. Rows whose values need more than 8 significant bits (not exact in
// bf16), are subnormal or far from 1 (so sums could leave the normal range) get D = 99. A (query
// head, key) pair that fails the certificate is recomputed by the thread in the CPU's order
// (dot_like_cpu, shared with the float kernel). Rows of different sequences in one tile (a
// verification's few rows per sequence, a prefill chunk's sequence boundaries) run as runs of rows
// sharing a key_begin, each over its own keys.
//
// Shape: one CTA per 16 consecutive rows (the mma's M) and share of the key tiles (grid y: every
// gridDim.y-th tile of 128 keys, 8 warps x 16 keys: the N; more than one share when the rows are
// few); K = head_dim = 128. The CTA's queries of every head sit in shared memory as bf16 (exact:
// certificate) with their D; a key tile is staged as bf16 with its D by all threads; each
// warp keeps its 16 keys' B fragments in registers across the head loop and, per head, multiplies
// the 16 x 128 query tile, then applies relu, scale and the double head sum to its 8 score slots.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_sm_count.h"
#include "backends/cuda/indexer_dot.cuh"
#include "backends/cuda/indexer_tc_kernels.h"
#include "backends/cuda/tc_mma.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {
using namespace dev;

constexpr int kIxThreads = 256;  // 8 warps
constexpr int kIxRows = 16;      // query rows per CTA (mma M)
constexpr int kIxKeys = 128;     // keys per tile: 16 per warp
constexpr int kIxD = 128;        // head_dim
constexpr int kIxMaxHeads = 32;
constexpr int kBadSpan = 99;
constexpr int kMaxSpanSum = 15;

// Certificate state of one row part: H, L over the nonzero values seen, `bad` when a value cannot
// take part (see the header). Folded over a row's values, then D = span().
struct Span {
  int hi = -1000, lo = 1000;
  bool bad = false;
  __device__ __forceinline__ void add(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u &= 0x7fffffffu;
    if (u == 0) return;
    const int e = static_cast<int>(u >> 23);
    if (e == 0 || e == 255) {  // subnormal, inf or NaN
      bad = true;
      return;
    }
    const uint32_t m = (u & 0x7fffffu) | 0x800000u;
    const int tz = __ffs(static_cast<int>(m)) - 1;
    const int h = e - 127, l = e - 150 + tz;
    if (h - l > 7) bad = true;  // more than 8 significant bits: not exact in bf16
    hi = max(hi, h);
    lo = min(lo, l);
  }
  __device__ __forceinline__ void merge(const Span& o) {
    hi = max(hi, o.hi);
    lo = min(lo, o.lo);
    bad = bad || o.bad;
  }
  __device__ __forceinline__ int span() const {
    if (bad) return kBadSpan;
    if (hi < lo) return 0;                        // all zeros: every product is an exact 0
    if (hi > 50 || lo < -60) return kBadSpan;     // keep Hq + Hk + 9 <= 109 and Lq + Lk >= -120
    return hi - lo;
  }
  __device__ __forceinline__ Span shfl_xor(int m) const {
    Span o;
    o.hi = __shfl_xor_sync(kFullMask, hi, m);
    o.lo = __shfl_xor_sync(kFullMask, lo, m);
    o.bad = __shfl_xor_sync(kFullMask, bad ? 1 : 0, m) != 0;
    return o;
  }
};

size_t ix_smem_bytes(int64_t n_heads) {
  return sizeof(uint16_t) * static_cast<size_t>(n_heads * kIxRows * kIxD + kIxKeys * kIxD) +
         sizeof(float) * static_cast<size_t>(kIxRows * n_heads) +  // w
         sizeof(int) * static_cast<size_t>(kIxRows * n_heads + kIxKeys);  // D of queries, keys
}

__global__ void __launch_bounds__(kIxThreads, 1)
    indexer_scores_tc_kernel(int64_t n, int64_t n_heads, int64_t t_stride, const float* __restrict__ q,
                             const float* __restrict__ w, const float* __restrict__ keys,
                             const int64_t* __restrict__ key_begin, const int64_t* __restrict__ visible,
                             float scale, float* __restrict__ out) {
  dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  const int H = static_cast<int>(n_heads);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [H][16][128] bf16, rows swizzled
  uint16_t* ks = qs + H * kIxRows * kIxD;             // [128][128] bf16, rows swizzled
  float* ws = reinterpret_cast<float*>(ks + kIxKeys * kIxD);  // [16][H]
  int* dq = reinterpret_cast<int*>(ws + kIxRows * H);         // [16][H]
  int* dk = dq + kIxRows * H;                                 // [128]
  // Runs of consecutive rows sharing a key_begin (the rows of one sequence): run u is rows
  // [s_ra[u], s_ra[u + 1]) with keys from s_kb[u], s_mv[u] the most keys any of them sees.
  __shared__ int64_t s_kb[kIxRows], s_mv[kIxRows];
  __shared__ int s_ra[kIxRows + 1];
  __shared__ int s_runs;

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kIxRows;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kIxRows), n - r0));
  if (tid == 0) {
    int u = -1;
    for (int i = 0; i < rows; ++i) {
      const int64_t kb = key_begin[r0 + i];
      if (u < 0 || kb != s_kb[u]) {
        ++u;
        s_kb[u] = kb;
        s_mv[u] = 0;
        s_ra[u] = i;
      }
      s_mv[u] = max(s_mv[u], min(visible[r0 + i], t_stride));
    }
    s_runs = u + 1;
    s_ra[u + 1] = rows;
  }
  // Queries of the 16 rows (padding rows: zeros), one warp per (row, head) at a time: 32 lanes x 4
  // channels, the row's D reduced over the warp.
  for (int rh = warp; rh < kIxRows * H; rh += kIxThreads / 32) {
    const int i = rh / H, h = rh % H;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < rows) v = reinterpret_cast<const float4*>(q + ((r0 + i) * n_heads + h) * kIxD)[lane];
    Span sp;
    sp.add(v.x);
    sp.add(v.y);
    sp.add(v.z);
    sp.add(v.w);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sp.merge(sp.shfl_xor(m));
    uint2 b;
    b.x = pack_bf16(v.x, v.y);
    b.y = pack_bf16(v.z, v.w);
    *reinterpret_cast<uint2*>(qs + h * kIxRows * kIxD + swz(i, 4 * lane, kIxD)) = b;
    if (lane == 0) {
      dq[i * H + h] = sp.span();
      ws[i * H + h] = i < rows ? w[(r0 + i) * n_heads + h] : 0.0f;
    }
  }
  __syncthreads();

  // Each run over its own keys: the mma multiplies all 16 query rows, the run's rows keep theirs
  // (a tile of one sequence's rows, prefill, is one run; a verification's rows of several
  // sequences are a few, each as fast as one).
  const int runs = s_runs;
  for (int u = 0; u < runs; ++u) {
    const int ra = s_ra[u], rb = s_ra[u + 1];
    const int64_t kb = s_kb[u], maxvis = s_mv[u];
    int64_t vis[2];  // visible keys of rows g and g + 8 (0 outside the run)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = g + 8 * j;
      vis[j] = i >= ra && i < rb ? min(visible[r0 + i], t_stride) : 0;
    }
    for (int64_t t0 = static_cast<int64_t>(blockIdx.y) * kIxKeys; t0 < t_stride;
         t0 += static_cast<int64_t>(gridDim.y) * kIxKeys) {
      const int kw = warp * 16;  // this warp's keys in the tile
      if (t0 >= maxvis) {  // past every run row's visible keys: -inf only
        for (int idx = tid; idx < (rb - ra) * kIxKeys; idx += kIxThreads) {
          const int i = ra + idx / kIxKeys;
          const int64_t t = t0 + idx % kIxKeys;
          if (t < t_stride) out[(r0 + i) * t_stride + t] = -INFINITY;
        }
        continue;
      }
      // Stage the key tile (keys t < maxvis of the run's key_begin; others zeros): thread pair
      // (2k, 2k+1) on key k, float4 slots half + 2 j, the key's D reduced over the pair.
      {
        const int key = tid >> 1, half = tid & 1;
        const int64_t t = t0 + key;
        const float4* src = reinterpret_cast<const float4*>(keys + (kb + t) * kIxD);
        Span sp;
#pragma unroll 4
        for (int j = 0; j < kIxD / 8; ++j) {
          const int slot = half + 2 * j;
          float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
          if (t < maxvis) v = src[slot];
          sp.add(v.x);
          sp.add(v.y);
          sp.add(v.z);
          sp.add(v.w);
          uint2 b;
          b.x = pack_bf16(v.x, v.y);
          b.y = pack_bf16(v.z, v.w);
          *reinterpret_cast<uint2*>(ks + swz(key, 4 * slot, kIxD)) = b;
        }
        sp.merge(sp.shfl_xor(1));
        if (half == 0) dk[key] = sp.span();
      }
      __syncthreads();

      // B fragments of this warp's 16 keys for the 8 k-steps (kept across the heads).
      uint32_t bk[kIxD / 16][4];
#pragma unroll
      for (int kk = 0; kk < kIxD / 16; ++kk) ldsm_x4<false, 1>(bk[kk], ks + kw * kIxD, kIxD, 16 * kk);
      // Score slots: (n-tile nt, element e) -> row g + 8 (e >> 1), key kw + 8 nt + 2 t4 + (e & 1).
      double acc[2][4] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};
      int dkey[2][2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) dkey[nt][e] = dk[kw + 8 * nt + 2 * t4 + e];
      for (int h = 0; h < H; ++h) {
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < kIxD / 16; ++kk) {
          uint32_t a[4];
          ldsm_x4<false, 0>(a, qs + h * kIxRows * kIxD, kIxD, 16 * kk);
          mma_bf16(s[0], a, bk[kk][0], bk[kk][1]);
          mma_bf16(s[1], a, bk[kk][2], bk[kk][3]);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = g + 8 * (e >> 1);
            const int64_t t = t0 + kw + 8 * nt + 2 * t4 + (e & 1);
            if (t >= vis[e >> 1]) continue;  // also every row outside the run
            float v = s[nt][e];
            if (dq[i * H + h] + dkey[nt][e & 1] > kMaxSpanSum) {  // the CPU's order
              const float* kp = keys + (kb + t) * kIxD;
              const float* qp = q + ((r0 + i) * n_heads + h) * kIxD;
              v = dot_like_cpu<kIxD>(qp, kp, kIxD);
            }
            v = (v < 0.0f ? 0.0f : v) * scale;  // std::max(v, 0.0f) * scale, NaN kept
            acc[nt][e] += static_cast<double>(v) * static_cast<double>(ws[i * H + h]);
          }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = g + 8 * (e >> 1);
          const int64_t t = t0 + kw + 8 * nt + 2 * t4 + (e & 1);
          if (i < ra || i >= rb || t >= t_stride) continue;
          out[(r0 + i) * t_stride + t] = t < vis[e >> 1] ? static_cast<float>(acc[nt][e]) : -INFINITY;
        }
      __syncthreads();  // the next tile overwrites ks and dk
    }
  }
}

}  // namespace

bool indexer_scores_tc_supported(const IndexerDeviceArgs& a) {
  return a.head_dim == kIxD && a.n_heads > 0 && a.n_heads <= kIxMaxHeads && a.n > 0;
}

Status run_indexer_scores_tc(const IndexerDeviceArgs& a, cudaStream_t stream) {
  if (!indexer_scores_tc_supported(a))
    return invalid_argument("indexer_scores_tc: needs head_dim 128 and 1..32 heads, got " +
                            std::to_string(a.n_heads) + " x " + std::to_string(a.head_dim));
  if (a.w_scale != 1.0f)
    return invalid_argument("indexer_scores_tc: w_scale " + std::to_string(a.w_scale) +
                            " is taken by the packed-key kernel only (scale the weights first)");
  if (a.t_stride == 0) return ok_status();
  if (!a.q || !a.w || !a.keys || !a.key_begin || !a.visible || !a.out)
    return invalid_argument("indexer_scores_tc: null q, w, keys, key_begin, visible or out");
  if (reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || reinterpret_cast<uintptr_t>(a.keys) % 16 != 0)
    return invalid_argument("indexer_scores_tc: q and keys must be 16-byte aligned");
  const int64_t ctas = (a.n + kIxRows - 1) / kIxRows;
  if (ctas > 0x7fffffff) return invalid_argument("indexer_scores_tc: n " + std::to_string(a.n) + " too large");
  const size_t smem = ix_smem_bytes(a.n_heads);
  DS41_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(indexer_scores_tc_kernel),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "indexer_scores_tc: shared memory attribute"));
  // Few row tiles (a verification's rows): the key tiles split over grid y so every SM has work.
  const int64_t key_tiles = (a.t_stride + kIxKeys - 1) / kIxKeys, want = 2 * static_cast<int64_t>(sm_count());
  const int64_t split = std::clamp<int64_t>((want + ctas - 1) / ctas, 1, std::min<int64_t>(key_tiles, 65535));
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(split));
  launch(indexer_scores_tc_kernel, grid, kIxThreads, smem, stream, a.n, a.n_heads, a.t_stride, a.q, a.w, a.keys, a.key_begin, a.visible, a.scale, a.out);
  return last_launch_status("indexer_scores_tc");
}

}  // namespace ds41::cuda
