// ds41 backends/cuda: the Engram table gather and the per-stream gate update (MODEL_SPEC 3.2.4).
// gather: the Engram-row dequantizer of weight_dequant.cu over the n * cols row ids (the output
//   [n, cols * dim] is the [n * cols, dim] gather), bit-exact with quant::engram_row_dequant.
// update: one 256-thread block per (row, stream); the three sums (|S|^2, |k|^2, S.omega.k) in
//   float64 like the reference, the gate in float64, the stream update in float32; so the result
//   equals the reference's unless a float64 summation-order difference flips a float32 rounding
//   of g (docs/gpu_kernels.md).
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/engram_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/weight_dequant.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    engram_update_kernel(float* streams, const float* __restrict__ z, const float* __restrict__ omega,
                         const uint8_t* __restrict__ dead, int64_t c, int64_t h, float eps,
                         float* __restrict__ gates) {
  dev::pdl_enter();
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x, s = blockIdx.y;
  if (dead && dead[r]) {
    if (gates && threadIdx.x == 0) gates[r * c + s] = 0.0f;
    return;
  }
  float* S = streams + (r * c + s) * h;
  const float* key = z + r * (c + 1) * h + s * h;
  const float* val = z + r * (c + 1) * h + c * h;
  const float* om = omega + s * h;
  double ss = 0, kk = 0, d = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const double sv = S[i], kv = key[i];
    ss += sv * sv;
    kk += kv * kv;
    d += static_cast<double>(__fmul_rn(S[i], om[i])) * kv;
  }
  ss = dev::block_sum(ss, scratch);
  kk = dev::block_sum(kk, scratch);
  d = dev::block_sum(d, scratch);
  const double hd = static_cast<double>(h), epsd = eps;
  const double rstd = 1.0 / sqrt(ss / hd + epsd) / sqrt(kk / hd + epsd);
  const double a = d * rstd * (1.0 / sqrt(hd));
  const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
  const double fa = fabs(a);
  const float g = static_cast<float>(1.0 / (1.0 + exp(-sg * sqrt(fa < 1e-6 ? 1e-6 : fa))));
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) S[i] = __fadd_rn(S[i], __fmul_rn(g, val[i]));
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
  launch(engram_update_kernel, grid, kThreads, 0, stream, streams, z, omega, dead, c, h, eps, gates);
  return last_launch_status("engram_update");
}

}  // namespace ds41::cuda
