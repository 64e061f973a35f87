// ds41 backends/cuda: the device code of the mHC site map (mhc_kernels.cu has the design notes),
// shared by mhc_kernels.cu (two launches) and the fused site kernel of fused_rows_kernels.cu (one
// launch), so both compute pre / post / comb with the same operations in the same order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/row_reduce.cuh"

namespace ds41::cuda::hc {

constexpr int kThreads = 256;
constexpr int kWarpsHc = kThreads / 32;
constexpr int64_t kMaxC = 8;
constexpr int kHcRows = 8;              // rows per hc_map block (fn values reused across them)
constexpr int64_t kTileCols = 128;      // columns per tile: 32 lanes x 4
constexpr int64_t kTargetBlocks = 264;  // ~2 blocks per SM on a 132-SM H200
static_assert((2 + 4) * 4 <= kWarpsHc * 3 && (2 + kMaxC) * kMaxC <= kWarpsHc * 10,
              "fn rows per warp: 3 for C <= 4, 10 for C <= 8");

__device__ __forceinline__ float sigmoid_ref(float x) {
  return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x))));
}

// pre / post / comb from m (MODEL_SPEC 3.3), the reference's operations in its order. kC: the
// stream count when known at compile time (4, the released model: the loops unroll and comb stays
// in registers), else 0 (a.c at run time). hc_pre_post: one value per thread (t < 2C);
// hc_comb: one thread (the softmax and the Sinkhorn iterations are sequential).
template <int kC>
__device__ __forceinline__ void hc_pre_post(const HcMapDeviceArgs& a, const float* m, int64_t r, int t) {
  const int C = kC > 0 ? kC : static_cast<int>(a.c);
  if (t < C)
    a.pre[r * C + t] = sigmoid_ref(m[t] * a.scale[0] + a.base[t]) + a.hc_eps;
  else if (t < 2 * C)
    a.post[r * C + t - C] = 2.0f * sigmoid_ref(m[t] * a.scale[1] + a.base[t]);
}

template <int kC>
__device__ __forceinline__ void hc_comb(const HcMapDeviceArgs& a, const float* m, int64_t r) {
  constexpr int kN = kC > 0 ? kC : static_cast<int>(kMaxC);
  const int C = kC > 0 ? kC : static_cast<int>(a.c);
  float L[kN * kN], comb[kN * kN];
#pragma unroll
  for (int j = 0; j < kN * kN; ++j)
    if (j < C * C) L[j] = m[2 * C + j] * a.scale[2] + a.base[2 * C + j];
#pragma unroll
  for (int j = 0; j < kN; ++j) {  // row-wise softmax (over k) + eps
    if (j >= C) break;
    float mx = L[j * C];
#pragma unroll
    for (int k = 1; k < kN; ++k)
      if (k < C) mx = mx < L[j * C + k] ? L[j * C + k] : mx;
    double s = 0;
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (k < C) s += exp(static_cast<double>(L[j * C + k] - mx));
#pragma unroll
    for (int k = 0; k < kN; ++k)
      if (k < C)
        comb[j * C + k] = static_cast<float>(exp(static_cast<double>(L[j * C + k] - mx)) / s) + a.hc_eps;
  }
  auto col_norm = [&] {
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (k >= C) break;
      float s = 0;
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (j < C) s += comb[j * C + k];
#pragma unroll
      for (int j = 0; j < kN; ++j)
        if (j < C) comb[j * C + k] /= (s + a.hc_eps);
    }
  };
  auto row_norm = [&] {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j >= C) break;
      float s = 0;
#pragma unroll
      for (int k = 0; k < kN; ++k)
        if (k < C) s += comb[j * C + k];
#pragma unroll
      for (int k = 0; k < kN; ++k)
        if (k < C) comb[j * C + k] /= (s + a.hc_eps);
    }
  };
  col_norm();
  for (int64_t it = 0; it + 1 < a.sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
#pragma unroll
  for (int j = 0; j < kN * kN; ++j)
    if (j < C * C) a.comb[r * C * C + j] = comb[j];
}

// hc_comb for C = 4 on the 16 lanes 0..15 of one warp, lane 4 j + k owning comb[j][k]: every
// sum is gathered by shuffles and added in the reference's order (softmax: over k in fp64; column
// sums over j, row sums over k, from 0 in fp32), every element divided by its own lane, so the
// values are bit-identical to hc_comb<4> (one thread: ~20 us of serial fp32 divisions at the
// released 20 Sinkhorn steps) in a sixteenth of the serial divisions.
// Called by all 32 lanes of the warp (the fused site kernel loops over rows with a barrier between
// them, so no lane may sit out a shuffle): lanes 16..31 compute throwaway values and store nothing;
// lanes 0..15 read only lanes 0..15, so their values are those of a 16-lane call.
__device__ __forceinline__ void hc_comb4_lanes(const HcMapDeviceArgs& a, const float* m, int64_t r,
                                               int lane) {
  constexpr unsigned kMask = 0xffffffffu;
  const int j = lane >> 2, k = lane & 3;
  const float L = lane < 16 ? m[8 + lane] * a.scale[2] + a.base[8 + lane] : 0.0f;
  float mx = __shfl_sync(kMask, L, 4 * j);
#pragma unroll
  for (int kk = 1; kk < 4; ++kk) {
    const float v = __shfl_sync(kMask, L, 4 * j + kk);
    mx = mx < v ? v : mx;
  }
  const double e = exp(static_cast<double>(L - mx));
  double s = 0;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) s += __shfl_sync(kMask, e, 4 * j + kk);
  float c = static_cast<float>(e / s) + a.hc_eps;
  auto col_norm = [&] {
    float t = 0;
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) t += __shfl_sync(kMask, c, 4 * jj + k);
    c /= (t + a.hc_eps);
  };
  auto row_norm = [&] {
    float t = 0;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) t += __shfl_sync(kMask, c, 4 * j + kk);
    c /= (t + a.hc_eps);
  };
  col_norm();
  for (int64_t it = 0; it + 1 < a.sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
  if (lane < 16) a.comb[r * 16 + lane] = c;
}

// Split-K pass. Block b = g * splits + s serves rows [g * kRows, g * kRows + kRows) and the column
// tiles [s * steps, (s + 1) * steps) of kTileCols columns each (lane l: columns 4 l .. 4 l + 3 of a
// tile, one float4 when kVec). Warp w owns the fn rows j = w + kWarps * jj; the fn values of a tile
// are loaded once and used for all the block's rows. Each thread sums its fp32 products (f * fn, the
// normalisation is applied to the total), the warp sums them in a fixed shuffle tree; warp 0 also
// sums f^2 in fp64. Output: part[(r * splits + s) * (M + 1) + j] (fp64), j = M the sum of squares.
template <int kJ, bool kVec>
__device__ __forceinline__ void hc_map_partial_block(const HcMapDeviceArgs& a, int64_t splits, int64_t steps,
                                                     double* __restrict__ part, int64_t b) {
  const int64_t C = a.c, F = a.c * a.h, M = (2 + C) * C;
  const int64_t g = b / splits, s = b % splits;
  const int64_t r0 = g * kHcRows;
  const int nr = static_cast<int>(min(static_cast<int64_t>(kHcRows), a.n - r0));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[kHcRows][kJ];
  double ss[kHcRows];
#pragma unroll
  for (int rr = 0; rr < kHcRows; ++rr) {
    ss[rr] = 0.0;
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) acc[rr][jj] = 0.0f;
  }
  const int64_t t_end = min((s + 1) * steps, (F + kTileCols - 1) / kTileCols);
  // Row rr's products with a tile (x: the row's 4 columns of this lane, w: the warp's fn rows),
  // shared by every loop below, so all paths make the same operations in the same order.
  auto row_products = [&](int rr, const float* x, const float (*w)[4]) {
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[rr][jj] = __fmaf_rn(x[q], w[jj][q], acc[rr][jj]);
    if (warp == 0)
#pragma unroll
      for (int q = 0; q < 4; ++q) ss[rr] += static_cast<double>(x[q]) * static_cast<double>(x[q]);
  };
  // A full group on the vector path takes the staged loop below (uniform over the block).
  const bool staged = kVec && nr == kHcRows;
  for (int64_t t = staged ? t_end : s * steps; t < t_end; ++t) {
    const int64_t c0 = t * kTileCols + 4 * lane;  // this lane's first column
    float w[kJ][4];
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) {
      const int64_t j = warp + kWarpsHc * jj;
      if (kVec) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (j < M && c0 < F) v = __ldg(reinterpret_cast<const float4*>(a.fn + j * F + c0));
        w[jj][0] = v.x, w[jj][1] = v.y, w[jj][2] = v.z, w[jj][3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) w[jj][q] = (j < M && c0 + q < F) ? __ldg(a.fn + j * F + c0 + q) : 0.0f;
      }
    }
    // Row rr's products with this tile (the same operations in the same order on both paths).
    auto row_load = [&](int rr, float* x) {
      const float* f = a.streams + (r0 + rr) * F;
      if (kVec) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c0 < F) v = *reinterpret_cast<const float4*>(f + c0);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) x[q] = c0 + q < F ? f[c0 + q] : 0.0f;
      }
    };
    auto row_math = [&](int rr, const float* x) { row_products(rr, x, w); };
    if (nr == kHcRows) {
      // A full group (prefill): every row's loads first, then the arithmetic. With a `break` between
      // the rows the loads could not be issued ahead of the previous row's FMAs, so each tile made
      // kHcRows dependent DRAM round trips (hc_site at 16K rows: 5 ms, latency-bound at 25 %
      // occupancy).
      float x[kHcRows][4];
#pragma unroll
      for (int rr = 0; rr < kHcRows; ++rr) row_load(rr, x[rr]);
#pragma unroll
      for (int rr = 0; rr < kHcRows; ++rr) row_math(rr, x[rr]);
    } else {
#pragma unroll
      for (int rr = 0; rr < kHcRows; ++rr) {
        if (rr >= nr) break;  // uniform over the block
        float x[4];
        row_load(rr, x);
        row_math(rr, x);
      }
    }
  }
  if (staged) {
    static_assert(kHcRows == kWarpsHc, "warp w stages row w of the group");
    // A full group on the vector path (prefill): the 8 rows' x tile is loaded once per block (warp w
    // loads row w's 128 columns, one float4 per lane: the float4 lane l of every warp needs) into
    // shared memory, and the next tile's x and fn are loaded while this tile's arithmetic runs
    // (double-buffered, one barrier per tile). Before, every warp loaded all 8 rows' tiles itself
    // and each tile waited for its own loads (hc_site at 16K rows: 5.1 ms per call, ncu). Each
    // (row, fn row, lane) accumulates the same products in the same order as the loops above, so
    // the bits are those of the other paths.
    __shared__ float4 xs[2][kHcRows][32];
    const int64_t t0 = s * steps;
    float4 xn = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 wn[kJ];
    auto fetch = [&](int64_t t) {
      const int64_t c0 = t * kTileCols + 4 * lane;
      xn = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (c0 < F) xn = *reinterpret_cast<const float4*>(a.streams + (r0 + warp) * F + c0);
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) {
        const int64_t j = warp + kWarpsHc * jj;
        wn[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (j < M && c0 < F) wn[jj] = __ldg(reinterpret_cast<const float4*>(a.fn + j * F + c0));
      }
    };
    if (t0 < t_end) fetch(t0);
    int buf = 0;
    for (int64_t t = t0; t < t_end; ++t, buf ^= 1) {
      xs[buf][warp][lane] = xn;
      float w[kJ][4];
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj) w[jj][0] = wn[jj].x, w[jj][1] = wn[jj].y, w[jj][2] = wn[jj].z, w[jj][3] = wn[jj].w;
      __syncthreads();  // xs[buf] complete; every warp is past its reads of xs[buf] two tiles ago
      if (t + 1 < t_end) fetch(t + 1);
#pragma unroll
      for (int rr = 0; rr < kHcRows; ++rr) {
        const float4 v = xs[buf][rr][lane];
        const float x[4] = {v.x, v.y, v.z, v.w};
        row_products(rr, x, w);
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kHcRows; ++rr) {
    if (rr >= nr) break;
    double* out = part + ((r0 + rr) * splits + s) * (M + 1);
#pragma unroll
    for (int jj = 0; jj < kJ; ++jj) {
      const int64_t j = warp + kWarpsHc * jj;
      if (j >= M) break;  // uniform over the warp
      const float v = dev::warp_sum(acc[rr][jj]);
      if (lane == 0) out[j] = static_cast<double>(v);
    }
    if (warp == 0) {
      const double v = dev::warp_sum(ss[rr]);
      if (lane == 0) out[M] = v;
    }
  }
}

// One block per row: the M + 1 partial sums over the splits in fp64, each by one warp (lanes over
// the splits, then the fixed shuffle tree: the same order on every run), then the normalisation
// inv = 1 / sqrt(ss / F + eps) with the reference's roundings, m = inv * dot, and the tail.
// The partials are read through L2 (__ldcg): in the fused site kernel other CTAs wrote them.
// tot: kMaxC * kMaxC + 2 * kMaxC + 1 doubles, m: (2 + kMaxC) * kMaxC floats of shared memory; a
// 256-thread block (warps 0..7), every thread calls it (barriers).
template <int kC>
__device__ __forceinline__ void hc_map_finish_row(const HcMapDeviceArgs& a, int64_t splits,
                                                  const double* __restrict__ part, int64_t r, double* tot,
                                                  float* m) {
  const int64_t C = a.c, F = a.c * a.h, M = (2 + C) * C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const double* p = part + r * splits * (M + 1);
  for (int64_t j = warp; j <= M && warp < kWarpsHc; j += kWarpsHc) {
    double s = 0.0;
    for (int64_t q = lane; q < splits; q += 32) s += __ldcg(p + q * (M + 1) + j);
    s = dev::warp_sum(s);
    if (lane == 0) tot[j] = s;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    const float inv = static_cast<float>(
        1.0 / sqrt(static_cast<double>(static_cast<float>(tot[M] / static_cast<double>(F)) + a.norm_eps)));
    m[threadIdx.x] = static_cast<float>(tot[threadIdx.x] * static_cast<double>(inv));
  }
  __syncthreads();
  if (kC == 4) {
    if (warp == 0)
      hc_comb4_lanes(a, m, r, lane);
    else if (warp == 1)  // another warp: runs beside the Sinkhorn lanes
      hc_pre_post<kC>(a, m, r, lane);
  } else if (threadIdx.x == 0) {
    hc_comb<kC>(a, m, r);
  } else if (warp == 1) {  // another warp: runs beside the Sinkhorn thread
    hc_pre_post<kC>(a, m, r, lane);
  }
}

// hc_map_finish_row for C = 4 by one warp (the fused site kernel's finisher gives each of its
// warps a row of its group): the same per-j sums (lanes over the splits, the same shuffle tree),
// the same m, then hc_comb4_lanes and hc_pre_post<4> on this warp. tot: 25 doubles, m: 24 floats
// of shared memory owned by the warp; all 32 lanes call it.
__device__ __forceinline__ void hc_map_finish_row_warp4(const HcMapDeviceArgs& a, int64_t splits,
                                                        const double* __restrict__ part, int64_t r,
                                                        double* tot, float* m) {
  constexpr int64_t M = 24;  // (2 + 4) * 4
  const int64_t F = 4 * a.h;
  const int lane = threadIdx.x & 31;
  const double* p = part + r * splits * (M + 1);
  // All M + 1 sums at once: a lane walks its splits q = lane, lane + 32, ... and adds each split's
  // M + 1 partials into M + 1 registers, so every sum gets hc_map_finish_row's order (per lane in q
  // order from 0.0, then the same shuffle tree) while the 25 loads of a split are in flight together.
  // (The j-outer loop made 25 dependent rounds of L2 reads: ncu put the site at 28.5 us per call,
  // 12 % of a batch-1 decode step.)
  double s[M + 1];
#pragma unroll
  for (int j = 0; j <= M; ++j) s[j] = 0.0;
  for (int64_t q = lane; q < splits; q += 32) {
    const double* pq = p + q * (M + 1);
#pragma unroll
    for (int j = 0; j <= M; ++j) s[j] += __ldcg(pq + j);
  }
#pragma unroll
  for (int j = 0; j <= M; ++j) {
    const double v = dev::warp_sum(s[j]);
    if (lane == 0) tot[j] = v;
  }
  __syncwarp();
  if (lane < M) {
    const float inv = static_cast<float>(
        1.0 / sqrt(static_cast<double>(static_cast<float>(tot[M] / static_cast<double>(F)) + a.norm_eps)));
    m[lane] = static_cast<float>(tot[lane] * static_cast<double>(inv));
  }
  __syncwarp();
  hc_comb4_lanes(a, m, r, lane);
  hc_pre_post<4>(a, m, r, lane);
}

// The split of the columns: enough blocks for ~2 per SM (kTargetBlocks) at small n, whole tiles
// per block, never more splits than tiles.
struct HcSplit {
  int64_t groups, splits, steps;
};
inline HcSplit hc_split(int64_t n, int64_t c, int64_t h) {
  const int64_t tiles = (c * h + kTileCols - 1) / kTileCols;
  const int64_t groups = (n + kHcRows - 1) / kHcRows;
  const int64_t wanted = (kTargetBlocks + groups - 1) / groups;
  const int64_t steps = (tiles + wanted - 1) / wanted;
  return {groups, (tiles + steps - 1) / steps, steps};
}

}  // namespace ds41::cuda::hc
