// ds41 backends/cuda: the mHC site map with Sinkhorn, collapse, expand and the stream init
// (MODEL_SPEC 3.1, 3.3), op for op as the CPU reference (src/backends/cpu/cpu_backend.cpp).
//
// hc_map: one 256-thread block per row. Pass 1: sum of squares of f = streams[r] (C*h floats) in
//   float64 (as the reference). Pass 2: every thread keeps M = (2 + C) * C float partial dot
//   products of f * inv against its columns of fn (coalesced: consecutive threads read consecutive
//   columns of each fn row, 4 at a time when C*h % 4 == 0), reduced across the block in float64. The small
//   tail (sigmoids, softmax, Sinkhorn) runs in thread 0 with exactly the reference's float32 / float64 steps,
//   so pre, post and comb differ from the reference only through m's summation order.
// collapse / expand / init: one thread per (row, channel), the reference's float32 order (exact).
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/row_reduce.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxC = 8;

__device__ __forceinline__ float sigmoid_ref(float x) {
  return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x))));
}

// Thread 0: pre / post / comb from m (MODEL_SPEC 3.3), the reference's operations in its order.
// comb: shared scratch of C*C floats, copied to a.comb at the end.
__device__ void hc_tail(const HcMapDeviceArgs& a, const float* m, float* L, float* comb, int64_t r) {
  const int64_t C = a.c;
  float* pre = a.pre + r * C;
  float* post = a.post + r * C;
  for (int64_t c = 0; c < C; ++c) {
    pre[c] = sigmoid_ref(m[c] * a.scale[0] + a.base[c]) + a.hc_eps;
    post[c] = 2.0f * sigmoid_ref(m[C + c] * a.scale[1] + a.base[C + c]);
  }
  for (int64_t j = 0; j < C * C; ++j) L[j] = m[2 * C + j] * a.scale[2] + a.base[2 * C + j];
  for (int64_t j = 0; j < C; ++j) {  // row-wise softmax (over k) + eps
    float mx = L[j * C];
    for (int64_t k = 1; k < C; ++k) mx = mx < L[j * C + k] ? L[j * C + k] : mx;
    double s = 0;
    for (int64_t k = 0; k < C; ++k) s += exp(static_cast<double>(L[j * C + k] - mx));
    for (int64_t k = 0; k < C; ++k)
      comb[j * C + k] = static_cast<float>(exp(static_cast<double>(L[j * C + k] - mx)) / s) + a.hc_eps;
  }
  auto col_norm = [&] {
    for (int64_t k = 0; k < C; ++k) {
      float s = 0;
      for (int64_t j = 0; j < C; ++j) s += comb[j * C + k];
      for (int64_t j = 0; j < C; ++j) comb[j * C + k] /= (s + a.hc_eps);
    }
  };
  auto row_norm = [&] {
    for (int64_t j = 0; j < C; ++j) {
      float s = 0;
      for (int64_t k = 0; k < C; ++k) s += comb[j * C + k];
      for (int64_t k = 0; k < C; ++k) comb[j * C + k] /= (s + a.hc_eps);
    }
  };
  col_norm();
  for (int64_t it = 0; it + 1 < a.sinkhorn_iters; ++it) {
    row_norm();
    col_norm();
  }
  for (int64_t j = 0; j < C * C; ++j) a.comb[r * C * C + j] = comb[j];
}

template <int kMaxM>
__global__ void __launch_bounds__(kThreads) hc_map_kernel(HcMapDeviceArgs a) {
  __shared__ double scratch[32];
  __shared__ float part[kThreads / 32][kMaxM];
  __shared__ float m[kMaxM];
  __shared__ float L[kMaxC * kMaxC];
  __shared__ float cb[kMaxC * kMaxC];
  const int64_t r = blockIdx.x, C = a.c, F = a.c * a.h, M = (2 + C) * C;
  const float* f = a.streams + r * F;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < F; i += blockDim.x) {
    const double v = f[i];
    ss += v * v;
  }
  ss = dev::block_sum(ss, scratch);
  const float inv = static_cast<float>(
      1.0 / sqrt(static_cast<double>(static_cast<float>(ss / static_cast<double>(F)) + a.norm_eps)));
  float acc[kMaxM];
#pragma unroll
  for (int j = 0; j < kMaxM; ++j) acc[j] = 0.0f;
  const bool vec =
      (F % 4 == 0) && ((reinterpret_cast<uintptr_t>(a.fn) | reinterpret_cast<uintptr_t>(f)) % 16 == 0);
  if (vec) {  // 16-byte loads: four columns per thread per step (more bytes in flight per SM)
    const float4* f4 = reinterpret_cast<const float4*>(f);
    const float4* fn4 = reinterpret_cast<const float4*>(a.fn);
    const int64_t F4 = F / 4;
    for (int64_t i = threadIdx.x; i < F4; i += blockDim.x) {
      const float4 v = f4[i];
      const float fl[4] = {v.x * inv, v.y * inv, v.z * inv, v.w * inv};  // flat[], the reference's rounding
#pragma unroll
      for (int j = 0; j < kMaxM; ++j)
        if (j < M) {
          const float4 w = __ldg(fn4 + j * F4 + i);
          acc[j] = __fmaf_rn(fl[0], w.x, acc[j]);
          acc[j] = __fmaf_rn(fl[1], w.y, acc[j]);
          acc[j] = __fmaf_rn(fl[2], w.z, acc[j]);
          acc[j] = __fmaf_rn(fl[3], w.w, acc[j]);
        }
    }
  } else {
    for (int64_t i = threadIdx.x; i < F; i += blockDim.x) {
      const float fl = f[i] * inv;  // flat[i], the reference's rounding
#pragma unroll
      for (int j = 0; j < kMaxM; ++j)
        if (j < M) acc[j] = __fmaf_rn(fl, __ldg(a.fn + j * F + i), acc[j]);
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kMaxM; ++j) {
    if (j >= M) break;
    const float s = dev::warp_sum(acc[j]);
    if (lane == 0) part[warp][j] = s;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    double s = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) s += part[w][threadIdx.x];
    m[threadIdx.x] = static_cast<float>(s);
  }
  __syncthreads();
  if (threadIdx.x == 0) hc_tail(a, m, L, cb, r);
}

__global__ void hc_collapse_kernel(const float* __restrict__ streams, const float* __restrict__ weights,
                                   int64_t c, int64_t h, int64_t total, float* __restrict__ out) {
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

Status run_hc_map(const HcMapDeviceArgs& a, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_map", a.n, a.c, a.h));
  if (a.n > 0x7fffffff) return bad("hc_map", "n too large");
  if (a.sinkhorn_iters < 1)
    return bad("hc_map", "sinkhorn_iters " + std::to_string(a.sinkhorn_iters) + " < 1");
  if (a.n == 0) return ok_status();
  if (!a.streams || !a.fn || !a.scale || !a.base || !a.pre || !a.post || !a.comb)
    return bad("hc_map", "a null pointer among streams/fn/scale/base/pre/post/comb");
  if (a.c <= 4)
    hc_map_kernel<24><<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  else
    hc_map_kernel<80><<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  return last_launch_status("hc_map");
}

Status run_hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                       float* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_collapse", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * h;
  hc_collapse_kernel<<<grid_1d(total, kThreads), kThreads, 0, stream>>>(streams, weights, c, h, total, out);
  return last_launch_status("hc_collapse");
}

Status run_hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n,
                     int64_t c, int64_t h, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_expand", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * h;
  hc_expand_kernel<<<grid_1d(total, kThreads), kThreads, 0, stream>>>(streams, y, post, comb, c, h, total);
  return last_launch_status("hc_expand");
}

Status run_hc_init(const float* e, int64_t n, int64_t c, int64_t h, float* streams, float* pi,
                   cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_nch("hc_init", n, c, h));
  if (n == 0) return ok_status();
  const int64_t total = n * c * h;
  hc_init_kernel<<<grid_1d(total, kThreads), kThreads, 0, stream>>>(e, c, h, total, streams, pi);
  return last_launch_status("hc_init");
}

}  // namespace ds41::cuda
