// ds41 backends/cuda: split-half 2D RoPE (rope_2d_kernels.h). As the CPU op
// (src/backends/cpu/cpu_vision_ops.cpp): the float32 angle p * f, cos / sin in float64 rounded to
// float32, then the same float32 products and sums (no contraction: --fmad=false), so results
// differ only where CUDA's and libm's float64 cos / sin round to different float32 values.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/rope_2d_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxHalf = 2048;

// One block per row: the row's cos / sin per channel of the half in shared memory, then every
// head's (j, j + half) pairs.
__global__ void __launch_bounds__(kThreads)
    rope_2d_kernel(float* x, int64_t heads, int64_t head_dim, int64_t ld, const int32_t* __restrict__ row,
                   const int32_t* __restrict__ col, const float* __restrict__ inv_freq) {
  dev::pdl_enter();
  __shared__ float cs[2 * kMaxHalf];
  const int64_t r = blockIdx.x, half = head_dim / 2, q = head_dim / 4;
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const float p = static_cast<float>(j < q ? row[r] : col[r]);
    const float ang = __fmul_rn(p, inv_freq[j % q]);  // float32 product, as the reference
    double s, c;
    sincos(static_cast<double>(ang), &s, &c);
    cs[2 * j] = static_cast<float>(c);
    cs[2 * j + 1] = static_cast<float>(s);
  }
  __syncthreads();
  float* xr = x + r * ld;
  for (int64_t t = threadIdx.x; t < heads * half; t += blockDim.x) {
    const int64_t h = t / half, j = t % half;
    float* v = xr + h * head_dim;
    const float x1 = v[j], x2 = v[j + half], c = cs[2 * j], s = cs[2 * j + 1];
    v[j] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    v[j + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

}  // namespace

Status run_rope_2d(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t ld, const int32_t* row,
                   const int32_t* col, const float* inv_freq, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff) return invalid_argument("rope_2d: n " + std::to_string(n) + " out of range");
  if (heads <= 0 || head_dim <= 0 || head_dim % 4 != 0 || head_dim / 2 > kMaxHalf)
    return invalid_argument("rope_2d: heads " + std::to_string(heads) + ", head_dim " +
                            std::to_string(head_dim) +
                            " (want head_dim % 4 == 0 and head_dim <= " + std::to_string(2 * kMaxHalf) + ")");
  if (ld < heads * head_dim)
    return invalid_argument("rope_2d: row stride " + std::to_string(ld) + " < heads * head_dim " +
                            std::to_string(heads * head_dim));
  if (n == 0) return ok_status();
  launch(rope_2d_kernel, static_cast<unsigned>(n), kThreads, 0, stream, x, heads, head_dim, ld, row, col,
                                                                    inv_freq);
  return last_launch_status("rope_2d");
}

}  // namespace ds41::cuda
