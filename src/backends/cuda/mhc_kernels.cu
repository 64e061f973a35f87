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
#include "backends/cuda/hc_expand_device.cuh"
#include "backends/cuda/mhc_device.cuh"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

using hc::hc_split;
using hc::HcSplit;
using hc::kHcRows;
using hc::kMaxC;
using hc::kTargetBlocks;
using hc::kThreads;

template <int kJ, bool kVec>
__global__ void __launch_bounds__(kThreads)
    hc_map_partial_kernel(HcMapDeviceArgs a, int64_t splits, int64_t steps, double* __restrict__ part) {
  dev::pdl_enter();
  hc::hc_map_partial_block<kJ, kVec>(a, splits, steps, part, blockIdx.x);
}

// One block per row (hc_map_finish_row).
template <int kC>
__global__ void __launch_bounds__(kThreads)
    hc_map_finish_kernel(HcMapDeviceArgs a, int64_t splits, const double* __restrict__ part) {
  dev::pdl_enter();
  __shared__ double tot[kMaxC * kMaxC + 2 * kMaxC + 1];
  __shared__ float m[(2 + kMaxC) * kMaxC];
  hc::hc_map_finish_row<kC>(a, splits, part, blockIdx.x, tot, m);
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
  dev::hc_expand_channel(streams + r * c * h, y[t], post + r * c, comb + r * c * c, c, h, i);
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
