// ds41 backends/cuda: bias add and exact GELU of the vision tower (vision_pointwise_kernels.h). The
// float64 GELU follows src/backends/cpu/cpu_vision_ops.cpp operation for operation (no contraction:
// the target builds with --fmad=false), so results differ from the CPU op only where CUDA's erf and
// libm's differ in the last float64 ulp and that changes the float32 rounding.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/vision_pointwise_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_bias_kernel(float* y, int64_t dim, int64_t total, const float* __restrict__ bias) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] = __fadd_rn(y[i], bias[i % dim]);
}

__global__ void gelu_erf_kernel(float* x, int64_t count) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const double v = x[i];
  x[i] = static_cast<float>(0.5 * v * (1.0 + erf(v / sqrt(2.0))));
}

}  // namespace

Status run_add_bias(float* y, int64_t n, int64_t dim, const float* bias, cudaStream_t stream) {
  if (n < 0 || dim <= 0)
    return invalid_argument("add_bias: n " + std::to_string(n) + " / dim " + std::to_string(dim));
  if (!bias) return invalid_argument("add_bias: no bias");
  if (n == 0) return ok_status();
  const int64_t total = n * dim;
  launch(add_bias_kernel, grid_1d(total, kThreads), kThreads, 0, stream, y, dim, total, bias);
  return last_launch_status("add_bias");
}

Status run_gelu_erf(float* x, int64_t count, cudaStream_t stream) {
  if (count < 0) return invalid_argument("gelu_erf: count is negative");
  if (count == 0) return ok_status();
  launch(gelu_erf_kernel, grid_1d(count, kThreads), kThreads, 0, stream, x, count);
  return last_launch_status("gelu_erf");
}

}  // namespace ds41::cuda
