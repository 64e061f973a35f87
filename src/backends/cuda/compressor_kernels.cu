// ds41 backends/cuda: ratio-r compressor pooling (MODEL_SPEC 3.4.4): for each group g and channel d,
// out[g, d] = sum_i softmax_i(b[g, i, d]) * a[g, i, d] over the group's r rows. One thread per
// (group, channel); the arithmetic repeats the CPU reference step for step (float max and
// difference, double exp and sums, the weight rounded to float), so results agree up to the last
// bit of CUDA's double exp versus the host libm (both within 1 ulp in double; after the float
// rounding they almost always coincide).
#include <string>

#include "backends/cuda/compressor_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void softmax_pool_kernel(const float* __restrict__ a, const float* __restrict__ b, int64_t r,
                                    int64_t dim, int64_t total, float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t g = e / dim, d = e % dim;
  const float* ag = a + g * r * dim + d;
  const float* bg = b + g * r * dim + d;
  float mx = bg[0];
  for (int64_t i = 1; i < r; ++i) {
    const float x = bg[i * dim];
    mx = mx < x ? x : mx;  // std::max(mx, x)
  }
  double den = 0.0;
  for (int64_t i = 0; i < r; ++i) den += exp(static_cast<double>(bg[i * dim] - mx));
  double z = 0.0;
  for (int64_t i = 0; i < r; ++i) {
    const float wgt = static_cast<float>(exp(static_cast<double>(bg[i * dim] - mx)) / den);
    z += static_cast<double>(ag[i * dim]) * static_cast<double>(wgt);
  }
  out[e] = static_cast<float>(z);
}

}  // namespace

Status run_softmax_pool(const float* a, const float* b, int64_t groups, int64_t r, int64_t dim, float* out,
                        cudaStream_t stream) {
  if (groups < 0 || r <= 0 || dim <= 0)
    return invalid_argument("softmax_pool: groups " + std::to_string(groups) + " / r " + std::to_string(r) +
                            " / dim " + std::to_string(dim) + " (want groups >= 0, r > 0, dim > 0)");
  const int64_t total = groups * dim;
  if (total == 0) return ok_status();
  if (!a || !b || !out) return invalid_argument("softmax_pool: null a, b or out");
  if ((total + kThreads - 1) / kThreads > 0x7fffffff)
    return invalid_argument("softmax_pool: groups x dim too large");
  launch(softmax_pool_kernel, static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream, a, b, r, dim, total, out);
  return last_launch_status("softmax_pool");
}

}  // namespace ds41::cuda
