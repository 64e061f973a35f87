// ds41 backends/cuda: device-generated random weights (dummy_weight_kernels.h).
#include <cuda_bf16.h>

#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/dummy_weight_kernels.h"
#include "backends/cuda/quant_device.cuh"

namespace ds41::cuda {
namespace {

constexpr uint64_t kGainStream = 0x7ull;  // as random_weights.cpp: gains from name_hash ^ 7

// splitmix64's finalizer.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Counter-based: a pure function of (seed, stream, index).
__device__ __forceinline__ uint64_t draw_bits(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t k = mix64(seed ^ mix64(stream + 0x9e3779b97f4a7c15ull));
  return mix64(k + (i + 1) * 0x9e3779b97f4a7c15ull);
}

// U[0, 1) with 24 bits.
__device__ __forceinline__ float draw_uniform(uint64_t seed, uint64_t stream, uint64_t i) {
  return static_cast<float>(draw_bits(seed, stream, i) >> 40) * 0x1p-24f;
}

// N(0, 1) by Box-Muller from one 64-bit draw (u1 in (0, 1]: |n| <= 5.8).
__device__ __forceinline__ float draw_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t h = draw_bits(seed, stream, i);
  const float u1 = static_cast<float>((h >> 40) + 1) * 0x1p-24f;
  const float u2 = static_cast<float>(h & 0xffffffull) * 0x1p-24f;
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// 2^U(-1, 1): the recipe's block gain.
__device__ __forceinline__ float draw_gain(const DummyParams& p, uint64_t block) {
  return exp2f(2.0f * draw_uniform(p.seed, p.stream ^ kGainStream, block) - 1.0f);
}

// The master value of element (r, c) of a [*, cols] tensor, before any gain or row projection.
__device__ __forceinline__ float master_value(const DummyParams& p, int64_t r, int64_t c, int64_t cols) {
  const uint64_t i = static_cast<uint64_t>(r) * static_cast<uint64_t>(cols) + static_cast<uint64_t>(c);
  const float d = (p.direction && c < p.dir_len) ? p.direction[c] : 0.0f;
  switch (p.dist) {
    case DummyDist::kNormal:
    case DummyDist::kRouter: return p.a * draw_normal(p.seed, p.stream, i);
    case DummyDist::kNormClamp:
      return fminf(fmaxf(1.0f + 0.15f * draw_normal(p.seed, p.stream, i), 0.5f), 1.5f);
    case DummyDist::kShifted: return p.b + p.a * draw_normal(p.seed, p.stream, i);
    case DummyDist::kUniform: return p.a + (p.b - p.a) * draw_uniform(p.seed, p.stream, i);
    case DummyDist::kEmbed: return draw_normal(p.seed, p.stream, i) + p.a * d;
    case DummyDist::kWeightsProj: return p.a * d + 0.1f * p.a * draw_normal(p.seed, p.stream, i);
  }
  return 0.0f;
}

// Deterministic block sum (fixed tree) of one float per thread; blockDim.x a multiple of 32, <= 1024.
__device__ float block_sum(float v, float* shared32) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  float s = lane < warps ? shared32[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ __forceinline__ void store_plain(void* out, int64_t idx, float v, bool bf16_out, bool round_bf16) {
  if (bf16_out) {
    static_cast<__nv_bfloat16*>(out)[idx] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(out)[idx] = round_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
  }
}

// One block per row (rows may be many: grid-stride over rows).
__global__ void dummy_plain_kernel(DummyParams p, int64_t rows, int64_t cols, bool bf16_out, bool round_bf16,
                                   void* out) {
  __shared__ float red[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float proj = 0.0f;
    if (p.dist == DummyDist::kRouter && p.direction) {
      float dot = 0.0f;
      for (int64_t c = threadIdx.x; c < cols && c < p.dir_len; c += blockDim.x)
        dot += master_value(p, r, c, cols) * p.direction[c];
      proj = block_sum(dot, red);
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = master_value(p, r, c, cols);
      if (p.dist == DummyDist::kRouter && p.direction && c < p.dir_len) v -= proj * p.direction[c];
      store_plain(out, r * cols + c, v, bf16_out, round_bf16);
    }
  }
}

// ceil(log2(amax / max_code)) clamped to [-127, 127]; -127 for an all-zero block (quant rule).
__device__ __forceinline__ int block_exponent(float amax, float max_code) {
  if (!(amax > 0.0f)) return -127;
  const float t = amax / max_code;
  const int k = t >= 0x1p-126f ? dev::pow2ceil_exponent(t) : -127;
  return k < -127 ? -127 : (k > 127 ? 127 : k);
}

// One 256-thread block per 32x32 tile, 4 elements per thread.
__global__ void dummy_fp8_tiles_kernel(DummyParams p, int64_t rows, int64_t cols, uint8_t* w,
                                       uint8_t* scale) {
  __shared__ float red[8];
  const int64_t tiles_in = (cols + 31) / 32;
  const int64_t ti = blockIdx.x, to = blockIdx.y;
  const float gain = p.gains ? draw_gain(p, static_cast<uint64_t>(to * tiles_in + ti)) : 1.0f;
  float v[4];
  bool in_range[4];
  float amax = 0.0f;
  for (int k = 0; k < 4; ++k) {
    const int e = threadIdx.x + 256 * k;
    const int64_t r = to * 32 + e / 32, c = ti * 32 + e % 32;
    in_range[k] = r < rows && c < cols;
    v[k] = in_range[k] ? master_value(p, r, c, cols) * gain : 0.0f;
    amax = fmaxf(amax, fabsf(v[k]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = red[0];
  for (int i = 1; i < 8; ++i) amax = fmaxf(amax, red[i]);
  const int kexp = block_exponent(amax, 448.0f);
  if (threadIdx.x == 0) scale[to * tiles_in + ti] = static_cast<uint8_t>(kexp + 127);
  for (int k = 0; k < 4; ++k) {
    if (!in_range[k]) continue;
    const int e = threadIdx.x + 256 * k;
    const int64_t r = to * 32 + e / 32, c = ti * 32 + e % 32;
    w[r * cols + c] = static_cast<uint8_t>(dev::e4m3_encode(ldexpf(v[k], -kexp)));
  }
}

// One thread per (row, block of 32): FP4 (fp4 = true, packed) or Engram E4M3 rows.
__global__ void dummy_row_blocks_kernel(DummyParams p, int64_t rows, int64_t cols, bool fp4, uint8_t* data,
                                        uint8_t* scale) {
  const int64_t nb = cols / 32;
  const int64_t total = rows * nb;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / nb, b = t % nb;
    const float gain = p.gains ? draw_gain(p, static_cast<uint64_t>(t)) : 1.0f;
    float v[32];
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      v[j] = master_value(p, r, b * 32 + j, cols) * gain;
      amax = fmaxf(amax, fabsf(v[j]));
    }
    const int kexp = block_exponent(amax, fp4 ? 6.0f : 448.0f);
    scale[t] = static_cast<uint8_t>(kexp + 127);
    if (fp4) {
      uint8_t* dst = data + r * (cols / 2) + b * 16;
      for (int j = 0; j < 16; ++j) {
        const uint32_t lo = dev::e2m1_encode(ldexpf(v[2 * j], -kexp));
        const uint32_t hi = dev::e2m1_encode(ldexpf(v[2 * j + 1], -kexp));
        dst[j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    } else {
      uint8_t* dst = data + r * cols + b * 32;
      for (int j = 0; j < 32; ++j) dst[j] = static_cast<uint8_t>(dev::e4m3_encode(ldexpf(v[j], -kexp)));
    }
  }
}

__global__ void dummy_uniform_product_kernel(uint64_t seed, uint64_t sa, uint64_t sb, float lo, float hi,
                                             int64_t n, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float qa = __bfloat162float(__float2bfloat16_rn(lo + (hi - lo) * draw_uniform(seed, sa, i)));
    const float qb = __bfloat162float(__float2bfloat16_rn(lo + (hi - lo) * draw_uniform(seed, sb, i)));
    out[i] = qa * qb;
  }
}

unsigned grid_for(int64_t items, int threads) {
  const int64_t g = (items + threads - 1) / threads;
  return static_cast<unsigned>(g < 1 ? 1 : (g > 65535 * 16 ? 65535 * 16 : g));
}

Status check_dims(const char* what, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    return invalid_argument(std::string(what) + ": negative shape [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  return ok_status();
}

}  // namespace

Status run_dummy_plain(const DummyParams& p, int64_t rows, int64_t cols, DType out_dtype, bool round_to_bf16,
                       void* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_dims("run_dummy_plain", rows, cols));
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16)
    return invalid_argument("run_dummy_plain: out_dtype must be F32 or BF16");
  if (rows * cols == 0) return ok_status();
  if (!out) return invalid_argument("run_dummy_plain: null output");
  const unsigned grid = static_cast<unsigned>(rows < 65535 * 16 ? rows : 65535 * 16);
  dummy_plain_kernel<<<grid, 256, 0, stream>>>(p, rows, cols, out_dtype == DType::kBF16, round_to_bf16, out);
  return last_launch_status("dummy_plain_kernel");
}

Status run_dummy_fp8_tiles(const DummyParams& p, int64_t rows, int64_t cols, uint8_t* w, uint8_t* scale,
                           cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_dims("run_dummy_fp8_tiles", rows, cols));
  if (rows * cols == 0) return ok_status();
  if (!w || !scale) return invalid_argument("run_dummy_fp8_tiles: null output");
  const int64_t ti = (cols + 31) / 32, to = (rows + 31) / 32;
  if (ti > 0x7fffffff || to > 65535)
    return invalid_argument("run_dummy_fp8_tiles: " + std::to_string(rows) + " x " + std::to_string(cols) +
                            " exceeds the tile grid");
  dummy_fp8_tiles_kernel<<<dim3(static_cast<unsigned>(ti), static_cast<unsigned>(to)), 256, 0, stream>>>(
      p, rows, cols, w, scale);
  return last_launch_status("dummy_fp8_tiles_kernel");
}

Status run_dummy_fp4_rows(const DummyParams& p, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale,
                          cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_dims("run_dummy_fp4_rows", rows, cols));
  if (cols % 32 != 0)
    return invalid_argument("run_dummy_fp4_rows: cols " + std::to_string(cols) + " is not a multiple of 32");
  if (rows * cols == 0) return ok_status();
  if (!packed || !scale) return invalid_argument("run_dummy_fp4_rows: null output");
  dummy_row_blocks_kernel<<<grid_for(rows * (cols / 32), 128), 128, 0, stream>>>(p, rows, cols, true, packed,
                                                                                 scale);
  return last_launch_status("dummy_row_blocks_kernel (fp4)");
}

Status run_dummy_engram_rows(const DummyParams& p, int64_t rows, int64_t dim, uint8_t* table, uint8_t* scale,
                             cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_dims("run_dummy_engram_rows", rows, dim));
  if (dim % 32 != 0)
    return invalid_argument("run_dummy_engram_rows: dim " + std::to_string(dim) + " is not a multiple of 32");
  if (rows * dim == 0) return ok_status();
  if (!table || !scale) return invalid_argument("run_dummy_engram_rows: null output");
  dummy_row_blocks_kernel<<<grid_for(rows * (dim / 32), 128), 128, 0, stream>>>(p, rows, dim, false, table,
                                                                                scale);
  return last_launch_status("dummy_row_blocks_kernel (engram)");
}

Status run_dummy_uniform_product(uint64_t seed, uint64_t stream_a, uint64_t stream_b, float lo, float hi,
                                 int64_t n, float* out, cudaStream_t stream) {
  if (n < 0) return invalid_argument("run_dummy_uniform_product: negative n");
  if (n == 0) return ok_status();
  if (!out) return invalid_argument("run_dummy_uniform_product: null output");
  dummy_uniform_product_kernel<<<grid_for(n, 256), 256, 0, stream>>>(seed, stream_a, stream_b, lo, hi, n,
                                                                     out);
  return last_launch_status("dummy_uniform_product_kernel");
}

}  // namespace ds41::cuda
