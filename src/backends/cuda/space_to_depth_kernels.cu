// ds41 backends/cuda: the aligner's zero-padded k x k unshuffle (space_to_depth_kernels.h). One
// thread per output value; padding positions write 0.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/space_to_depth_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void space_to_depth_kernel(const float* __restrict__ x, int64_t gh, int64_t gw, int64_t c,
                                      int64_t k, int64_t ow, int64_t total, float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t dim = c * k * k, win = e / dim, rem = e % dim;
  const int64_t ch = rem / (k * k), dy = (rem / k) % k, dx = rem % k;
  const int64_t y = (win / ow) * k + dy, xx = (win % ow) * k + dx;
  out[e] = (y < gh && xx < gw) ? x[(y * gw + xx) * c + ch] : 0.0f;
}

}  // namespace

Status run_space_to_depth(const float* x, int64_t grid_h, int64_t grid_w, int64_t c, int64_t k, float* out,
                          cudaStream_t stream) {
  if (grid_h <= 0 || grid_w <= 0 || c <= 0 || k <= 0)
    return invalid_argument("space_to_depth: grid " + std::to_string(grid_h) + "x" + std::to_string(grid_w) +
                            ", c " + std::to_string(c) + ", k " + std::to_string(k) + " must be positive");
  const int64_t oh = (grid_h + k - 1) / k, ow = (grid_w + k - 1) / k, total = oh * ow * c * k * k;
  launch(space_to_depth_kernel, grid_1d(total, kThreads), kThreads, 0, stream, x, grid_h, grid_w, c, k, ow, total,
                                                                           out);
  return last_launch_status("space_to_depth");
}

}  // namespace ds41::cuda
