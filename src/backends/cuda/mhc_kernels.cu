// ds41 backends/cuda: the mHC site map with Sinkhorn, collapse, expand and the stream init
// (MODEL_SPEC 3.1, 3.3), op for op as the CPU reference (src/backends/cpu/cpu_backend.cpp).
//
// hc_map: split-K in two launches (at n = 1 one block per row would stream the whole 2 MB fn
//   matrix, (2 + C) C rows x C h columns, from one SM). hc_map_partial_kernel: blocks over
//   (8 rows, a range of 128-column tiles), enough of them to fill the GPU; each writes the M = (2 + C) C
//   partial dots f . fn_j (fp32 products and lane sums, fixed shuffle tree) and the fp64 partial sum of
//   squares of its columns to the workspace. hc_map_finish_kernel: one block per row sums the
//   partials over the splits in fp64 (fixed order: deterministic run to run), inv = 1 / sqrt(ss / F +
//   eps) with the reference's roundings, m_j = inv * dot_j (the reference rounds flat = f * inv per
//   element first: a ~1 ulp difference per product, far below the summation-order one), and the
//   small tail with exactly the reference's float32 / float64 steps (sigmoids: one thread each of
//   warp 1; softmax and Sinkhorn: thread 0, unrolled for C = 4), so pre, post and comb differ from
//   the reference only through m's rounding.
// collapse / expand / init: one thread per (row, channel), the reference's float32 order (exact).
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsHc = kThreads / 32;
constexpr int64_t kMaxC = 8;
constexpr int kHcRows = 8;                 // rows per hc_map block (fn values reused across them)
constexpr int64_t kTileCols = 128;         // columns per tile: 32 lanes x 4
constexpr int64_t kTargetBlocks = 264;     // ~2 blocks per SM on a 132-SM H200
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
__device__ void hc_pre_post(const HcMapDeviceArgs& a, const float* m, int64_t r, int t) {
  const int C = kC > 0 ? kC : static_cast<int>(a.c);
  if (t < C)
    a.pre[r * C + t] = sigmoid_ref(m[t] * a.scale[0] + a.base[t]) + a.hc_eps;
  else if (t < 2 * C)
    a.post[r * C + t - C] = 2.0f * sigmoid_ref(m[t] * a.scale[1] + a.base[t]);
}

template <int kC>
__device__ void hc_comb(const HcMapDeviceArgs& a, const float* m, int64_t r) {
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
__device__ void hc_comb4_lanes(const HcMapDeviceArgs& a, const float* m, int64_t r, int lane) {
  constexpr unsigned kMask = 0xffffu;
  const int j = lane >> 2, k = lane & 3;
  const float L = m[8 + lane] * a.scale[2] + a.base[8 + lane];
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
  a.comb[r * 16 + lane] = c;
}

// Split-K pass. Block b = g * splits + s serves rows [g * kRows, g * kRows + kRows) and the column
// tiles [s * steps, (s + 1) * steps) of kTileCols columns each (lane l: columns 4 l .. 4 l + 3 of a
// tile, one float4 when kVec). Warp w owns the fn rows j = w + kWarps * jj; the fn values of a tile
// are loaded once and used for all the block's rows. Each thread sums its fp32 products (f * fn, the
// normalisation is applied to the total), the warp sums them in a fixed shuffle tree; warp 0 also
// sums f^2 in fp64. Output: part[(r * splits + s) * (M + 1) + j] (fp64), j = M the sum of squares.
template <int kJ, bool kVec>
__global__ void __launch_bounds__(kThreads)
    hc_map_partial_kernel(HcMapDeviceArgs a, int64_t splits, int64_t steps, double* __restrict__ part) {
  dev::pdl_enter();
  const int64_t C = a.c, F = a.c * a.h, M = (2 + C) * C;
  const int64_t g = blockIdx.x / splits, s = blockIdx.x % splits;
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
  for (int64_t t = s * steps; t < t_end; ++t) {
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
#pragma unroll
    for (int rr = 0; rr < kHcRows; ++rr) {
      if (rr >= nr) break;  // uniform over the block
      const float* f = a.streams + (r0 + rr) * F;
      float x[4];
      if (kVec) {
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (c0 < F) v = *reinterpret_cast<const float4*>(f + c0);
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) x[q] = c0 + q < F ? f[c0 + q] : 0.0f;
      }
#pragma unroll
      for (int jj = 0; jj < kJ; ++jj)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[rr][jj] = __fmaf_rn(x[q], w[jj][q], acc[rr][jj]);
      if (warp == 0)
#pragma unroll
        for (int q = 0; q < 4; ++q) ss[rr] += static_cast<double>(x[q]) * static_cast<double>(x[q]);
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
template <int kC>
__global__ void __launch_bounds__(kThreads)
    hc_map_finish_kernel(HcMapDeviceArgs a, int64_t splits, const double* __restrict__ part) {
  dev::pdl_enter();
  __shared__ double tot[kMaxC * kMaxC + 2 * kMaxC + 1];
  __shared__ float m[(2 + kMaxC) * kMaxC];
  const int64_t r = blockIdx.x, C = a.c, F = a.c * a.h, M = (2 + C) * C;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const double* p = part + r * splits * (M + 1);
  for (int64_t j = warp; j <= M; j += kWarpsHc) {
    double s = 0.0;
    for (int64_t q = lane; q < splits; q += 32) s += p[q * (M + 1) + j];
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
    if (warp == 0 && lane < 16)
      hc_comb4_lanes(a, m, r, lane);
    else if (warp == 1)  // another warp: runs beside the Sinkhorn lanes
      hc_pre_post<kC>(a, m, r, lane);
  } else if (threadIdx.x == 0) {
    hc_comb<kC>(a, m, r);
  } else if (warp == 1) {  // another warp: runs beside the Sinkhorn thread
    hc_pre_post<kC>(a, m, r, lane);
  }
}

// The split of the columns: enough blocks for ~2 per SM (kTargetBlocks) at small n, whole tiles
// per block, never more splits than tiles.
struct HcSplit {
  int64_t groups, splits, steps;
};
HcSplit hc_split(int64_t n, int64_t c, int64_t h) {
  const int64_t tiles = (c * h + kTileCols - 1) / kTileCols;
  const int64_t groups = (n + kHcRows - 1) / kHcRows;
  const int64_t wanted = (kTargetBlocks + groups - 1) / groups;
  const int64_t steps = (tiles + wanted - 1) / wanted;
  return {groups, (tiles + steps - 1) / steps, steps};
}

__global__ void hc_collapse_kernel(const float* __restrict__ streams, const float* __restrict__ weights,
                                   int64_t c, int64_t h, int64_t total, float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t r = t / h, i = t % h;
  float s = 0.0f;
  for (int64_t j = 0; j < c; ++j)
    s = __fadd_rn(s, __fmul_rn(weights[r * c + j], streams[(r * c + j) * h + i]));
  out[t] = s;
}

__global__ void hc_expand_kernel(float* streams, const float* __restrict__ y, const float* __restrict__ post,
                                 const float* __restrict__ comb, int64_t c, int64_t h, int64_t total) {
  dev::pdl_enter();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t r = t / h, i = t % h;
  float* S = streams + r * c * h;
  float old[kMaxC];
  for (int64_t j = 0; j < c; ++j) old[j] = S[j * h + i];
  const float* cb = comb + r * c * c;
  for (int64_t k = 0; k < c; ++k) {
    float s = __fmul_rn(post[r * c + k], y[t]);
    for (int64_t j = 0; j < c; ++j) s = __fadd_rn(s, __fmul_rn(cb[j * c + k], old[j]));
    S[k * h + i] = s;
  }
}

__global__ void hc_init_kernel(const float* __restrict__ e, int64_t c, int64_t h, int64_t total,
                               float* __restrict__ streams, float* __restrict__ pi) {
  dev::pdl_enter();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int64_t i = t % h, rc = t / h, r = rc / c, cc = rc % c;
  streams[t] = e[r * h + i];
  if (i == 0) pi[rc] = cc == 0 ? 1.0f : 0.0f;
}

Status bad(const char* fn, const std::string& what) {
  return invalid_argument(std::string(fn) + ": " + what);
}

Status check_nch(const char* fn, int64_t n, int64_t c, int64_t h) {
  if (n < 0) return bad(fn, "n " + std::to_string(n) + " is negative");
  if (c <= 0 || c > kMaxC)
    return bad(fn, "c " + std::to_string(c) + " outside [1, " + std::to_string(kMaxC) + "]");
  if (h <= 0) return bad(fn, "h " + std::to_string(h) + " must be positive");
  return ok_status();
}

}  // namespace

size_t hc_map_workspace_bytes(int64_t n, int64_t c, int64_t h) {
  if (n <= 0 || c <= 0 || c > kMaxC || h <= 0) return 0;
  // rows * splits <= kHcRows * groups * ceil(kTargetBlocks / groups) <= kHcRows * (kTargetBlocks + groups):
  // a bound that grows with n, so a workspace sized for the largest step serves every smaller one.
  const int64_t groups = (n + kHcRows - 1) / kHcRows;
  return static_cast<size_t>(kHcRows * (kTargetBlocks + groups) * ((2 + c) * c + 1)) * sizeof(double);
}

Status run_hc_map(const HcMapDeviceArgs& a, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_map", a.n, a.c, a.h));
  if (a.n > 0x7fffffff) return bad("hc_map", "n too large");
  if (a.sinkhorn_iters < 1)
    return bad("hc_map", "sinkhorn_iters " + std::to_string(a.sinkhorn_iters) + " < 1");
  if (a.n == 0) return ok_status();
  if (!a.streams || !a.fn || !a.scale || !a.base || !a.pre || !a.post || !a.comb)
    return bad("hc_map", "a null pointer among streams/fn/scale/base/pre/post/comb");
  const size_t need = hc_map_workspace_bytes(a.n, a.c, a.h);
  if (!a.workspace || a.workspace_bytes < need)
    return bad("hc_map", "workspace of " + std::to_string(a.workspace_bytes) + " bytes, " +
                             std::to_string(need) + " needed (hc_map_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(a.workspace) % alignof(double) != 0)
    return bad("hc_map", "workspace not 8-byte aligned");
  const HcSplit sp = hc_split(a.n, a.c, a.h);
  const unsigned blocks = static_cast<unsigned>(sp.groups * sp.splits);
  const bool vec = (a.c * a.h) % 4 == 0 &&
                   ((reinterpret_cast<uintptr_t>(a.fn) | reinterpret_cast<uintptr_t>(a.streams)) % 16 == 0);
  double* part = static_cast<double*>(a.workspace);
  if (a.c <= 4) {
    if (vec)
      launch(hc_map_partial_kernel<3, true>, blocks, kThreads, 0, stream, a, sp.splits, sp.steps, part);
    else
      launch(hc_map_partial_kernel<3, false>, blocks, kThreads, 0, stream, a, sp.splits, sp.steps, part);
  } else {
    if (vec)
      launch(hc_map_partial_kernel<10, true>, blocks, kThreads, 0, stream, a, sp.splits, sp.steps, part);
    else
      launch(hc_map_partial_kernel<10, false>, blocks, kThreads, 0, stream, a, sp.splits, sp.steps, part);
  }
  DS41_RETURN_IF_ERROR(last_launch_status("hc_map_partial"));
  if (a.c == 4)
    launch(hc_map_finish_kernel<4>, static_cast<unsigned>(a.n), kThreads, 0, stream, a, sp.splits, part);
  else
    launch(hc_map_finish_kernel<0>, static_cast<unsigned>(a.n), kThreads, 0, stream, a, sp.splits, part);
  return last_launch_status("hc_map_finish");
}

Status run_hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                       float* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_collapse", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * h;
  launch(hc_collapse_kernel, grid_1d(total, kThreads), kThreads, 0, stream, streams, weights, c, h, total, out);
  return last_launch_status("hc_collapse");
}

Status run_hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n,
                     int64_t c, int64_t h, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_expand", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * h;
  launch(hc_expand_kernel, grid_1d(total, kThreads), kThreads, 0, stream, streams, y, post, comb, c, h, total);
  return last_launch_status("hc_expand");
}

Status run_hc_init(const float* e, int64_t n, int64_t c, int64_t h, float* streams, float* pi,
                   cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_init", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * c * h;
  launch(hc_init_kernel, grid_1d(total, kThreads), kThreads, 0, stream, e, c, h, total, streams, pi);
  return last_launch_status("hc_init");
}

}  // namespace ds41::cuda
