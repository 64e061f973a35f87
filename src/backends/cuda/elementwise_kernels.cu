// ds41 backends/cuda: embeddings, RMSNorm, RoPE, SwiGLU and row movement (MODEL_SPEC 3.1, 3.4.1,
// 3.5, 3.8). The math follows the CPU reference op by op (src/backends/cpu/cpu_backend.cpp): the
// same float32 operations in the same order, float64 where the reference uses float64
// (RMSNorm's sum of squares, RoPE's cos/sin, SiLU's exp), so results are bit-identical except
// where the order of a float64 sum or a libm-vs-CUDA last-ulp difference in float64 changes a
// float32 rounding (docs/gpu_kernels.md).
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/rope_table.cuh"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/swiglu_device.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxFreq = 2048;

__global__ void embed_bf16_kernel(const uint16_t* __restrict__ table, int64_t rows, int64_t dim,
                                  const int32_t* __restrict__ ids, int64_t total, float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / dim, c = i % dim;
  const int64_t id = ids[r];
  out[i] = (id < 0 || id >= rows) ? dev::nan_f32()
                                  : __uint_as_float(static_cast<uint32_t>(table[id * dim + c]) << 16);
}

// One block per row; the sum of squares in float64 like the reference, then the same float32
// rounding steps: mean -> float, inv = float(1 / sqrt(double(mean + eps))), y = (x * inv) * w.
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, int64_t dim, const float* __restrict__ weight, float eps, float* y) {
  dev::pdl_enter();
  __shared__ double scratch[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    ss += v * v;
  }
  ss = dev::block_sum(ss, scratch);
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(mean + eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = __fmul_rn(xr[i], inv) * (weight ? weight[i] : 1.0f);
}

// The same row norm for rows of up to kRegThreads * kRegPer floats (decode: few rows): the row's
// values are loaded once, all at once (kRegPer per thread, in flight together; blockDim.x * kRegPer
// >= dim), kept in registers
// for the scaling pass; same float64 sum of squares (another order) and the same float32 steps.
constexpr int kRegThreads = 1024, kRegPer = 8;
__global__ void __launch_bounds__(kRegThreads)
    rms_norm_reg_kernel(const float* x, int64_t dim, const float* __restrict__ weight, float eps, float* y) {
  dev::pdl_enter();
  __shared__ double scratch[32];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  float v[kRegPer];
#pragma unroll
  for (int j = 0; j < kRegPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    v[j] = i < dim ? xr[i] : 0.0f;
  }
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kRegPer; ++j) ss += static_cast<double>(v[j]) * static_cast<double>(v[j]);
  ss = dev::block_sum(ss, scratch);
  const float mean = static_cast<float>(ss / static_cast<double>(dim));
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(mean + eps)));
#pragma unroll
  for (int j = 0; j < kRegPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i < dim) yr[i] = __fmul_rn(v[j], inv) * (weight ? weight[i] : 1.0f);
  }
}

// Block (r, c): row r's pairs [c * blockDim.x, (c + 1) * blockDim.x), one per thread (one CTA per
// row made eight dependent load / store rounds for 64 heads of 32 pairs). The pair is loaded first,
// the cos/sin of the row's angles go to shared memory meanwhile.
__global__ void __launch_bounds__(kThreads)
    rope_kernel(float* x, int64_t heads, int64_t head_dim, const int64_t* __restrict__ pos,
                const float* __restrict__ inv_freq, int64_t n_freq, bool inverse) {
  dev::pdl_enter();
  __shared__ float cs[2 * kMaxFreq];
  const int64_t r = blockIdx.x;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = t < heads * n_freq;
  const int64_t off = head_dim - 2 * n_freq;
  const int64_t h = active ? t / n_freq : 0, i = active ? t % n_freq : 0;
  float* v = x + r * heads * head_dim + h * head_dim + off + 2 * i;
  const float e = active ? v[0] : 0.0f, o = active ? v[1] : 0.0f;
  const float p = static_cast<float>(pos[r]);
  dev::rope_table_fill(p, inv_freq, n_freq, inverse, cs, threadIdx.x, blockDim.x);
  __syncthreads();
  if (active) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    v[0] = __fsub_rn(__fmul_rn(e, c), __fmul_rn(o, s));
    v[1] = __fadd_rn(__fmul_rn(e, s), __fmul_rn(o, c));
  }
}

// out = row_scale[r] * silu(min(g, limit)) * clamp(u, -limit, limit), std::min / std::clamp
// semantics (a NaN input passes through), SiLU in float64 as the reference.
__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t dim,
                              int64_t total, float limit, const float* __restrict__ row_scale,
                              float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float a = dev::swiglu_value(g[i], u[i], limit);
  out[i] = row_scale ? __fmul_rn(row_scale[i / dim], a) : a;
}

__global__ void scale_kernel(float* x, int64_t count, float s) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = __fmul_rn(x[i], s);
}

__global__ void add_kernel(float* y, const float* __restrict__ x, int64_t count) {
  dev::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] = __fadd_rn(y[i], x[i]);
}

// Row movement: one block row per destination row (grid.y = rows, grid.x over the columns).
__global__ void gather_rows_kernel(const float* __restrict__ src, const int64_t* __restrict__ idx,
                                   int64_t dim, float* __restrict__ dst) {
  dev::pdl_enter();
  const int64_t i = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const int64_t s = idx[i];
  dst[i * dim + c] = s < 0 ? 0.0f : src[s * dim + c];
}

__global__ void gather_row_ptrs_kernel(const float* const* __restrict__ ptrs, int64_t dim,
                                       float* __restrict__ dst) {
  dev::pdl_enter();
  const int64_t i = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const float* p = ptrs[i];
  dst[i * dim + c] = p ? p[c] : 0.0f;
}

__global__ void scatter_rows_kernel(const float* __restrict__ src, const int64_t* __restrict__ idx,
                                    int64_t dim, float* __restrict__ dst) {
  dev::pdl_enter();
  const int64_t i = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  const int64_t d = idx[i];
  if (d >= 0) dst[d * dim + c] = src[i * dim + c];
}

__global__ void slice_cols_kernel(const float* __restrict__ x, int64_t x_cols, int64_t col_begin,
                                  int64_t width, float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t r = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= width) return;
  out[r * width + c] = x[r * x_cols + col_begin + c];
}

Status bad(const char* fn, const std::string& what) {
  return invalid_argument(std::string(fn) + ": " + what);
}

Status check_rows(const char* fn, int64_t m, int64_t dim) {
  if (m < 0 || m > 65535 * int64_t{1024}) return bad(fn, "row count " + std::to_string(m) + " out of range");
  if (dim <= 0) return bad(fn, "dim " + std::to_string(dim) + " must be positive");
  return ok_status();
}

// Row-movement grid: x over columns (256 per block), y over rows (rows <= 65535 per launch).
template <typename Launch>
void for_row_chunks(int64_t m, int64_t cols, Launch&& launch) {
  for (int64_t r0 = 0; r0 < m; r0 += 65535) {
    const int64_t rows = std::min<int64_t>(65535, m - r0);
    launch(r0, dim3(grid_1d(cols, kThreads), static_cast<unsigned>(rows)));
  }
}

}  // namespace

Status run_embed_bf16(const uint8_t* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                      float* out, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0 || n < 0) return bad("embed_bf16", "rows/dim/n out of range");
  if (n == 0) return ok_status();
  const int64_t total = n * dim;
  launch(embed_bf16_kernel, grid_1d(total, kThreads), kThreads, 0, stream, reinterpret_cast<const uint16_t*>(table), rows, dim, ids, total, out);
  return last_launch_status("embed_bf16");
}

int rms_norm_sum_threads(int64_t n, int64_t dim) {
  if (n < 128 && dim <= int64_t{kRegThreads} * kRegPer) {
    const int threads =
        static_cast<int>(std::min<int64_t>(kRegThreads, (dim + kRegPer - 1) / kRegPer + 31) / 32 * 32);
    return std::max(threads, 32);
  }
  return kThreads;  // rms_norm_kernel: i = t, t + 256, ...
}

Status run_rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y,
                    cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff) return bad("rms_norm", "n " + std::to_string(n) + " out of range");
  if (dim <= 0) return bad("rms_norm", "dim " + std::to_string(dim) + " must be positive");
  if (n == 0) return ok_status();
  if (n < 128 && dim <= int64_t{kRegThreads} * kRegPer) {  // decode: a row's loads all in flight
    launch(rms_norm_reg_kernel, static_cast<unsigned>(n), rms_norm_sum_threads(n, dim), 0, stream, x, dim, weight,
           eps, y);
  } else {
    launch(rms_norm_kernel, static_cast<unsigned>(n), kThreads, 0, stream, x, dim, weight, eps, y);
  }
  return last_launch_status("rms_norm");
}

Status run_rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int64_t* pos,
                const float* inv_freq, int64_t n_freq, bool inverse, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff) return bad("rope", "n " + std::to_string(n) + " out of range");
  if (heads <= 0 || head_dim <= 0) return bad("rope", "heads/head_dim must be positive");
  if (n_freq < 0 || n_freq > kMaxFreq || 2 * n_freq > head_dim)
    return bad("rope", "n_freq " + std::to_string(n_freq) +
                           " (want 2 * n_freq <= head_dim, n_freq <= " + std::to_string(kMaxFreq) + ")");
  if (n == 0 || n_freq == 0) return ok_status();
  const int64_t chunks = (heads * n_freq + kThreads - 1) / kThreads;
  if (chunks > 65535) return bad("rope", "heads x n_freq too large for one grid");
  launch(rope_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(chunks)), kThreads, 0, stream, x, heads,
         head_dim, pos, inv_freq, n_freq, inverse);
  return last_launch_status("rope");
}

Status run_swiglu(const float* g, const float* u, int64_t n, int64_t dim, float limit, const float* row_scale,
                  float* out, cudaStream_t stream) {
  if (n < 0 || dim <= 0) return bad("swiglu", "n/dim out of range");
  if (n == 0) return ok_status();
  const int64_t total = n * dim;
  launch(swiglu_kernel, grid_1d(total, kThreads), kThreads, 0, stream, g, u, dim, total, limit, row_scale, out);
  return last_launch_status("swiglu");
}

Status run_scale(float* x, int64_t count, float s, cudaStream_t stream) {
  if (count < 0) return bad("scale", "count is negative");
  if (count == 0) return ok_status();
  launch(scale_kernel, grid_1d(count, kThreads), kThreads, 0, stream, x, count, s);
  return last_launch_status("scale");
}

Status run_add_inplace(float* y, const float* x, int64_t count, cudaStream_t stream) {
  if (count < 0) return bad("add_inplace", "count is negative");
  if (count == 0) return ok_status();
  launch(add_kernel, grid_1d(count, kThreads), kThreads, 0, stream, y, x, count);
  return last_launch_status("add_inplace");
}

Status run_gather_rows(const float* src, const int64_t* idx, int64_t m, int64_t dim, float* dst,
                       cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("gather_rows", m, dim));
  for_row_chunks(m, dim, [&](int64_t r0, dim3 grid) {
    launch(gather_rows_kernel, grid, kThreads, 0, stream, src, idx + r0, dim, dst + r0 * dim);
  });
  return last_launch_status("gather_rows");
}

Status run_gather_row_ptrs(const float* const* row_ptrs, int64_t m, int64_t dim, float* dst,
                           cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("gather_row_ptrs", m, dim));
  for_row_chunks(m, dim, [&](int64_t r0, dim3 grid) {
    launch(gather_row_ptrs_kernel, grid, kThreads, 0, stream, row_ptrs + r0, dim, dst + r0 * dim);
  });
  return last_launch_status("gather_row_ptrs");
}

Status run_scatter_rows(const float* src, const int64_t* idx, int64_t m, int64_t dim, float* dst,
                        cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("scatter_rows", m, dim));
  for_row_chunks(m, dim, [&](int64_t r0, dim3 grid) {
    launch(scatter_rows_kernel, grid, kThreads, 0, stream, src + r0 * dim, idx + r0, dim, dst);
  });
  return last_launch_status("scatter_rows");
}

Status run_slice_cols(const float* x, int64_t n, int64_t x_cols, int64_t col_begin, int64_t width, float* out,
                      cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("slice_cols", n, width));
  if (col_begin < 0 || col_begin + width > x_cols)
    return bad("slice_cols", "columns [" + std::to_string(col_begin) + ", " +
                                 std::to_string(col_begin + width) + ") outside x_cols " +
                                 std::to_string(x_cols));
  for_row_chunks(n, width, [&](int64_t r0, dim3 grid) {
    launch(slice_cols_kernel, grid, kThreads, 0, stream, x + r0 * x_cols, x_cols, col_begin, width,
                                                     out + r0 * width);
  });
  return last_launch_status("slice_cols");
}

}  // namespace ds41::cuda
