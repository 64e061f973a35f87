// ds41 backends/cuda: linear layers y = x . W^T over the checkpoint weight formats, W decoded in
// registers (GEMV path) or into a shared-memory tile (tiled path), never as a full copy
// (MODEL_SPEC 2.1, 3.4.8, 3.5). Float32 products and sums (explicit fmaf: the host reference
// rounds each product, so results differ from it by summation order and fused rounding only).
//
// Streaming GEMV path (n <= kGemvMaxN, decode; or too few tiles for one wave; rows of W 16-byte
// aligned): see stream_rows below (16-byte chunks, R x U chunks per lane in flight, warps split
// along K when there are few rows). The same shapes with unaligned or ragged rows take the V = 4/8 /
// scalar GEMV: 256 threads = 8 warps, one output row per warp; the block
//   stages 8192 / NB columns of up to NB rows of x in shared memory and every warp streams its
//   weight row through it (V weights per lane per step), then reduces its lanes with shuffles.
//   grid = (ceil(out / 8), ceil(n / NB), groups).
// Tiled path (larger n and out, prefill): a 128 (outputs) x 64 (rows of x) tile per 256-thread block, K in
//   steps of 32: the W tile is decoded into shared memory, each thread accumulates 8 x 4 outputs.
//   grid = (ceil(out / 128), ceil(n / 64), groups).
// Expert launches (rows of x grouped by expert through offsets) cut each expert's rows into units
// (NB or 64 rows); every block scans the offsets once (shared memory) and loops over units.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/block_scan.cuh"
#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_sm_count.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/l2_prefetch.cuh"
#include "backends/cuda/linear_decode.cuh"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/tc_gemv_kernels.h"
#include "backends/cuda/linear_wide_decode.cuh"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

using dev::WView;
using quant::WeightFormat;

constexpr int kThreads = 256;
constexpr int kGemvWarps = kThreads / 32;
// Columns of x staged per pass: 32 KB of shared memory whatever NB (decode, NB = 1, stages 8192
// columns: one pass over the released widths, so a warp streams its whole row without a barrier).
template <int NB>
constexpr int kGemvChunk = 8192 / NB;
constexpr int64_t kGemvMaxN = 64;
// Fewer tiles than one wave (an H100/H200 has 132 SMs) would leave SMs idle: the GEMV path then
// spreads the work over (out / 8) x (n / 8) blocks instead.
constexpr int64_t kMinTiles = 132;
constexpr int kTileN = 128;  // output rows per tile
constexpr int kTileM = 64;   // rows of x per tile
constexpr int kTileK = 32;
constexpr int kMaxExperts = 2048;  // unit_start in shared memory (static smem stays < 48 KB)

// ---------------------------------------------------------------------------------------------
// GEMV body: the warp of this thread computes W rows [w_row, w_row + rows) (global rows; rows <= R,
// 0: idle) against nb (<= NB) rows of x (x: first row, group column offset applied); row r of
// the warp writes y_col[b * ldy + r]. R > 1 (decode) amortises the staging of x over more rows.
template <class D, int NB, int R>
__device__ __forceinline__ void gemv_rows(const WView& w, int64_t w_row, int rows, const float* x,
                                          int64_t ldx, int nb, float* y_col, int64_t ldy,
                                          float (&xs)[NB][kGemvChunk<NB>]) {
  const int lane = threadIdx.x & 31;
  float acc[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
  for (int64_t k0 = 0; k0 < w.in; k0 += kGemvChunk<NB>) {
    const int kc = static_cast<int>(min(static_cast<int64_t>(kGemvChunk<NB>), w.in - k0));
    __syncthreads();
#pragma unroll
    for (int b = 0; b < NB; ++b)
      for (int i = threadIdx.x; i < kc; i += blockDim.x) xs[b][i] = b < nb ? x[b * ldx + k0 + i] : 0.0f;
    __syncthreads();
    if (rows > 0) {
#pragma unroll(R == 1 ? 4 : 2)
      for (int kk = lane * D::V; kk < kc; kk += 32 * D::V) {
        float wv[R][D::V];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r < rows) {
            D::load(w, w_row + r, k0 + kk, wv[r]);
          } else {
#pragma unroll
            for (int v = 0; v < D::V; ++v) wv[r][v] = 0.0f;
          }
        }
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if constexpr (D::V % 4 == 0) {
#pragma unroll
            for (int q = 0; q < D::V / 4; ++q) {
              const float4 xv = *reinterpret_cast<const float4*>(&xs[b][kk + 4 * q]);
#pragma unroll
              for (int r = 0; r < R; ++r) {
                acc[r][b] = __fmaf_rn(wv[r][4 * q], xv.x, acc[r][b]);
                acc[r][b] = __fmaf_rn(wv[r][4 * q + 1], xv.y, acc[r][b]);
                acc[r][b] = __fmaf_rn(wv[r][4 * q + 2], xv.z, acc[r][b]);
                acc[r][b] = __fmaf_rn(wv[r][4 * q + 3], xv.w, acc[r][b]);
              }
            }
          } else {
#pragma unroll
            for (int v = 0; v < D::V; ++v) {
              const float xv = xs[b][kk + v];
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][b] = __fmaf_rn(wv[r][v], xv, acc[r][b]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;  // warp-uniform
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = dev::warp_sum(acc[r][b]);
      if (lane == 0 && b < nb) y_col[b * ldy + r] = s;
    }
  }
}

// Tiled body: W rows [w_row0, w_row0 + rows_valid) (rows_valid <= kTileN) against nb (<= kTileM)
// rows of x; y: first output element of the tile (row 0, column of W row w_row0).
template <class D>
__device__ __forceinline__ void tile_rows(const WView& w, int64_t w_row0, int rows_valid, const float* x,
                                          int64_t ldx, int nb, float* y, int64_t ldy,
                                          float (&ws)[kTileK][kTileN + 4], float (&xt)[kTileK][kTileM + 4]) {
  const int tid = threadIdx.x, og = tid & 15, mg = tid >> 4;
  float acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  constexpr int kLoadsPerRow = kTileK / D::V;
  for (int64_t k0 = 0; k0 < w.in; k0 += kTileK) {
    __syncthreads();
    for (int l = tid; l < kTileN * kLoadsPerRow; l += kThreads) {
      const int row = l / kLoadsPerRow, kq = (l % kLoadsPerRow) * D::V;
      float wv[D::V];
      if (row < rows_valid && k0 + kq < w.in) {
        D::load(w, w_row0 + row, k0 + kq, wv);
      } else {
#pragma unroll
        for (int v = 0; v < D::V; ++v) wv[v] = 0.0f;
      }
#pragma unroll
      for (int v = 0; v < D::V; ++v) ws[kq + v][row] = wv[v];
    }
    for (int l = tid; l < kTileM * kTileK; l += kThreads) {
      const int m = l / kTileK, kk = l % kTileK;
      xt[kk][m] = (m < nb && k0 + kk < w.in) ? x[m * ldx + k0 + kk] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      const float4 a0 = *reinterpret_cast<const float4*>(&ws[kk][og * 8]);
      const float4 a1 = *reinterpret_cast<const float4*>(&ws[kk][og * 8 + 4]);
      const float4 bv = *reinterpret_cast<const float4*>(&xt[kk][mg * 4]);
      const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float b[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[j], b[i], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = mg * 4 + i;
    if (m >= nb) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int row = og * 8 + j;
      if (row < rows_valid) y[m * ldy + row] = acc[i][j];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Streaming GEMV body (decode: rows of W 16-byte aligned, linear_wide_decode.cuh). The 8 warps of
// the block form KS (1/2/4/8, along K) x 8/KS row groups of R W rows each. A lane owns whole
// 16-byte chunks of its warp's rows (chunk c of the pass: lane c % 32 of warp-along-K (c / 32) %
// KS) and issues U chunks of each of its R rows (R x U x 16 bytes, plus their scale bytes) before
// decoding any, so every warp keeps R x U x 512 bytes in flight. x is staged in shared memory per
// pass of kStreamFloats / NB columns (one pass at NB = 1 for K <= 9216), swizzled per chunk
// (xs_slot). Sums: per lane fmaf over its chunks in order, a shuffle tree per warp, then the KS
// partial sums of a row in warp order (shared memory): fixed order, no atomics.
constexpr int kStreamFloats = 9216;  // staged x per pass (36 KB of shared memory)
constexpr int kStreamRed = kGemvWarps * 4 * 8;  // KS partials: 8 warps x R (<= 4) x NB (<= 8)

// Dense launches: W rows per warp and chunks per row in flight per lane (expert launches: 4 x 2 for
// every format, the host does not know it). x is read from shared memory 4 NB / R (FP8), 8 NB / R
// (FP4) times per weight byte: R grows with NB.
template <class D, int NB>
struct StreamShape {
  static constexpr int R = NB <= 2 ? 2 : 4;
  static constexpr int U = NB <= 2 ? 4 : (D::kV == 32 && NB == 8 ? 1 : 2);
};

// Stages the float4 groups [0, pg) of NB x rows (x: column 0 of the pass, row b at b * ldx; rows
// >= nb as zeros) into xs4 (row b at b * row_stride float4s, group i of chunk i / G at xs_slot).
// Loads are issued 4 (float4) or 8 (floats) per thread before their stores: a few L2 round trips
// per pass, not one per element. ldx % 4 == 0 on the streaming path (16-byte rows).
template <int G, int V, int kRowStride>
__device__ __forceinline__ void stage_x(const float* __restrict__ x, int64_t ldx, int nb, int total, int pg,
                                        float4* xs4) {
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;  // block-uniform
  if (vec) {
    for (int i0 = threadIdx.x; i0 < total; i0 += 4 * kThreads) {
      float4 t[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + j * kThreads, b = i / pg, gi = i - b * pg;
        t[j] = (i < total && b < nb) ? __ldg(reinterpret_cast<const float4*>(x + b * ldx) + gi)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + j * kThreads, b = i / pg, gi = i - b * pg;
        if (i < total) xs4[b * kRowStride + dev::xs_slot<G>(gi / G, gi % G)] = t[j];
      }
    }
  } else {
    const int totalf = total * 4, pk = pg * 4;
    for (int i0 = threadIdx.x; i0 < totalf; i0 += 8 * kThreads) {
      float t[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = i0 + j * kThreads, b = i / pk, k = i - b * pk;
        t[j] = (i < totalf && b < nb) ? x[b * ldx + k] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int i = i0 + j * kThreads, b = i / pk, k = i - b * pk;
        if (i < totalf)
          reinterpret_cast<float*>(xs4)[4 * (b * kRowStride + dev::xs_slot<G>(k / V, (k % V) >> 2)) + (k & 3)] = t[j];
      }
    }
  }
}

// Float4 offset of chunk cu's x (x row 0; row b at + b * row4 float4s: kPassChunks * G for the
// split-K launch, the whole row for the persistent one) is applied per group by xs_slot; the steps
// of one chunk: x read once per step for the R rows.
template <class D, int NB, int R, int t>
__device__ __forceinline__ void stream_step(const uint4 (&q)[R], const uint32_t (&sc)[R], int rows, int cu,
                                            const float4* xs4, int64_t row4, float (&acc)[R][NB]) {
  constexpr int G = D::kV / 4, F = D::kStep / 4;  // float4 groups per chunk / per step
  float4 xv[NB][F];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int f = 0; f < F; ++f) xv[b][f] = xs4[b * row4 + dev::xs_slot<G>(cu, t * F + f)];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (r >= rows) break;  // warp-uniform
    float v[D::kStep];
    D::template step<t>(q[r], sc[r], v);
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int f = 0; f < F; ++f) {
        acc[r][b] = __fmaf_rn(v[4 * f], xv[b][f].x, acc[r][b]);
        acc[r][b] = __fmaf_rn(v[4 * f + 1], xv[b][f].y, acc[r][b]);
        acc[r][b] = __fmaf_rn(v[4 * f + 2], xv[b][f].z, acc[r][b]);
        acc[r][b] = __fmaf_rn(v[4 * f + 3], xv[b][f].w, acc[r][b]);
      }
  }
}

template <class D, int NB, int R, int... t>
__device__ __forceinline__ void stream_steps(const uint4 (&q)[R], const uint32_t (&sc)[R], int rows, int cu,
                                             const float4* xs4, int64_t row4, float (&acc)[R][NB],
                                             std::integer_sequence<int, t...>) {
  (stream_step<D, NB, R, t>(q, sc, rows, cu, xs4, row4, acc), ...);
}

template <class D, int NB, int R, int U>
__device__ __forceinline__ void stream_rows(const WView& w, int64_t w_row, int rows, const float* x, int64_t ldx,
                                            int nb, float* y_col, int64_t ldy, int ks_log2, float4* xs4,
                                            float* red) {
  constexpr int V = D::kV, G = V / 4;
  constexpr int kPassChunks = kStreamFloats / NB / V;  // chunks of x staged per pass
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = 1 << ks_log2, wk = warp & (ks - 1);
  const int64_t row_bytes = w.in * D::kBytesNum / D::kBytesDen;
  const int64_t nch = w.in / V;  // chunks per row
  const uint8_t* wrow[R];
  const uint8_t* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    wrow[r] = w.data + (w_row + (r < rows ? r : 0)) * row_bytes;
    srow[r] = D::scale_row(w, w_row + (r < rows ? r : 0));
  }
  float acc[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
  uint4 q[U][R];
  uint32_t sb[U][R];
  const int step = 32 * ks;  // chunk stride of a lane
  for (int64_t p0 = 0; p0 < nch; p0 += kPassChunks) {
    const int pc = static_cast<int>(min(static_cast<int64_t>(kPassChunks), nch - p0));  // chunks this pass
    // The first batch of this pass is in flight while x is staged.
    int c = wk * 32 + lane;  // chunk within the pass
    auto issue = [&](int cb) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int cu = cb + u * step;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r < rows && cu < pc) {
            q[u][r] = dev::ld_stream16(wrow[r] + (p0 + cu) * 16);
            sb[u][r] = D::scale_byte(srow[r], p0 + cu);
          } else {
            q[u][r] = make_uint4(0u, 0u, 0u, 0u);  // not decoded
            sb[u][r] = 127u;
          }
        }
      }
    };
    issue(c);
    __syncthreads();  // the previous pass's readers are done
    stage_x<G, V, kPassChunks * G>(x + p0 * V, ldx, nb, NB * pc * G, pc * G, xs4);
    __syncthreads();
    for (;;) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int cu = c + u * step;
        if (cu < pc) {
          uint32_t sc[R];
#pragma unroll
          for (int r = 0; r < R; ++r) sc[r] = D::scale(sb[u][r]);
          stream_steps<D, NB, R>(q[u], sc, rows, cu, xs4, kPassChunks * G, acc,
                                 std::make_integer_sequence<int, V / D::kStep>{});
        }
      }
      c += U * step;
      if (c - lane >= pc) break;  // warp-uniform
      issue(c);
    }
  }
  // Warp tree per (row, x row); with KS > 1 the KS partials of a row are then added in warp order
  // by the row group's first warp (lane t: row t / NB, x row t % NB; R * NB <= 32).
  const int rg = warp >> ks_log2, groups = kGemvWarps >> ks_log2;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = dev::warp_sum(acc[r][b]);
      if (lane == 0) {
        if (ks == 1) {
          if (r < rows && b < nb) y_col[b * ldy + r] = s;
        } else {
          red[((wk * groups + rg) * R + r) * NB + b] = s;
        }
      }
    }
  if (ks == 1) return;  // block-uniform
  __syncthreads();
  if (wk == 0 && lane < R * NB) {
    const int r = lane / NB, b = lane % NB;
    float s = red[(rg * R + r) * NB + b];
    for (int k = 1; k < ks; ++k) s += red[((k * groups + rg) * R + r) * NB + b];
    if (r < rows && b < nb) y_col[b * ldy + r] = s;
  }
}

// ---------------------------------------------------------------------------------------------
// Dense / grouped kernels: blockIdx.z = group g uses W rows [g * out_rows, (g + 1) * out_rows),
// x columns [g * in, (g + 1) * in) and y columns [g * out_rows, (g + 1) * out_rows).
template <class D, int NB, int R>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(WView w, int64_t out_rows, const float* __restrict__ x, int64_t ldx, int64_t n,
                float* __restrict__ y, int64_t ldy) {
  dev::pdl_enter();
  __shared__ __align__(16) float xs[NB][kGemvChunk<NB>];
  const int64_t g = blockIdx.z;
  const int64_t o_local = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5)) * R;
  const int rows = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(R), out_rows - o_local)));
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * NB;
  const int nb = static_cast<int>(min(static_cast<int64_t>(NB), n - r0));
  gemv_rows<D, NB, R>(w, g * out_rows + o_local, rows, x + r0 * ldx + g * w.in, ldx, nb,
                      y + r0 * ldy + g * out_rows + o_local, ldy, xs);
}

// Streaming GEMV (rows 16-byte aligned): grid.x = row blocks x x-row blocks (x-row block fastest:
// the blocks that share W rows run together, so W comes from HBM once), grid.z = group.
template <class D, int NB>
__global__ void __launch_bounds__(kThreads, 2)
    stream_kernel(WView w, int64_t out_rows, const float* __restrict__ x, int64_t ldx, int64_t n,
                  float* __restrict__ y, int64_t ldy, int ks_log2, int nblk) {
  dev::pdl_enter();
  __shared__ __align__(16) float4 xs4[kStreamFloats / 4];
  __shared__ float red[kStreamRed];
  constexpr int R = StreamShape<D, NB>::R, U = StreamShape<D, NB>::U;
  const int64_t g = blockIdx.z;
  const int64_t rb = blockIdx.x / nblk, yb = blockIdx.x % nblk;
  const int rg = (threadIdx.x >> 5) >> ks_log2, groups = kGemvWarps >> ks_log2;
  const int64_t o_local = (rb * groups + rg) * R;
  const int rows = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(R), out_rows - o_local)));
  const int64_t r0 = yb * NB;
  const int nb = static_cast<int>(min(static_cast<int64_t>(NB), n - r0));
  stream_rows<D, NB, R, U>(w, g * out_rows + o_local, rows, x + r0 * ldx + g * w.in, ldx, nb,
                           y + r0 * ldy + g * out_rows + o_local, ldy, ks_log2, xs4, red);
}

// ---------------------------------------------------------------------------------------------
// Persistent streaming GEMV (decode: n <= 8 rows of x per block, rows of W 16-byte aligned, the
// block's rows of x fit its dynamic shared memory). A block stages its rows of x ONCE (swizzled
// float4 groups, xs_slot) and its warps then loop over row groups of R W rows (warp w of block b
// takes row groups w + 8 b, w + 8 b + 8 gridDim.x, ...: whole rows, no split along K). A lane owns
// chunks c = 32 i + lane of the rows (16 bytes each); a batch is U chunks of each of the R rows,
// and the loads of the warp's NEXT batch (the next chunks of the row group, or the first of its
// next row group) are issued before the current batch is decoded (two register buffers), so every
// warp keeps R x U x 512 bytes in flight across row boundaries and a block stages x once for many
// rows (the one-block-per-16-rows launch staged x per 16 rows and let its loads drain at each
// block's end). Sums: per lane fmaf over its chunks in increasing order, then a shuffle tree:
// fixed order, deterministic.
constexpr int kPersistMaxSmem = 200 * 1024;  // dynamic shared memory of a block, at most

template <int NB>
struct PersistShape {  // W rows per warp (R) and chunks per row per batch (U); NB = 1 picks R at launch
  static constexpr int R = NB <= 2 ? 2 : (NB == 4 ? 2 : 4);
  static constexpr int U = NB <= 2 ? 4 : (NB == 4 ? 2 : 1);
};

// Stages rows [0, nb) of x (row b at x + b * ldx, nch * G float4 groups each; rows nb..NB-1 as
// zeros) into xs4 (row b at b * nch * G float4s, group q of chunk c at xs_slot<G>(c, q)). Four
// loads per thread in flight before their stores.
template <int G, int NB>
__device__ __forceinline__ void persist_stage_x(const float* __restrict__ x, int64_t ldx, int nb, int64_t nch,
                                                float4* xs4) {
  const int64_t row4 = nch * G, total = NB * row4;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (ldx & 3) == 0;  // block-uniform
  const int64_t stride = blockDim.x;
  for (int64_t i0 = threadIdx.x; i0 < total; i0 += 4 * stride) {
    float4 t[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = i0 + j * stride;
      const int b = static_cast<int>(i / row4);
      const int64_t gi = i - b * row4;
      t[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i < total && b < nb) {
        if (vec) {
          t[j] = __ldg(reinterpret_cast<const float4*>(x + b * ldx) + gi);
        } else {
          const float* p = x + b * ldx + 4 * gi;
          t[j] = make_float4(p[0], p[1], p[2], p[3]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = i0 + j * stride;
      if (i < total) {
        const int b = static_cast<int>(i / row4);
        const int64_t gi = i - b * row4;
        xs4[b * row4 + dev::xs_slot<G>(static_cast<int>(gi / G), static_cast<int>(gi % G))] = t[j];
      }
    }
  }
}

// The loads of one batch: chunks c0 + 32 u + lane (u < U) of W rows w_row .. w_row + rows - 1.
template <class D, int R, int U>
__device__ __forceinline__ void persist_load(const WView& w, int64_t row_bytes, int64_t w_row, int rows,
                                             int64_t nch, int64_t c0, uint4 (&q)[U][R], uint32_t (&s)[U][R]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t o = w_row + (r < rows ? r : 0);
    const uint8_t* wr = w.data + o * row_bytes;
    const uint8_t* sr = D::scale_row(w, o);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32 + lane;
      if (r < rows && c < nch) {
        q[u][r] = dev::ld_stream16(wr + c * 16);
        s[u][r] = D::scale_byte(sr, c);
      } else {
        q[u][r] = make_uint4(0u, 0u, 0u, 0u);
        s[u][r] = 127u;
      }
    }
  }
}

template <class D, int NB, int R, int U>
__device__ __forceinline__ void persist_compute(const uint4 (&q)[U][R], const uint32_t (&s)[U][R], int rows,
                                                int64_t nch, int64_t c0, const float4* xs4, int64_t row4,
                                                float (&acc)[R][NB]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = c0 + u * 32 + lane;
    if (c < nch) {
      uint32_t sc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) sc[r] = D::scale(s[u][r]);
      stream_steps<D, NB, R>(q[u], sc, rows, static_cast<int>(c), xs4, row4, acc,
                              std::make_integer_sequence<int, D::kV / D::kStep>{});
    }
  }
}

// Row group rg done: the warp's sums to y_col[b * ldy + rg * R + r]; the accumulators restart.
template <int NB, int R>
__device__ __forceinline__ void persist_flush(float (&acc)[R][NB], int64_t rg, int rows, int nb, float* y_col,
                                              int64_t ldy) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = dev::warp_sum(acc[r][b]);
      if (lane == 0 && r < rows && b < nb) y_col[b * ldy + rg * R + r] = s;
      acc[r][b] = 0.0f;
    }
}

// One block's share of W rows [w_row0, w_row0 + out_rows) against its nb (<= NB) rows of x; row
// groups rg_first, rg_first + rg_step, ... for this warp. Every thread of the block calls it (two
// barriers: the previous caller's readers of xs4, then the staging).
template <class D, int NB, int R, int U>
__device__ __forceinline__ void persist_run(const WView& w, int64_t out_rows, int64_t w_row0, const float* x,
                                            int64_t ldx, int nb, float* y_col, int64_t ldy, int64_t rg_first,
                                            int64_t rg_step, float4* xs4) {
  constexpr int G = D::kV / 4;
  const int64_t nch = w.in / D::kV, row4 = nch * G;
  const int64_t row_bytes = w.in * D::kBytesNum / D::kBytesDen;
  const int64_t nrg = (out_rows + R - 1) / R, bpr = (nch + 32 * U - 1) / (32 * U);
  auto rows_of = [&](int64_t g) { return static_cast<int>(min(static_cast<int64_t>(R), out_rows - g * R)); };
  uint4 qa[U][R], qb[U][R];
  uint32_t sa[U][R], sb[U][R];
  float acc[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
  int64_t rg = rg_first, j = 0;
  // The first batch is in flight while x is staged.
  if (rg < nrg) persist_load<D, R, U>(w, row_bytes, w_row0 + rg * R, rows_of(rg), nch, 0, qa, sa);
  __syncthreads();
  persist_stage_x<G, NB>(x, ldx, nb, nch, xs4);
  __syncthreads();
  if (rg >= nrg) return;
  for (;;) {
    int64_t rg1 = rg, j1 = j + 1;
    if (j1 == bpr) {
      j1 = 0;
      rg1 += rg_step;
    }
    const bool more1 = rg1 < nrg;
    if (more1) persist_load<D, R, U>(w, row_bytes, w_row0 + rg1 * R, rows_of(rg1), nch, j1 * 32 * U, qb, sb);
    persist_compute<D, NB, R, U>(qa, sa, rows_of(rg), nch, j * 32 * U, xs4, row4, acc);
    if (j == bpr - 1) persist_flush<NB, R>(acc, rg, rows_of(rg), nb, y_col, ldy);
    if (!more1) break;
    int64_t rg2 = rg1, j2 = j1 + 1;
    if (j2 == bpr) {
      j2 = 0;
      rg2 += rg_step;
    }
    const bool more2 = rg2 < nrg;
    if (more2) persist_load<D, R, U>(w, row_bytes, w_row0 + rg2 * R, rows_of(rg2), nch, j2 * 32 * U, qa, sa);
    persist_compute<D, NB, R, U>(qb, sb, rows_of(rg1), nch, j1 * 32 * U, xs4, row4, acc);
    if (j1 == bpr - 1) persist_flush<NB, R>(acc, rg1, rows_of(rg1), nb, y_col, ldy);
    if (!more2) break;
    rg = rg2;
    j = j2;
  }
}

// The same work with a shared-memory ring instead of register buffers: each warp owns S stages of
// R x U x 32 16-byte chunk slots (a lane only ever reads the slots it filled itself, so no barrier
// between lanes), filled by cp.async (16 bytes, bypassing L1) S - 1 batches ahead of the one being
// decoded; the scale bytes ride along in registers (one small array per stage). A warp thus keeps
// S - 1 batches in flight while it decodes, and no loaded weight holds a register before its decode.
using dev::cp_async16;
using dev::cp_async_commit;
using dev::cp_async_wait;

template <int R, int U, int S>
constexpr int kRingChunksPerWarp = S * R * U * 32;  // 16-byte slots

// Task k of the warp: row group rg_first + (k / bpr) * rg_step, batch k % bpr (chunks from
// (k % bpr) * 32 U), into ring stage k % S. Every task commits one cp.async group (an empty one past
// the warp's last task), so "groups 0 .. k complete" is wait_group(S - 1) after task k + S - 1 is
// issued.
template <class D, int R, int U, int S, int st>
__device__ __forceinline__ void ring_issue(const WView& w, int64_t row_bytes, int64_t w_row0, int64_t out_rows,
                                           int64_t nch, int64_t bpr, int64_t ntask, int64_t rg_first,
                                           int64_t rg_step, int64_t k, uint4* ring, uint32_t (&sb)[S][U][R]) {
  const int lane = threadIdx.x & 31;
  if (k < ntask) {
    const int64_t rg = rg_first + (k / bpr) * rg_step, c0 = (k % bpr) * 32 * U;
    const int rows = static_cast<int>(min(static_cast<int64_t>(R), out_rows - rg * R));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t o = w_row0 + rg * R + (r < rows ? r : 0);
      const uint8_t* wr = w.data + o * row_bytes;
      const uint8_t* sr = D::scale_row(w, o);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = c0 + u * 32 + lane;
        if (r < rows && c < nch) {
          cp_async16(ring + ((st * R + r) * U + u) * 32 + lane, wr + c * 16);
          sb[st][u][r] = D::scale_byte(sr, c);
        } else {
          sb[st][u][r] = 127u;
        }
      }
    }
  }
  cp_async_commit();
}

template <class D, int NB, int R, int U, int S, int st>
__device__ __forceinline__ void ring_task(const WView& w, int64_t row_bytes, int64_t w_row0, int64_t out_rows,
                                          int64_t nch, int64_t row4, int64_t bpr, int64_t ntask, int64_t rg_first,
                                          int64_t rg_step, int64_t k, uint4* ring, uint32_t (&sb)[S][U][R],
                                          const float4* xs4, int nb, float* y_col, int64_t ldy, float (&acc)[R][NB]) {
  const int lane = threadIdx.x & 31;
  // The stage task k - 1 used (its slots were read by this lane before: program order).
  ring_issue<D, R, U, S, (st + S - 1) % S>(w, row_bytes, w_row0, out_rows, nch, bpr, ntask, rg_first, rg_step,
                                           k + S - 1, ring, sb);
  cp_async_wait<S - 1>();
  const int64_t rg = rg_first + (k / bpr) * rg_step, j = k % bpr;
  const int rows = static_cast<int>(min(static_cast<int64_t>(R), out_rows - rg * R));
  uint4 q[U][R];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r) q[u][r] = ring[((st * R + r) * U + u) * 32 + lane];
  persist_compute<D, NB, R, U>(q, sb[st], rows, nch, j * 32 * U, xs4, row4, acc);
  if (j == bpr - 1) persist_flush<NB, R>(acc, rg, rows, nb, y_col, ldy);
}

template <class D, int NB, int R, int U, int S, int... st>
__device__ __forceinline__ void ring_prologue(const WView& w, int64_t row_bytes, int64_t w_row0, int64_t out_rows,
                                              int64_t nch, int64_t bpr, int64_t ntask, int64_t rg_first,
                                              int64_t rg_step, uint4* ring, uint32_t (&sb)[S][U][R],
                                              std::integer_sequence<int, st...>) {
  (ring_issue<D, R, U, S, st>(w, row_bytes, w_row0, out_rows, nch, bpr, ntask, rg_first, rg_step, st, ring, sb),
   ...);
}

template <class D, int NB, int R, int U, int S, int... st>
__device__ __forceinline__ void ring_round(const WView& w, int64_t row_bytes, int64_t w_row0, int64_t out_rows,
                                           int64_t nch, int64_t row4, int64_t bpr, int64_t ntask, int64_t rg_first,
                                           int64_t rg_step, int64_t k0, uint4* ring, uint32_t (&sb)[S][U][R],
                                           const float4* xs4, int nb, float* y_col, int64_t ldy,
                                           float (&acc)[R][NB], std::integer_sequence<int, st...>) {
  // Tasks k0 .. k0 + S - 1 (stage = position in the round); stops at the warp's last task.
  (void)((k0 + st < ntask
              ? (ring_task<D, NB, R, U, S, st>(w, row_bytes, w_row0, out_rows, nch, row4, bpr, ntask, rg_first,
                                               rg_step, k0 + st, ring, sb, xs4, nb, y_col, ldy, acc),
                 true)
              : false) &&
         ...);
}

template <class D, int NB, int R, int U, int S>
__device__ __forceinline__ void persist_run_ring(const WView& w, int64_t out_rows, int64_t w_row0, const float* x,
                                                 int64_t ldx, int nb, float* y_col, int64_t ldy, int64_t rg_first,
                                                 int64_t rg_step, float4* xs4, uint4* ring) {
  constexpr int G = D::kV / 4;
  const int64_t nch = w.in / D::kV, row4 = nch * G;
  const int64_t row_bytes = w.in * D::kBytesNum / D::kBytesDen;
  const int64_t nrg = (out_rows + R - 1) / R, bpr = (nch + 32 * U - 1) / (32 * U);
  const int64_t ntask = rg_first < nrg ? ((nrg - 1 - rg_first) / rg_step + 1) * bpr : 0;
  uint32_t sb[S][U][R];
  float acc[R][NB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < NB; ++b) acc[r][b] = 0.0f;
  // Tasks 0 .. S - 2 are in flight while x is staged.
  ring_prologue<D, NB, R, U, S>(w, row_bytes, w_row0, out_rows, nch, bpr, ntask, rg_first, rg_step, ring, sb,
                                std::make_integer_sequence<int, S - 1>{});
  __syncthreads();
  persist_stage_x<G, NB>(x, ldx, nb, nch, xs4);
  __syncthreads();
  for (int64_t k0 = 0; k0 < ntask; k0 += S)
    ring_round<D, NB, R, U, S>(w, row_bytes, w_row0, out_rows, nch, row4, bpr, ntask, rg_first, rg_step, k0, ring,
                               sb, xs4, nb, y_col, ldy, acc, std::make_integer_sequence<int, S>{});
  cp_async_wait<0>();  // no copy into the block's shared memory outlives the call
}

// The persistent body of pipeline S (0: the register double buffer; >= 2: the ring in `ring`).
template <class D, int NB, int R, int U, int S>
__device__ __forceinline__ void persist_body(const WView& w, int64_t out_rows, int64_t w_row0, const float* x,
                                             int64_t ldx, int nb, float* y_col, int64_t ldy, int64_t rg_first,
                                             int64_t rg_step, float4* xs4, uint4* ring) {
  if constexpr (S == 0)
    persist_run<D, NB, R, U>(w, out_rows, w_row0, x, ldx, nb, y_col, ldy, rg_first, rg_step, xs4);
  else
    persist_run_ring<D, NB, R, U, S>(w, out_rows, w_row0, x, ldx, nb, y_col, ldy, rg_first, rg_step, xs4, ring);
}

// L2 prefetch (no data consumed: safe before pdl_wait) of the row groups rg_first, + rg_step, ...
// of W rows [w_row0, w_row0 + out_rows) in groups of R, up to this warp's share of kPrefetchBytes
// over the launch's `warps`: the whole matrix when it is small, the first rows of a large one.
constexpr int64_t kPrefetchBytes = int64_t{24} << 20;

__device__ __forceinline__ void prefetch_rows_l2(const WView& w, int64_t row_bytes, int64_t w_row0, int64_t out_rows,
                                                 int R, int64_t rg_first, int64_t rg_step, int64_t warps) {
  const int lane = threadIdx.x & 31;
  const int64_t lines = (row_bytes + 127) >> 7;
  int64_t budget = kPrefetchBytes / 128 / max(warps, int64_t{1});
  for (int64_t rg = rg_first; rg * R < out_rows && budget > 0; rg += rg_step) {
    for (int r = 0; r < R && rg * R + r < out_rows; ++r) {
      const uint8_t* base = w.data + (w_row0 + rg * R + r) * row_bytes;
      for (int64_t l = lane; l < lines; l += 32) dev::prefetch_l2(base + (l << 7));
    }
    budget -= R * lines;
  }
}

// Dense / grouped: grid = (row-group slots, x-row blocks of NB, groups).
// S = 0: register double buffer (persist_run); S >= 2: the shared-memory ring (persist_run_ring),
// its slots after the x rows (x_floats, a multiple of 4).
template <class D, int NB, int R, int U, int S>
__global__ void __launch_bounds__(kThreads, 2)
    persist_kernel(WView w, int64_t out_rows, const float* __restrict__ x, int64_t ldx, int64_t n,
                   float* __restrict__ y, int64_t ldy, int64_t x_floats) {
  extern __shared__ __align__(16) float smem[];
  float4* xs4 = reinterpret_cast<float4*>(smem);
  const int64_t g = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * NB;
  // PDL (launch.h): the weights depend on no earlier kernel, so this warp's first rows start
  // streaming into L2 while the previous kernel finishes; x is read only after the wait.
  if (blockIdx.y == 0)
    prefetch_rows_l2(w, (w.in * D::kBytesNum) / D::kBytesDen, g * out_rows, out_rows, R,
                     static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5),
                     static_cast<int64_t>(gridDim.x) * kGemvWarps, static_cast<int64_t>(gridDim.x) * kGemvWarps * gridDim.z);
  dev::pdl_enter();
  const int nb = static_cast<int>(min(static_cast<int64_t>(NB), n - r0));
  const int64_t rg_first = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  uint4* ring = reinterpret_cast<uint4*>(smem + x_floats) +
                (threadIdx.x >> 5) * kRingChunksPerWarp<R, U, (S > 0 ? S : 1)>;
  persist_body<D, NB, R, U, S>(w, out_rows, g * out_rows, x + r0 * ldx + g * w.in, ldx, nb,
                               y + r0 * ldy + g * out_rows, ldy, rg_first,
                               static_cast<int64_t>(gridDim.x) * kGemvWarps, xs4, ring);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    tile_kernel(WView w, int64_t out_rows, const float* __restrict__ x, int64_t ldx, int64_t n,
                float* __restrict__ y, int64_t ldy) {
  dev::pdl_enter();
  __shared__ __align__(16) float ws[kTileK][kTileN + 4];
  __shared__ __align__(16) float xt[kTileK][kTileM + 4];
  const int64_t g = blockIdx.z;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int rows_valid = static_cast<int>(min(static_cast<int64_t>(kTileN), out_rows - o0));
  const int nb = static_cast<int>(min(static_cast<int64_t>(kTileM), n - r0));
  tile_rows<D>(w, g * out_rows + o0, rows_valid, x + r0 * ldx + g * w.in, ldx, nb,
               y + r0 * ldy + g * out_rows + o0, ldy, ws, xt);
}

// ---------------------------------------------------------------------------------------------
// Expert units: expert e owns ceil(rows_e / unit) units; unit_start[e] is the exclusive prefix
// (unit_start[E] = total). Block-wide (every thread gets the total); E <= kMaxExperts.
__device__ int expert_units(const int64_t* __restrict__ offsets, int64_t n_experts, int unit,
                            int* unit_start) {
  __shared__ int part[kThreads];
  const int tid = threadIdx.x;
  auto units = [&](int64_t e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    return rows > 0 ? static_cast<int>((rows + unit - 1) / unit) : 0;
  };
  const dev::ThreadRange tr = dev::thread_range(n_experts);
  int s = 0;
  for (int64_t e = tr.begin; e < tr.end; ++e) s += units(e);
  int total = 0;
  int run = dev::block_exclusive_scan(s, part, &total);
  for (int64_t e = tr.begin; e < tr.end; ++e) {
    unit_start[e] = run;
    run += units(e);
  }
  if (tid == 0) unit_start[n_experts] = total;
  __syncthreads();
  return total;
}

// The expert owning unit u (u < total): the largest e with unit_start[e] <= u.
__device__ __forceinline__ int64_t unit_expert(const int* unit_start, int64_t n_experts, int u) {
  int64_t lo = 0, hi = n_experts - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (unit_start[mid] <= u)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Expert GEMV (units of NB rows of one expert, every block scans the offsets once): the streaming
// body, R W rows per warp for every format (the grid is sized on the host, which does not read the
// formats); an expert whose rows are not 16-byte aligned (payload address or row width) runs the
// V = 4/8 body (gemv_rows) on the same rows, x staged in the same buffer.
template <int NB>
constexpr int kExpertR = 2;  // W rows per warp
template <int NB>
constexpr int kExpertU = NB == 1 ? 4 : 1;  // chunks per row in flight per lane

__device__ __forceinline__ bool rows_16b(const DeviceWeight& dw, int64_t in_dim) {
  const int64_t row_bytes = dw.format == WeightFormat::kF32    ? in_dim * 4
                            : dw.format == WeightFormat::kBF16 ? in_dim * 2
                            : dw.format == WeightFormat::kFp4Rows ? in_dim / 2
                                                                  : in_dim;
  return (reinterpret_cast<uintptr_t>(dw.data) & 15u) == 0 && row_bytes % 16 == 0;
}

template <int NB>
__global__ void __launch_bounds__(kThreads, 2)
    expert_stream_kernel(const DeviceWeight* __restrict__ weights, int64_t n_experts, int64_t out_dim,
                         int64_t in_dim, const int64_t* __restrict__ offsets, const float* __restrict__ x,
                         float* __restrict__ y) {
  dev::pdl_enter();
  static_assert(NB * kGemvChunk<NB> <= kStreamFloats, "the V = 4/8 body's x fits the staging buffer");
  __shared__ __align__(16) float4 xs4[kStreamFloats / 4];
  __shared__ float red[kStreamRed];
  __shared__ int unit_start[kMaxExperts + 1];
  auto& xs = *reinterpret_cast<float(*)[NB][kGemvChunk<NB>]>(xs4);
  constexpr int R = kExpertR<NB>, U = kExpertU<NB>;
  const int total = expert_units(offsets, n_experts, NB, unit_start);
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5)) * R;
  const int rows = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(R), out_dim - o)));
  for (int u = blockIdx.y; u < total; u += gridDim.y) {
    const int64_t e = unit_expert(unit_start, n_experts, u);
    const int64_t r0 = offsets[e] + static_cast<int64_t>(u - unit_start[e]) * NB;
    const int nb = static_cast<int>(min(static_cast<int64_t>(NB), offsets[e + 1] - r0));
    const DeviceWeight dw = weights[e];
    const WView w{dw.data, dw.scale, in_dim};
    const float* xr = x + r0 * in_dim;
    float* yr = y + r0 * out_dim + o;
    if (rows_16b(dw, in_dim)) {
      switch (dw.format) {
        case WeightFormat::kFp4Rows:
          stream_rows<dev::WideFp4, NB, R, U>(w, o, rows, xr, in_dim, nb, yr, out_dim, 0, xs4, red);
          break;
        case WeightFormat::kFp8Tiles:
          stream_rows<dev::WideFp8, NB, R, U>(w, o, rows, xr, in_dim, nb, yr, out_dim, 0, xs4, red);
          break;
        case WeightFormat::kBF16:
          stream_rows<dev::WideBF16, NB, R, U>(w, o, rows, xr, in_dim, nb, yr, out_dim, 0, xs4, red);
          break;
        case WeightFormat::kF32:
          stream_rows<dev::WideF32, NB, R, U>(w, o, rows, xr, in_dim, nb, yr, out_dim, 0, xs4, red);
          break;
        default: break;
      }
    } else {
      switch (dw.format) {
        case WeightFormat::kFp4Rows:
          gemv_rows<dev::DecFp4, NB, R>(w, o, rows, xr, in_dim, nb, yr, out_dim, xs);
          break;
        case WeightFormat::kFp8Tiles:
          gemv_rows<dev::DecFp8, NB, R>(w, o, rows, xr, in_dim, nb, yr, out_dim, xs);
          break;
        case WeightFormat::kBF16:
          gemv_rows<dev::DecBF16, NB, R>(w, o, rows, xr, in_dim, nb, yr, out_dim, xs);
          break;
        case WeightFormat::kF32:
          gemv_rows<dev::DecF32, NB, R>(w, o, rows, xr, in_dim, nb, yr, out_dim, xs);
          break;
        default: break;
      }
    }
  }
}

// Expert GEMV, persistent (decode: about one row of x per used expert): units of NB rows of one
// expert (expert_units); block (bx, by) takes units by, by + gridDim.y, ... and, per unit, the row
// groups bx * 8 + warp, + 8 gridDim.x, ... of that expert's W through persist_run (x of the unit
// staged once per block). An expert whose rows are not 16-byte aligned runs the V = 4/8 body
// (gemv_rows) over the same row groups, every warp the same number of times (it stages x behind
// barriers).
template <int NB, int R, int U, int S>
__global__ void __launch_bounds__(kThreads, 2)
    persist_expert_kernel(const DeviceWeight* __restrict__ weights, int64_t n_experts, int64_t out_dim,
                          int64_t in_dim, const int64_t* __restrict__ offsets, const float* __restrict__ x,
                          float* __restrict__ y, int64_t x_floats) {
  dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  __shared__ int unit_start[kMaxExperts + 1];
  float4* xs4 = reinterpret_cast<float4*>(smem);
  auto& xs = *reinterpret_cast<float(*)[NB][kGemvChunk<NB>]>(smem);
  const int total = expert_units(offsets, n_experts, NB, unit_start);
  const int64_t rg_first = static_cast<int64_t>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  const int64_t rg_step = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  uint4* ring = reinterpret_cast<uint4*>(smem + x_floats) +
                (threadIdx.x >> 5) * kRingChunksPerWarp<R, U, (S > 0 ? S : 1)>;
  for (int u = blockIdx.y; u < total; u += gridDim.y) {
    const int64_t e = unit_expert(unit_start, n_experts, u);
    const int64_t r0 = offsets[e] + static_cast<int64_t>(u - unit_start[e]) * NB;
    const int nb = static_cast<int>(min(static_cast<int64_t>(NB), offsets[e + 1] - r0));
    const DeviceWeight dw = weights[e];
    const WView w{dw.data, dw.scale, in_dim};
    const float* xr = x + r0 * in_dim;
    float* yr = y + r0 * out_dim;
    if (rows_16b(dw, in_dim)) {
      switch (dw.format) {
        case WeightFormat::kFp4Rows:
          persist_body<dev::WideFp4, NB, R, U, S>(w, out_dim, 0, xr, in_dim, nb, yr, out_dim, rg_first, rg_step, xs4,
                                                 ring);
          break;
        case WeightFormat::kFp8Tiles:
          persist_body<dev::WideFp8, NB, R, U, S>(w, out_dim, 0, xr, in_dim, nb, yr, out_dim, rg_first, rg_step, xs4,
                                                 ring);
          break;
        case WeightFormat::kBF16:
          persist_body<dev::WideBF16, NB, R, U, S>(w, out_dim, 0, xr, in_dim, nb, yr, out_dim, rg_first, rg_step, xs4,
                                                 ring);
          break;
        case WeightFormat::kF32:
          persist_body<dev::WideF32, NB, R, U, S>(w, out_dim, 0, xr, in_dim, nb, yr, out_dim, rg_first, rg_step, xs4,
                                                 ring);
          break;
        default: break;
      }
    } else {
      const int64_t nrg = (out_dim + R - 1) / R, iters = (nrg + rg_step - 1) / rg_step;
      for (int64_t i = 0; i < iters; ++i) {
        const int64_t o = (rg_first + i * rg_step) * R;
        const int rows = static_cast<int>(max(int64_t{0}, min(static_cast<int64_t>(R), out_dim - o)));
        switch (dw.format) {
          case WeightFormat::kFp4Rows:
            gemv_rows<dev::DecFp4, NB, R>(w, o, rows, xr, in_dim, nb, yr + o, out_dim, xs);
            break;
          case WeightFormat::kFp8Tiles:
            gemv_rows<dev::DecFp8, NB, R>(w, o, rows, xr, in_dim, nb, yr + o, out_dim, xs);
            break;
          case WeightFormat::kBF16:
            gemv_rows<dev::DecBF16, NB, R>(w, o, rows, xr, in_dim, nb, yr + o, out_dim, xs);
            break;
          case WeightFormat::kF32:
            gemv_rows<dev::DecF32, NB, R>(w, o, rows, xr, in_dim, nb, yr + o, out_dim, xs);
            break;
          default: break;
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    expert_tile_kernel(const DeviceWeight* __restrict__ weights, int64_t n_experts, int64_t out_dim,
                       int64_t in_dim, const int64_t* __restrict__ offsets, const float* __restrict__ x,
                       float* __restrict__ y) {
  dev::pdl_enter();
  __shared__ __align__(16) float ws[kTileK][kTileN + 4];
  __shared__ __align__(16) float xt[kTileK][kTileM + 4];
  __shared__ int unit_start[kMaxExperts + 1];
  const int total = expert_units(offsets, n_experts, kTileM, unit_start);
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int rows_valid = static_cast<int>(min(static_cast<int64_t>(kTileN), out_dim - o0));
  for (int u = blockIdx.y; u < total; u += gridDim.y) {
    const int64_t e = unit_expert(unit_start, n_experts, u);
    const int64_t r0 = offsets[e] + static_cast<int64_t>(u - unit_start[e]) * kTileM;
    const int nb = static_cast<int>(min(static_cast<int64_t>(kTileM), offsets[e + 1] - r0));
    const WView w{weights[e].data, weights[e].scale, in_dim};
    const float* xr = x + r0 * in_dim;
    float* yr = y + r0 * out_dim + o0;
    switch (weights[e].format) {
      case WeightFormat::kFp4Rows:
        tile_rows<dev::DecFp4>(w, o0, rows_valid, xr, in_dim, nb, yr, out_dim, ws, xt);
        break;
      case WeightFormat::kFp8Tiles:
        tile_rows<dev::DecFp8>(w, o0, rows_valid, xr, in_dim, nb, yr, out_dim, ws, xt);
        break;
      case WeightFormat::kBF16:
        tile_rows<dev::DecBF16>(w, o0, rows_valid, xr, in_dim, nb, yr, out_dim, ws, xt);
        break;
      case WeightFormat::kF32:
        tile_rows<dev::DecF32>(w, o0, rows_valid, xr, in_dim, nb, yr, out_dim, ws, xt);
        break;
      default: break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
unsigned ceil_u(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

bool is_linear_format(WeightFormat f) {
  return f == WeightFormat::kF32 || f == WeightFormat::kBF16 || f == WeightFormat::kFp8Tiles ||
         f == WeightFormat::kFp4Rows;
}

Status check_weight(const DeviceWeight& w, const char* fn) {
  if (!is_linear_format(w.format))
    return invalid_argument(std::string(fn) + ": w.format " + quant::weight_format_name(w.format) +
                            " (want f32, bf16, fp8-tiles-32 or fp4-rows-32)");
  if (w.out_dim <= 0 || w.in_dim <= 0)
    return invalid_argument(std::string(fn) + ": w dims " + std::to_string(w.out_dim) + "x" +
                            std::to_string(w.in_dim) + " must be positive");
  if (!w.data) return invalid_argument(std::string(fn) + ": w.data is null");
  const bool scaled = w.format == WeightFormat::kFp8Tiles || w.format == WeightFormat::kFp4Rows;
  if (scaled && !w.scale) return invalid_argument(std::string(fn) + ": w.scale is null for a scaled format");
  if (w.format == WeightFormat::kFp4Rows && w.in_dim % 32 != 0)
    return invalid_argument(std::string(fn) + ": fp4 w.in_dim " + std::to_string(w.in_dim) +
                            " is not a multiple of 32");
  return ok_status();
}

// Whether the vector decoder of the format applies (width and alignment of the payload).
bool vector_ok(WeightFormat f, int64_t in, const void* data) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  switch (f) {
    case WeightFormat::kF32: return in % 4 == 0 && p % 16 == 0;
    case WeightFormat::kBF16: return in % 4 == 0 && p % 8 == 0;
    case WeightFormat::kFp8Tiles: return in % 4 == 0 && p % 4 == 0;
    case WeightFormat::kFp4Rows: return in % 32 == 0 && p % 4 == 0;
    default: return false;
  }
}

// Decode (one row of x): 4 W rows per warp when that still leaves two blocks per SM (132 SMs);
// the staged row of x then serves 32 W rows per block instead of 8.
int rows_per_warp(int64_t out_rows, int64_t blocks_per_row) {
  return (out_rows + kGemvWarps * 4 - 1) / (kGemvWarps * 4) * blocks_per_row >= 2 * 132 ? 4 : 1;
}

// GEMV unless n is large and the tiles fill at least one wave of the device.
bool use_gemv(int64_t out_rows, int64_t groups, int64_t n) {
  if (n <= kGemvMaxN) return true;
  const int64_t tiles = ((out_rows + kTileN - 1) / kTileN) * ((n + kTileM - 1) / kTileM) * groups;
  return tiles < kMinTiles && n <= int64_t{8} * 65535;
}

// Rows of W 16 bytes wide and aligned: the streaming GEMV applies.
bool rows_16b_host(WeightFormat f, int64_t in, const void* data) {
  const int64_t row_bytes = f == WeightFormat::kF32        ? in * 4
                            : f == WeightFormat::kBF16     ? in * 2
                            : f == WeightFormat::kFp4Rows  ? (in % 2 == 0 ? in / 2 : 1)
                            : f == WeightFormat::kFp8Tiles ? in
                                                           : 1;
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && row_bytes % 16 == 0;
}

// Warps along K of a streaming launch (log2): the fewest that give two blocks per SM (132 SMs),
// as long as every warp keeps at least 32 chunks of its rows (one per lane).
template <class W, int NB>
int stream_ks_log2(int64_t out_rows, int64_t groups, int64_t nblk, int64_t in) {
  constexpr int R = StreamShape<W, NB>::R;
  const int64_t nch = in / W::kV;
  int l = 0;
  while (l < 3) {
    const int64_t rows_per_block = (kGemvWarps >> l) * R;
    if ((out_rows + rows_per_block - 1) / rows_per_block * nblk * groups >= 2 * 132) break;
    if (nch < int64_t{32} << (l + 1)) break;
    ++l;
  }
  return l;
}

template <class W, int NB>
void launch_stream(const WView& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
                   float* y, int64_t ldy, cudaStream_t stream) {
  const int64_t nblk = (n + NB - 1) / NB;
  const int l = stream_ks_log2<W, NB>(out_rows, groups, nblk, w.in);
  const int64_t rows_per_block = (kGemvWarps >> l) * StreamShape<W, NB>::R;
  const dim3 grid(static_cast<unsigned>((out_rows + rows_per_block - 1) / rows_per_block * nblk), 1,
                  static_cast<unsigned>(groups));
  launch(stream_kernel<W, NB>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy, l, static_cast<int>(nblk));
}

// Lets kernel K use up to kPersistMaxSmem bytes of dynamic shared memory (once per kernel).
template <auto K>
void allow_persist_smem() {
  static const bool done = [] {
    cudaFuncSetAttribute(reinterpret_cast<const void*>(K), cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kPersistMaxSmem);
    return true;
  }();
  (void)done;
}

// Blocks of a persistent launch: two per SM when their shared memory allows (launch bounds give
// every thread up to 128 registers at two blocks), as many row-group slots as fill them.
int g_persist_slot_cap = 0;  // set_persist_slot_cap_for_tests
int g_persist_ring = -1;      // set_persist_ring_for_tests; -1: DS41_GEMV_PIPELINE (regs | ring, default regs)
constexpr int kRingStages = 4;

// The register double buffer by default: measured on the H200 (bench decode, batch 1, 8 layers),
// 4.51 ms with it and 5.20 ms with the ring (wq_b 23.9 vs 35.5 us, FP4 experts w1 42.5 vs 53.6 us):
// more bytes in flight did not help, so these kernels are not bound by the loads in flight.
bool persist_ring() {
  if (g_persist_ring >= 0) return g_persist_ring != 0;
  static const bool ring = [] {
    const char* e = std::getenv("DS41_GEMV_PIPELINE");
    return e && std::string(e) == "ring";
  }();
  return ring;
}

int64_t persist_slots(int64_t nrg, int64_t other_blocks, size_t smem) {
  const int64_t per_sm = smem * 2 + 16 * 1024 <= 227 * 1024 ? 2 : 1;
  const int64_t target = sm_count() * per_sm;
  int64_t want = (target + other_blocks - 1) / other_blocks;
  if (g_persist_slot_cap > 0) want = std::min<int64_t>(want, g_persist_slot_cap);
  return std::max<int64_t>(1, std::min<int64_t>((nrg + kGemvWarps - 1) / kGemvWarps, want));
}

// Chunks per lane per batch (U) of a one-row persistent GEMV over rows of nch 16-byte chunks: the U
// of {3, 4, 5} that leaves the fewest lanes idle in a row's last batch (FP4 experts' w1, 160 chunks:
// one batch at U = 5 instead of 128 + 32 at U = 4; shared w2, 144 FP8 chunks: 160 slots instead of
// 256), ties to the larger U. Each lane still takes its chunks lane, lane + 32, lane + 64, ... in
// that order whatever U is, so the sums and the bits are the same for every U (and the same as the
// NB = 2 / 4 / 8 shapes'): U only sets how many loads are in flight and how many lanes idle.
int g_persist_u = 0;  // set_persist_u_for_tests: 0 the choice below, else that U (3, 4 or 5)

int persist_u(int64_t nch) {
  if (g_persist_u > 0) return g_persist_u;
  int best = 4;
  double best_use = 0;
  for (int u : {5, 4, 3}) {
    const int64_t slots = int64_t{32} * u, batches = (nch + slots - 1) / slots;
    const double use = static_cast<double>(nch) / static_cast<double>(slots * batches);
    if (use > best_use + 1e-9) {
      best_use = use;
      best = u;
    }
  }
  return best;
}

template <class W, int NB, int R, int S, int U = PersistShape<NB>::U>
void launch_persist_s(const WView& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
                      float* y, int64_t ldy, size_t smem, cudaStream_t stream) {
  allow_persist_smem<persist_kernel<W, NB, R, U, S>>();
  const int64_t x_floats = static_cast<int64_t>(smem / sizeof(float) + 3) / 4 * 4;
  if (S > 0) smem = x_floats * sizeof(float) + size_t{16} * kGemvWarps * kRingChunksPerWarp<R, U, (S > 0 ? S : 1)>;
  const int64_t nblk = (n + NB - 1) / NB, nrg = (out_rows + R - 1) / R;
  const dim3 grid(static_cast<unsigned>(persist_slots(nrg, nblk * groups, smem)), static_cast<unsigned>(nblk),
                  static_cast<unsigned>(groups));
  launch(persist_kernel<W, NB, R, U, S>, grid, kThreads, smem, stream, w, out_rows, x, ldx, n, y, ldy, x_floats);
}

// The ring at NB <= 2 when x and the ring fit kPersistMaxSmem, else the register double buffer.
template <class W, int NB, int R>
void launch_persist(const WView& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
                    float* y, int64_t ldy, size_t smem, cudaStream_t stream) {
  constexpr int U = PersistShape<NB>::U;
  const size_t ring_bytes = size_t{16} * kGemvWarps * kRingChunksPerWarp<R, U, kRingStages>;
  if constexpr (NB <= 2) {
    if (persist_ring() && smem + 16 + ring_bytes <= static_cast<size_t>(kPersistMaxSmem)) {
      launch_persist_s<W, NB, R, kRingStages>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
      return;
    }
  }
  if constexpr (NB == 1 && std::is_same_v<W, dev::WideFp8>) {
    const int u = persist_u(w.in / W::kV);
    if (u == 3) return launch_persist_s<W, NB, R, 0, 3>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
    if (u == 5) return launch_persist_s<W, NB, R, 0, 5>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
  }
  launch_persist_s<W, NB, R, 0>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
}

// The persistent GEMV for n <= 8 when its x rows fit the shared memory; false: not taken.
template <class W>
bool try_persist(const WView& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
                 float* y, int64_t ldy, cudaStream_t stream) {
  if (n > 8 || w.in % W::kV != 0) return false;
  const int nb = n == 1 ? 1 : (n == 2 ? 2 : (n <= 4 ? 4 : 8));
  if (W::kV == 32 && nb > 1) return false;  // FP4 (dense use: tests) spills at NB >= 2: the split-K launch
  const size_t smem = static_cast<size_t>(nb) * static_cast<size_t>(w.in) * sizeof(float);
  if (smem > static_cast<size_t>(kPersistMaxSmem)) return false;
  if (nb == 1) {
    // Two W rows per warp only when there are enough rows to keep every warp of the launch busy.
    if (out_rows >= int64_t{4} * sm_count() * 2 * kGemvWarps)
      launch_persist<W, 1, PersistShape<1>::R>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
    else
      launch_persist<W, 1, 1>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
  } else if (nb == 2) {
    launch_persist<W, 2, PersistShape<2>::R>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
  } else if (nb == 4) {
    launch_persist<W, 4, PersistShape<4>::R>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
  } else {
    launch_persist<W, 8, PersistShape<8>::R>(w, out_rows, groups, x, ldx, n, y, ldy, smem, stream);
  }
  return true;
}

template <class D, class W>
void launch_dense(const WView& w, bool wide, int64_t out_rows, int64_t groups, const float* x, int64_t ldx,
                  int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  if (use_gemv(out_rows, groups, n)) {
    if (wide) {
      if (try_persist<W>(w, out_rows, groups, x, ldx, n, y, ldy, stream)) return;
      if (n == 1)
        launch_stream<W, 1>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      else if (n == 2)
        launch_stream<W, 2>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      else if (n <= 4)
        launch_stream<W, 4>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      else
        launch_stream<W, 8>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      return;
    }
    const int nbt = n <= 1 ? 1 : (n <= 4 ? 4 : 8);
    if (nbt == 1 && rows_per_warp(out_rows, groups) == 4) {
      const dim3 grid(ceil_u(out_rows, kGemvWarps * 4), 1, static_cast<unsigned>(groups));
      launch(gemv_kernel<D, 1, 4>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
      return;
    }
    const dim3 grid(ceil_u(out_rows, kGemvWarps), ceil_u(n, nbt), static_cast<unsigned>(groups));
    if (nbt == 1)
      launch(gemv_kernel<D, 1, 1>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
    else if (nbt == 4)
      launch(gemv_kernel<D, 4, 1>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
    else
      launch(gemv_kernel<D, 8, 1>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
  } else {
    const dim3 grid(ceil_u(out_rows, kTileN), ceil_u(n, kTileM), static_cast<unsigned>(groups));
    launch(tile_kernel<D>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
  }
}

// The scalar decoders only ever run with NB = 8 on the GEMV path (a fallback: fewer instantiations).
template <class D>
void launch_dense_scalar(const WView& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx,
                         int64_t n, float* y, int64_t ldy, cudaStream_t stream) {
  if (use_gemv(out_rows, groups, n)) {
    const dim3 grid(ceil_u(out_rows, kGemvWarps), ceil_u(n, 8), static_cast<unsigned>(groups));
    launch(gemv_kernel<D, 8, 1>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
  } else {
    const dim3 grid(ceil_u(out_rows, kTileN), ceil_u(n, kTileM), static_cast<unsigned>(groups));
    launch(tile_kernel<D>, grid, kThreads, 0, stream, w, out_rows, x, ldx, n, y, ldy);
  }
}

Status dense(const char* fn, const DeviceWeight& dw, int64_t groups, const float* x, int64_t n, float* y,
             cudaStream_t stream, bool row_invariant) {
  DS41_RETURN_IF_ERROR(check_weight(dw, fn));
  if (n < 0) return invalid_argument(std::string(fn) + ": n " + std::to_string(n) + " is negative");
  if (groups <= 0 || groups > 65535 || dw.out_dim % groups != 0)
    return invalid_argument(std::string(fn) + ": groups " + std::to_string(groups) +
                            " does not divide w.out_dim " + std::to_string(dw.out_dim));
  if (n > int64_t{65535} * kTileM)
    return invalid_argument(std::string(fn) + ": n " + std::to_string(n) + " too large");
  if (n == 0) return ok_status();
  if (!x || !y) return invalid_argument(std::string(fn) + ": x or y is null");
  const WView w{dw.data, dw.scale, dw.in_dim};
  const int64_t out_rows = dw.out_dim / groups, ldx = groups * dw.in_dim, ldy = dw.out_dim;
  // The tensor-core GEMV (tc_gemv_kernels.h, row-count invariant) when it takes the shape: FP8 / FP4
  // decode-sized calls, and FP8 / FP4 / BF16 calls of any n that ask for row invariance (decode steps
  // and DSpark verifications: the head, the MoE gate and the compressor are BF16, and the kernels
  // below pick their arithmetic by row count). BF16 calls without it (the DSpark draft, prefill)
  // keep the CUDA-core kernels.
  const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && dw.format != WeightFormat::kBF16);
  if (tc_rows && tcg::try_dense(dw, out_rows, groups, x, ldx, n, y, ldy, stream)) return last_launch_status(fn);
  const bool vec = vector_ok(dw.format, dw.in_dim, dw.data);
  const bool wide = vec && rows_16b_host(dw.format, dw.in_dim, dw.data);
  switch (dw.format) {
    case WeightFormat::kF32:
      vec ? launch_dense<dev::DecF32, dev::WideF32>(w, wide, out_rows, groups, x, ldx, n, y, ldy, stream)
          : launch_dense_scalar<dev::ScalarF32>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      break;
    case WeightFormat::kBF16:
      vec ? launch_dense<dev::DecBF16, dev::WideBF16>(w, wide, out_rows, groups, x, ldx, n, y, ldy, stream)
          : launch_dense_scalar<dev::ScalarBF16>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      break;
    case WeightFormat::kFp8Tiles:
      vec ? launch_dense<dev::DecFp8, dev::WideFp8>(w, wide, out_rows, groups, x, ldx, n, y, ldy, stream)
          : launch_dense_scalar<dev::ScalarFp8>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      break;
    case WeightFormat::kFp4Rows:
      vec ? launch_dense<dev::DecFp4, dev::WideFp4>(w, wide, out_rows, groups, x, ldx, n, y, ldy, stream)
          : launch_dense_scalar<dev::ScalarFp4>(w, out_rows, groups, x, ldx, n, y, ldy, stream);
      break;
    default: break;
  }
  return last_launch_status(fn);
}

void launch_expert(const DeviceWeight* weights, int64_t n_experts, int64_t out_dim, int64_t in_dim,
                   const int64_t* offsets, const float* x, int64_t m_max, float* y, cudaStream_t stream,
                   WeightFormat format, bool routing_early, SharedUnits* shared = nullptr) {
  // Decode over FP8 / FP4 experts of a known format: the tensor-core GEMV (tc_gemv_kernels.h).
  if (tcg::try_experts(format, weights, n_experts, out_dim, in_dim, offsets, x, m_max, y, stream, nullptr, nullptr,
                       nullptr, nullptr, routing_early, shared))
    return;
  if (m_max >= 16 * n_experts) {  // many rows per expert: tiles
    const unsigned gx = ceil_u(out_dim, kTileN);
    const int64_t upper = (m_max + kTileM - 1) / kTileM + n_experts;
    const dim3 grid(gx, static_cast<unsigned>(std::min<int64_t>(upper, 65535)));
    launch(expert_tile_kernel, grid, kThreads, 0, stream, weights, n_experts, out_dim, in_dim, offsets, x, y);
    return;
  }
  const bool one = m_max <= n_experts;  // about one row per used expert (decode)
  const size_t psmem = std::max<size_t>(static_cast<size_t>(in_dim) * sizeof(float), sizeof(float) * kGemvChunk<1>);
  // The persistent kernel up to 16 rows (batch <= 2 of top-6): measured on the H200, batch 8 (48
  // units, 6 blocks per unit) ran 386 us for w1 where the one-block-per-16-rows launch ran 300 us.
  if (one && m_max <= 16 && psmem <= static_cast<size_t>(kPersistMaxSmem)) {
    constexpr int R = 1, U = 4;  // R = 2 spills at 128 registers (four formats in one kernel)
    const int64_t gy = std::min<int64_t>(m_max, 65535), nrg = (out_dim + R - 1) / R;
    const int64_t x_floats = static_cast<int64_t>(psmem / sizeof(float));
    const size_t rsmem = psmem + size_t{16} * kGemvWarps * kRingChunksPerWarp<R, U, kRingStages>;
    if (persist_ring() && rsmem <= static_cast<size_t>(kPersistMaxSmem)) {
      allow_persist_smem<persist_expert_kernel<1, R, U, kRingStages>>();
      const dim3 grid(static_cast<unsigned>(persist_slots(nrg, gy, rsmem)), static_cast<unsigned>(gy));
      launch(persist_expert_kernel<1, R, U, kRingStages>, grid, kThreads, rsmem, stream, weights, n_experts, out_dim, in_dim, offsets, x, y, x_floats);
      return;
    }
    const dim3 grid(static_cast<unsigned>(persist_slots(nrg, gy, psmem)), static_cast<unsigned>(gy));
    // A known format sets the chunks per row, and with them the U that idles the fewest lanes.
    const int64_t kv = format == WeightFormat::kFp4Rows    ? 32
                       : format == WeightFormat::kFp8Tiles ? 16
                       : format == WeightFormat::kBF16     ? 8
                                                           : 0;
    const int u = kv > 0 ? persist_u(in_dim / kv) : U;
    if (u == 5) {
      allow_persist_smem<persist_expert_kernel<1, R, 5, 0>>();
      launch(persist_expert_kernel<1, R, 5, 0>, grid, kThreads, psmem, stream, weights, n_experts, out_dim, in_dim,
             offsets, x, y, x_floats);
    } else if (u == 3) {
      allow_persist_smem<persist_expert_kernel<1, R, 3, 0>>();
      launch(persist_expert_kernel<1, R, 3, 0>, grid, kThreads, psmem, stream, weights, n_experts, out_dim, in_dim,
             offsets, x, y, x_floats);
    } else {
      allow_persist_smem<persist_expert_kernel<1, R, U, 0>>();
      launch(persist_expert_kernel<1, R, U, 0>, grid, kThreads, psmem, stream, weights, n_experts, out_dim, in_dim,
             offsets, x, y, x_floats);
    }
    return;
  }
  const int64_t upper = one ? m_max : (m_max + 7) / 8 + n_experts;
  const unsigned gx = ceil_u(out_dim, kGemvWarps * (one ? kExpertR<1> : kExpertR<8>));
  const int64_t want = std::max<int64_t>(1, (4096 + gx - 1) / gx);  // ~30 blocks per SM in all
  const dim3 grid(gx, static_cast<unsigned>(std::min<int64_t>({upper, want, 65535})));
  if (one)
    launch(expert_stream_kernel<1>, grid, kThreads, 0, stream, weights, n_experts, out_dim, in_dim, offsets, x, y);
  else
    launch(expert_stream_kernel<8>, grid, kThreads, 0, stream, weights, n_experts, out_dim, in_dim, offsets, x, y);
}

}  // namespace

void set_persist_slot_cap_for_tests(int cap) {
  g_persist_slot_cap = cap > 0 ? cap : 0;
  tcg::set_slot_cap_for_tests(cap);
}
void set_persist_ring_for_tests(int mode) { g_persist_ring = mode < 0 ? -1 : (mode != 0 ? 1 : 0); }
void set_persist_u_for_tests(int u) { g_persist_u = (u >= 3 && u <= 5) ? u : 0; }
void set_tc_gemv_for_tests(int mode) { tcg::set_enabled_for_tests(mode); }
void set_tc_gemv_rows_per_block_for_tests(int nb) { tcg::set_rows_per_block_for_tests(nb); }
void set_tc_gemv_ring_for_tests(int mode) { tcg::set_ring_for_tests(mode); }
void set_tc_gemv_fp8_wide_for_tests(int mode) { tcg::set_fp8_wide_for_tests(mode); }
void set_tc_gemv_early_for_tests(int before_wait) { tcg::set_early_for_tests(before_wait); }
void set_tc_gemv_expert_stage_first_for_tests(int mode) { tcg::set_expert_stage_first_for_tests(mode); }
void set_tc_gemv_expert_early_for_tests(int mode) { tcg::set_expert_early_for_tests(mode); }
void set_tc_gemv_dense_swiglu_for_tests(int mode) { tcg::set_dense_swiglu_for_tests(mode); }
static_assert(kTensorCoreGemvRows == tcg::kDecodeRows, "linear_kernels.h states the tensor-core GEMV's rows");
void set_moe_shared_fold_for_tests(int mode) { tcg::set_moe_shared_fold_for_tests(mode); }
bool moe_shared_fold() { return tcg::moe_shared_fold_enabled(); }

Status run_linear(const DeviceWeight& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                  bool row_invariant) {
  return dense("linear", w, 1, x, n, y, stream, row_invariant);
}

Status try_linear_normed(const DeviceWeight& w, const float* x, int64_t n, float* y, const float* norm_weight,
                         float eps, cudaStream_t stream, bool row_invariant, bool* took, HcMapFold* map) {
  *took = false;
  if (map != nullptr) map->folded = false;
  if (!check_weight(w, "linear_normed").ok() || !norm_weight) return ok_status();
  if (n > 0 && n <= int64_t{65535} * kTileM && x && y) {
    const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && w.format != WeightFormat::kBF16);
    const tcg::RowNorm norm{norm_weight, eps, rms_norm_sum_threads(n, w.in_dim)};
    if (tc_rows &&
        tcg::try_dense(w, w.out_dim, 1, x, w.in_dim, n, y, w.out_dim, stream, nullptr, nullptr, &norm, nullptr,
                       nullptr, map)) {
      *took = true;
      return last_launch_status("linear_normed");
    }
  }
  return ok_status();
}

Status run_linear_normed(const DeviceWeight& w, float* x, int64_t n, float* y, const float* norm_weight, float eps,
                         cudaStream_t stream, bool row_invariant, HcMapFold* map) {
  const char* fn = "linear_normed";
  if (map != nullptr) map->folded = false;
  DS41_RETURN_IF_ERROR(check_weight(w, fn));
  if (!norm_weight) return invalid_argument(std::string(fn) + ": norm_weight is null");
  bool took = false;
  DS41_RETURN_IF_ERROR(try_linear_normed(w, x, n, y, norm_weight, eps, stream, row_invariant, &took, map));
  if (took) return ok_status();
  DS41_RETURN_IF_ERROR(run_rms_norm(x, n, w.in_dim, norm_weight, eps, x, stream));
  return run_linear(w, x, n, y, stream, row_invariant);
}

Status run_linear_pair(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, float* y2,
                       cudaStream_t stream, bool row_invariant) {
  const char* fn = "linear_pair";
  DS41_RETURN_IF_ERROR(check_weight(w, fn));
  DS41_RETURN_IF_ERROR(check_weight(w2, fn));
  if (n > 0 && n <= int64_t{65535} * kTileM && x && y && y2 && w.format == w2.format) {
    const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && w.format != WeightFormat::kBF16);
    if (tc_rows && tcg::try_dense(w, w.out_dim, 1, x, w.in_dim, n, y, w.out_dim, stream, &w2, y2))
      return last_launch_status(fn);
  }
  DS41_RETURN_IF_ERROR(run_linear(w, x, n, y, stream, row_invariant));
  return run_linear(w2, x, n, y2, stream, row_invariant);
}

namespace {
// try_linear_dual and try_linear_dual_normed: one launch of both weights where the tensor-core GEMV takes it (a
// norm in the shared staging when norm_weight is set).
Status linear_dual(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, float* y2,
                   const float* norm_weight, float eps, cudaStream_t stream, bool row_invariant, bool* took,
                   const char* fn) {
  *took = false;
  if (!check_weight(w, fn).ok() || !check_weight(w2, fn).ok()) return ok_status();
  if (n > 0 && n <= int64_t{65535} * kTileM && x && y && y2 && w.format == w2.format && w.in_dim == w2.in_dim) {
    // run_linear's tensor-core condition (dense()) for both weights: each alone would take try_dense.
    const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && w.format != WeightFormat::kBF16);
    const tcg::RowNorm norm{norm_weight, eps, rms_norm_sum_threads(n, w.in_dim)};
    if (tc_rows && tcg::try_dense_dual(w, w2, x, n, y, w.out_dim, y2, w2.out_dim, stream,
                                       norm_weight != nullptr ? &norm : nullptr)) {
      *took = true;
      return last_launch_status(fn);
    }
  }
  return ok_status();
}
}  // namespace

Status try_linear_dual(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, float* y2,
                       cudaStream_t stream, bool row_invariant, bool* took) {
  return linear_dual(w, w2, x, n, y, y2, nullptr, 0.0f, stream, row_invariant, took, "linear_dual");
}

Status try_linear_dual_normed(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y,
                              float* y2, const float* norm_weight, float eps, cudaStream_t stream, bool row_invariant,
                              bool* took) {
  *took = false;
  if (!norm_weight) return ok_status();
  return linear_dual(w, w2, x, n, y, y2, norm_weight, eps, stream, row_invariant, took, "linear_dual_normed");
}

Status run_linear_expand(const DeviceWeight& w, const float* x, int64_t n, float* y, const HcExpandEpilogue& ex,
                         cudaStream_t stream, bool row_invariant) {
  const char* fn = "linear_expand";
  DS41_RETURN_IF_ERROR(check_weight(w, fn));
  if (!ex.streams || !ex.post || !ex.comb) return invalid_argument(std::string(fn) + ": streams, post or comb is null");
  if (ex.c < 1 || ex.c > 8) return invalid_argument(std::string(fn) + ": c " + std::to_string(ex.c) + " outside [1, 8]");
  // run_linear's tensor-core condition (dense()): a call it sends to the tensor-core GEMV is one launch here.
  if (n > 0 && n <= int64_t{65535} * kTileM && x) {
    const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && w.format != WeightFormat::kBF16);
    if (tc_rows && tcg::try_dense(w, w.out_dim, 1, x, w.in_dim, n, nullptr, w.out_dim, stream, nullptr, nullptr, nullptr,
                                  nullptr, &ex))
      return last_launch_status(fn);
  }
  if (!y) return invalid_argument(std::string(fn) + ": y is null");
  DS41_RETURN_IF_ERROR(run_linear(w, x, n, y, stream, row_invariant));
  return run_hc_expand(ex.streams, y, ex.post, ex.comb, n, ex.c, w.out_dim, stream);
}

Status run_linear_pair_swiglu(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* g,
                              float* u, const SwigluEpilogue& sw, cudaStream_t stream, bool row_invariant) {
  const char* fn = "linear_pair_swiglu";
  DS41_RETURN_IF_ERROR(check_weight(w, fn));
  DS41_RETURN_IF_ERROR(check_weight(w2, fn));
  if (sw.act == nullptr) return invalid_argument(std::string(fn) + ": act is null");
  if (w2.out_dim != w.out_dim) return invalid_argument(std::string(fn) + ": the two weights' output widths differ");
  // The conditions of run_linear_pair's single launch: a pair it runs as one launch runs fused here.
  if (n > 0 && n <= int64_t{65535} * kTileM && x && w.format == w2.format) {
    const bool tc_rows = row_invariant || (n <= tcg::kDecodeRows && w.format != WeightFormat::kBF16);
    if (tc_rows && tcg::try_dense(w, w.out_dim, 1, x, w.in_dim, n, nullptr, w.out_dim, stream, &w2, nullptr, nullptr,
                                  &sw))
      return last_launch_status(fn);
  }
  if (!g || !u) return invalid_argument(std::string(fn) + ": g or u is null");
  DS41_RETURN_IF_ERROR(run_linear_pair(w, w2, x, n, g, u, stream, row_invariant));
  return run_swiglu(g, u, n, w.out_dim, sw.limit, sw.row_scale, sw.act, stream);
}

Status run_grouped_linear(const DeviceWeight& w, int64_t groups, const float* x, int64_t n, float* y,
                          cudaStream_t stream, bool row_invariant) {
  return dense("grouped_linear", w, groups, x, n, y, stream, row_invariant);
}

Status run_expert_linear(const DeviceWeight* weights, int64_t n_experts, int64_t out_dim, int64_t in_dim,
                         const int64_t* offsets, const float* x, int64_t m_max, float* y,
                         cudaStream_t stream, WeightFormat format, bool routing_early, SharedUnits* shared) {
  const char* fn = "expert_linear";
  if (shared != nullptr) shared->folded = false;
  if (n_experts <= 0 || n_experts > kMaxExperts)
    return invalid_argument(std::string(fn) + ": n_experts " + std::to_string(n_experts) + " outside [1, " +
                            std::to_string(kMaxExperts) + "]");
  if (out_dim <= 0 || in_dim <= 0)
    return invalid_argument(std::string(fn) + ": out_dim/in_dim " + std::to_string(out_dim) + "/" +
                            std::to_string(in_dim) + " must be positive");
  if (in_dim % 4 != 0)
    return invalid_argument(std::string(fn) + ": in_dim " + std::to_string(in_dim) +
                            " is not a multiple of 4 (the vector decoders)");
  if (m_max < 0 || m_max > (int64_t{1} << 30))
    return invalid_argument(std::string(fn) + ": m_max " + std::to_string(m_max) + " out of range");
  if (!weights || !offsets) return invalid_argument(std::string(fn) + ": weights or offsets is null");
  if (m_max == 0) return ok_status();
  if (!x || !y) return invalid_argument(std::string(fn) + ": x or y is null");
  launch_expert(weights, n_experts, out_dim, in_dim, offsets, x, m_max, y, stream, format, routing_early, shared);
  return last_launch_status(fn);
}

// The expert pair's checks and launches (run_expert_linear_pair, run_expert_linear_pair_rows): x_rows
// (nullable) makes routed row r x[x_rows[r]], staged through the index by the tensor-core GEMV, or
// gathered into `gathered` first where that kernel does not take the call.
static Status expert_pair(const char* fn, const DeviceWeight* weights, const DeviceWeight* weights2,
                          int64_t n_experts, int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                          const int64_t* x_rows, float* gathered, int64_t m_max, float* y, float* y2,
                          cudaStream_t stream, WeightFormat format) {
  if (!weights2 || !y2) return invalid_argument(std::string(fn) + ": weights2 or y2 is null");
  // The single call's checks (its errors name the problem) on a call that launches nothing.
  DS41_RETURN_IF_ERROR(run_expert_linear(weights, n_experts, out_dim, in_dim, offsets, x, 0, y, stream, format));
  if (m_max < 0 || m_max > (int64_t{1} << 30))
    return invalid_argument(std::string(fn) + ": m_max " + std::to_string(m_max) + " out of range");
  if (m_max == 0) return ok_status();
  if (!x || !y) return invalid_argument(std::string(fn) + ": x or y is null");
  if (tcg::try_experts(format, weights, n_experts, out_dim, in_dim, offsets, x, m_max, y, stream, weights2, y2,
                       x_rows))
    return last_launch_status(fn);
  if (x_rows) {
    DS41_RETURN_IF_ERROR(run_gather_rows(x, x_rows, m_max, in_dim, gathered, stream));
    x = gathered;
  }
  DS41_RETURN_IF_ERROR(run_expert_linear(weights, n_experts, out_dim, in_dim, offsets, x, m_max, y, stream, format));
  return run_expert_linear(weights2, n_experts, out_dim, in_dim, offsets, x, m_max, y2, stream, format);
}

Status run_expert_linear_pair(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                              int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                              int64_t m_max, float* y, float* y2, cudaStream_t stream, WeightFormat format) {
  return expert_pair("expert_linear_pair", weights, weights2, n_experts, out_dim, in_dim, offsets, x, nullptr, nullptr,
                     m_max, y, y2, stream, format);
}

Status run_expert_linear_pair_swiglu(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                                     int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                                     const int64_t* x_rows, float* gathered, int64_t m_max, float* g, float* u,
                                     const SwigluEpilogue& sw, cudaStream_t stream, WeightFormat format,
                                     SharedUnits* shared) {
  const char* fn = "expert_linear_pair_swiglu";
  if (shared != nullptr) shared->folded = false;
  if (!weights2) return invalid_argument(std::string(fn) + ": weights2 is null");
  // The single call's checks (its errors name the problem) on a call that launches nothing.
  DS41_RETURN_IF_ERROR(run_expert_linear(weights, n_experts, out_dim, in_dim, offsets, x, 0, g, stream, format));
  if (m_max < 0 || m_max > (int64_t{1} << 30))
    return invalid_argument(std::string(fn) + ": m_max " + std::to_string(m_max) + " out of range");
  if (m_max == 0) return ok_status();
  if (!x || !sw.act) return invalid_argument(std::string(fn) + ": x or act is null");
  if (tcg::try_experts(format, weights, n_experts, out_dim, in_dim, offsets, x, m_max, nullptr, stream, weights2,
                       nullptr, x_rows, &sw, false, shared))
    return last_launch_status(fn);
  if (!g || !u) return invalid_argument(std::string(fn) + ": g or u is null");
  if (x_rows) {
    if (!gathered) return invalid_argument(std::string(fn) + ": gathered is null");
    DS41_RETURN_IF_ERROR(expert_pair(fn, weights, weights2, n_experts, out_dim, in_dim, offsets, x, x_rows, gathered,
                                     m_max, g, u, stream, format));
  } else {
    DS41_RETURN_IF_ERROR(expert_pair(fn, weights, weights2, n_experts, out_dim, in_dim, offsets, x, nullptr, nullptr,
                                     m_max, g, u, stream, format));
  }
  return run_swiglu(g, u, m_max, out_dim, sw.limit, sw.row_scale, sw.act, stream);
}

Status run_expert_linear_pair_rows(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                                   int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                                   const int64_t* x_rows, float* gathered, int64_t m_max, float* y, float* y2,
                                   cudaStream_t stream, WeightFormat format) {
  if (!x_rows || !gathered) return invalid_argument("expert_linear_pair_rows: x_rows or gathered is null");
  return expert_pair("expert_linear_pair_rows", weights, weights2, n_experts, out_dim, in_dim, offsets, x, x_rows,
                     gathered, m_max, y, y2, stream, format);
}

}  // namespace ds41::cuda
