// ds41 backends/cuda: the Engram table gather and the per-stream gate update (MODEL_SPEC 3.2.4).
// gather: the Engram-row dequantizer of weight_dequant.cu over the n * cols row ids (the output
//   [n, cols * dim] is the [n * cols, dim] gather), bit-exact with quant::engram_row_dequant.
// update: one block per (row, stream), ceil(h / 8) threads (<= 1024); the three sums (|S|^2, |k|^2,
//   S.omega.k) in float64 like the reference, the gate in float64, the stream update in float32; so the result
//   equals the reference's unless a float64 summation-order difference flips a float32 rounding
//   of g (docs/gpu_kernels.md).
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/engram_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/weight_dequant.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kPer = 8;            // elements of a stream row per thread held in registers
constexpr int kMaxThreads = 1024;

// One block per (row, stream). A thread loads its kPer elements of S, the key, omega and the value
// at once (i = t, t + T, ...: every load of the row in flight together; the loop-carried version
// made ~20 dependent rounds of memory latency per sum, ncu: 20 us per call at 4 blocks), sums in
// float64 in that order, the block sums the three totals in one pass, and the update reuses the
// registers. Rows longer than kPer * 1024 take chunks of kPer * T (the values are reloaded).
__global__ void __launch_bounds__(kMaxThreads)
    engram_update_kernel(float* streams, const float* __restrict__ z, const float* __restrict__ omega,
                         const uint8_t* __restrict__ dead, int64_t c, int64_t h, float eps,
                         float* __restrict__ gates) {
  dev::pdl_enter();
  __shared__ double scratch[3][32];
  const int64_t r = blockIdx.x, s = blockIdx.y;
  if (dead && dead[r]) {
    if (gates && threadIdx.x == 0) gates[r * c + s] = 0.0f;
    return;
  }
  float* S = streams + (r * c + s) * h;
  const float* key = z + r * (c + 1) * h + s * h;
  const float* val = z + r * (c + 1) * h + c * h;
  const float* om = omega + s * h;
  const int64_t T = blockDim.x, t = threadIdx.x;
  const bool cached = h <= kPer * T;
  float sv[kPer], kv[kPer], ov[kPer], vv[kPer];
  double ss = 0, kk = 0, d = 0;
  for (int64_t base = t; base < h; base += kPer * T) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = base + j * T;
      const bool in = i < h;
      sv[j] = in ? S[i] : 0.0f;
      kv[j] = in ? key[i] : 0.0f;
      ov[j] = in ? om[i] : 0.0f;
      vv[j] = in && cached ? val[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (base + j * T >= h) break;
      const double a = sv[j], b = kv[j];
      ss += a * a;
      kk += b * b;
      d += static_cast<double>(__fmul_rn(sv[j], ov[j])) * b;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  ss = dev::warp_sum(ss);
  kk = dev::warp_sum(kk);
  d = dev::warp_sum(d);
  if (lane == 0) scratch[0][warp] = ss, scratch[1][warp] = kk, scratch[2][warp] = d;
  __syncthreads();
  ss = dev::warp_sum(lane < nw ? scratch[0][lane] : 0.0);
  kk = dev::warp_sum(lane < nw ? scratch[1][lane] : 0.0);
  d = dev::warp_sum(lane < nw ? scratch[2][lane] : 0.0);
  const double hd = static_cast<double>(h), epsd = eps;
  const double rstd = 1.0 / sqrt(ss / hd + epsd) / sqrt(kk / hd + epsd);
  const double a = d * rstd * (1.0 / sqrt(hd));
  const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
  const double fa = fabs(a);
  const float g = static_cast<float>(1.0 / (1.0 + exp(-sg * sqrt(fa < 1e-6 ? 1e-6 : fa))));
  if (cached) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = t + j * T;
      if (i < h) S[i] = __fadd_rn(sv[j], __fmul_rn(g, vv[j]));
    }
  } else {
    for (int64_t i = t; i < h; i += T) S[i] = __fadd_rn(S[i], __fmul_rn(g, val[i]));
  }
  if (gates && threadIdx.x == 0) gates[r * c + s] = g;
}

Status bad(const char* fn, const std::string& what) {
  return invalid_argument(std::string(fn) + ": " + what);
}

}  // namespace

Status run_engram_gather(const uint8_t* table, const uint8_t* scale, int64_t table_rows, int64_t dim,
                         const int64_t* row_ids, int64_t n, int64_t cols, float* out, cudaStream_t stream) {
  if (n < 0 || cols <= 0) return bad("engram_gather", "n/cols out of range");
  if (n == 0) return ok_status();
  auto plan = plan_engram_rows_dequant(table_rows, dim, n * cols, DType::kF32);
  if (!plan.ok()) return bad("engram_gather", plan.status().message());
  return run_engram_rows_dequant(*plan, table, scale, row_ids, out, stream);
}

Status run_engram_update(float* streams, const float* z, const float* omega, const uint8_t* dead, int64_t n,
                         int64_t c, int64_t h, float eps, float* gates, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff) return bad("engram_update", "n " + std::to_string(n) + " out of range");
  if (c <= 0 || c > 65535 || h <= 0) return bad("engram_update", "c/h out of range");
  if (n == 0) return ok_status();
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(c));
  const int64_t want = (h + kPer - 1) / kPer;  // threads for one chunk, whole warps, 32..1024
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (want + 31) / 32 * 32)));
  launch(engram_update_kernel, grid, threads, 0, stream, streams, z, omega, dead, c, h, eps, gates);
  return last_launch_status("engram_update");
}

}  // namespace ds41::cuda
