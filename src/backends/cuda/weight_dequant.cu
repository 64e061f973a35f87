// ds41 backends/cuda: weight dequantization kernels and their plan()/run() launchers
// (MODEL_SPEC 2.1). Vector path: one thread per 16 consecutive bytes of a row (uint4 loads,
// float4 / 8-byte bf16 stores); a per-element path covers unaligned pointers and odd shapes.
#include <cuda_bf16.h>

#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/weight_dequant.h"

namespace ds41::cuda {
namespace {

constexpr int kTile = 32;

template <typename T>
__device__ __forceinline__ T cast_out(float v);
template <>
__device__ __forceinline__ float cast_out<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 cast_out<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Stores 16 consecutive values.
template <typename T>
__device__ __forceinline__ void store16(T* dst, const float* v);
template <>
__device__ __forceinline__ void store16<float>(float* dst, const float* v) {
  float4* d = reinterpret_cast<float4*>(dst);
#pragma unroll
  for (int q = 0; q < 4; ++q) d[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}
template <>
__device__ __forceinline__ void store16<__nv_bfloat16>(__nv_bfloat16* dst, const float* v) {
  uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      __nv_bfloat162 p = __floats2bfloat162_rn(v[8 * q + 2 * k], v[8 * q + 2 * k + 1]);
      w[k] = *reinterpret_cast<uint32_t*>(&p);
    }
    d[q] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// FP8 tiles, 16 bytes per thread (in_dim % 16 == 0, so a group never straddles a tile).
template <typename T>
__global__ void fp8_tiles_vec_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ scale,
                                     int64_t in_dim, int64_t row_begin, int64_t n_items,
                                     T* __restrict__ out) {
  dev::pdl_enter();
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_items) return;
  const int64_t groups = in_dim / 16;
  const int64_t r = idx / groups, g = idx % groups, o = row_begin + r, col = g * 16;
  const int64_t tiles_in = (in_dim + kTile - 1) / kTile;
  const float s = dev::e8m0_decode(scale[(o / kTile) * tiles_in + col / kTile]);
  uint32_t b[16];
  dev::unpack16(__ldg(reinterpret_cast<const uint4*>(w + o * in_dim + col)), b);
  float v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) v[k] = dev::e4m3_decode(b[k]) * s;
  store16<T>(out + r * in_dim + col, v);
}

template <typename T>
__global__ void fp8_tiles_scalar_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ scale,
                                        int64_t in_dim, int64_t row_begin, int64_t n_items,
                                        T* __restrict__ out) {
  dev::pdl_enter();
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_items) return;
  const int64_t r = idx / in_dim, i = idx % in_dim, o = row_begin + r;
  const int64_t tiles_in = (in_dim + kTile - 1) / kTile;
  const float s = dev::e8m0_decode(scale[(o / kTile) * tiles_in + i / kTile]);
  out[idx] = cast_out<T>(dev::e4m3_decode(w[o * in_dim + i]) * s);
}

// FP4 expert rows: one thread per 32-element scale block (16 packed bytes, one uint4 load).
template <typename T>
__global__ void fp4_rows_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scale,
                                int64_t in_dim, int64_t row_begin, int64_t n_items, T* __restrict__ out) {
  dev::pdl_enter();
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_items) return;
  const int64_t nb = in_dim / 32;
  const int64_t r = idx / nb, blk = idx % nb, o = row_begin + r;
  const float s = dev::e8m0_decode(scale[o * nb + blk]);
  uint32_t b[16];
  dev::unpack16(__ldg(reinterpret_cast<const uint4*>(packed + o * (in_dim / 2) + blk * 16)), b);
  float v[32];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    v[2 * k] = dev::e2m1_decode(b[k] & 15u) * s;  // low nibble = even element (MODEL_SPEC 7.17)
    v[2 * k + 1] = dev::e2m1_decode(b[k] >> 4) * s;
  }
  T* dst = out + r * in_dim + blk * 32;
  store16<T>(dst, v);
  store16<T>(dst + 16, v + 16);
}

// Engram rows gathered by id, 16 bytes per thread (dim % 32 == 0).
template <typename T>
__global__ void engram_rows_kernel(const uint8_t* __restrict__ table, const uint8_t* __restrict__ scale,
                                   const int64_t* __restrict__ ids, int64_t table_rows, int64_t dim,
                                   int64_t n_items, T* __restrict__ out) {
  dev::pdl_enter();
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_items) return;
  const int64_t groups = dim / 16;
  const int64_t r = idx / groups, col = (idx % groups) * 16;
  const int64_t id = ids[r];
  float v[16];
  if (id < 0 || id >= table_rows) {
#pragma unroll
    for (int k = 0; k < 16; ++k) v[k] = dev::nan_f32();
  } else {
    const float s = dev::e8m0_decode(scale[id * (dim / 32) + col / 32]);
    uint32_t b[16];
    dev::unpack16(__ldg(reinterpret_cast<const uint4*>(table + id * dim + col)), b);
#pragma unroll
    for (int k = 0; k < 16; ++k) v[k] = dev::e4m3_decode(b[k]) * s;
  }
  store16<T>(out + r * dim + col, v);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

unsigned blocks_for(int64_t items, int threads) {
  return static_cast<unsigned>((items + threads - 1) / threads);
}

Status check_out_dtype(DType t) {
  if (t != DType::kF32 && t != DType::kBF16)
    return invalid_argument(std::string("weight dequant: output dtype ") + dtype_name(t) +
                            " (want F32 or BF16)");
  return ok_status();
}

Status check_rows(const char* what, int64_t out_dim, int64_t in_dim, int64_t row_begin, int64_t row_end) {
  if (out_dim <= 0 || in_dim <= 0)
    return invalid_argument(std::string(what) + ": shape [" + std::to_string(out_dim) + ", " +
                            std::to_string(in_dim) + "] must be positive");
  if (row_begin < 0 || row_end > out_dim || row_begin >= row_end)
    return invalid_argument(std::string(what) + ": row range [" + std::to_string(row_begin) + ", " +
                            std::to_string(row_end) + ") is empty or outside [0, " + std::to_string(out_dim) +
                            ")");
  if (out_dim > (int64_t{1} << 40) || in_dim > (int64_t{1} << 40))
    return invalid_argument(std::string(what) + ": absurd shape");
  return ok_status();
}

// Grid limit: 2^31 - 1 blocks of 256 threads covers 5.5e11 items, beyond any tensor of §2.
Status check_grid(const char* what, int64_t items, int threads) {
  if (blocks_for(items, threads) == 0 || (items + threads - 1) / threads > 0x7fffffff)
    return invalid_argument(std::string(what) + ": " + std::to_string(items) +
                            " work items exceed one launch");
  return ok_status();
}

}  // namespace

Result<WeightDequantPlan> plan_fp8_tiles_dequant(int64_t out_dim, int64_t in_dim, int64_t row_begin,
                                                 int64_t row_end, DType out_dtype) {
  DS41_RETURN_IF_ERROR(check_out_dtype(out_dtype));
  DS41_RETURN_IF_ERROR(check_rows("fp8 tile dequant", out_dim, in_dim, row_begin, row_end));
  WeightDequantPlan p;
  p.format = WeightFormat::kFp8Tiles;
  p.out_dtype = out_dtype;
  p.out_dim = out_dim;
  p.in_dim = in_dim;
  p.row_begin = row_begin;
  p.row_end = row_end;
  p.vec16 = in_dim % 16 == 0;
  p.scalar_items = (row_end - row_begin) * in_dim;
  p.work_items = p.vec16 ? p.scalar_items / 16 : p.scalar_items;
  DS41_RETURN_IF_ERROR(check_grid("fp8 tile dequant", p.scalar_items, p.threads));
  return p;
}

Status run_fp8_tiles_dequant(const WeightDequantPlan& p, const uint8_t* w, const uint8_t* scale, void* out,
                             cudaStream_t stream) {
  if (p.format != WeightFormat::kFp8Tiles)
    return invalid_argument("run_fp8_tiles_dequant: plan is for another format");
  const bool vec = p.vec16 && aligned16(w) && aligned16(out);
  const int64_t items = vec ? p.work_items : p.scalar_items;
  const unsigned grid = blocks_for(items, p.threads);
  if (p.out_dtype == DType::kF32) {
    auto* o = static_cast<float*>(out);
    if (vec)
      launch(fp8_tiles_vec_kernel<float>, grid, p.threads, 0, stream, w, scale, p.in_dim, p.row_begin, items, o);
    else
      launch(fp8_tiles_scalar_kernel<float>, grid, p.threads, 0, stream, w, scale, p.in_dim, p.row_begin, items, o);
  } else {
    auto* o = static_cast<__nv_bfloat16*>(out);
    if (vec)
      launch(fp8_tiles_vec_kernel<__nv_bfloat16>, grid, p.threads, 0, stream, w, scale, p.in_dim, p.row_begin, items, o);
    else
      launch(fp8_tiles_scalar_kernel<__nv_bfloat16>, grid, p.threads, 0, stream, w, scale, p.in_dim, p.row_begin, items, o);
  }
  return last_launch_status("fp8_tiles_dequant");
}

Result<WeightDequantPlan> plan_fp4_rows_dequant(int64_t out_dim, int64_t in_dim, int64_t row_begin,
                                                int64_t row_end, DType out_dtype) {
  DS41_RETURN_IF_ERROR(check_out_dtype(out_dtype));
  DS41_RETURN_IF_ERROR(check_rows("fp4 expert dequant", out_dim, in_dim, row_begin, row_end));
  constexpr int kBlock = quant::weight_format_traits(WeightFormat::kFp4Rows).block_cols;
  if (in_dim % kBlock)
    return invalid_argument("fp4 expert dequant: in_dim " + std::to_string(in_dim) +
                            " is not a multiple of " + std::to_string(kBlock) +
                            " (one E8M0 scale per 32 inputs, MODEL_SPEC 2.1)");
  WeightDequantPlan p;
  p.format = WeightFormat::kFp4Rows;
  p.out_dtype = out_dtype;
  p.out_dim = out_dim;
  p.in_dim = in_dim;
  p.row_begin = row_begin;
  p.row_end = row_end;
  p.vec16 = true;
  p.work_items = (row_end - row_begin) * (in_dim / 32);
  p.scalar_items = p.work_items;
  DS41_RETURN_IF_ERROR(check_grid("fp4 expert dequant", p.work_items, p.threads));
  return p;
}

Status run_fp4_rows_dequant(const WeightDequantPlan& p, const uint8_t* packed, const uint8_t* scale,
                            void* out, cudaStream_t stream) {
  if (p.format != WeightFormat::kFp4Rows)
    return invalid_argument("run_fp4_rows_dequant: plan is for another format");
  if (!aligned16(packed) || !aligned16(out))
    return invalid_argument("run_fp4_rows_dequant: packed weights and output must be 16-byte aligned");
  const unsigned grid = blocks_for(p.work_items, p.threads);
  if (p.out_dtype == DType::kF32)
    launch(fp4_rows_kernel<float>, grid, p.threads, 0, stream, packed, scale, p.in_dim, p.row_begin, p.work_items,
           static_cast<float*>(out));
  else
    launch(fp4_rows_kernel<__nv_bfloat16>, grid, p.threads, 0, stream, packed, scale, p.in_dim, p.row_begin,
           p.work_items, static_cast<__nv_bfloat16*>(out));
  return last_launch_status("fp4_rows_dequant");
}

Result<WeightDequantPlan> plan_engram_rows_dequant(int64_t table_rows, int64_t dim, int64_t n_ids,
                                                   DType out_dtype) {
  DS41_RETURN_IF_ERROR(check_out_dtype(out_dtype));
  constexpr int kBlock = quant::weight_format_traits(WeightFormat::kEngramRows).block_cols;
  if (table_rows <= 0 || dim <= 0 || dim % kBlock || n_ids <= 0)
    return invalid_argument("engram row dequant: table [" + std::to_string(table_rows) + ", " +
                            std::to_string(dim) + "] with " + std::to_string(n_ids) +
                            " ids (dim must be a positive multiple of 32)");
  WeightDequantPlan p;
  p.format = WeightFormat::kEngramRows;
  p.out_dtype = out_dtype;
  p.out_dim = table_rows;
  p.in_dim = dim;
  p.row_begin = 0;
  p.row_end = n_ids;
  p.vec16 = true;
  p.work_items = n_ids * (dim / 16);
  p.scalar_items = p.work_items;
  DS41_RETURN_IF_ERROR(check_grid("engram row dequant", p.work_items, p.threads));
  return p;
}

Status run_engram_rows_dequant(const WeightDequantPlan& p, const uint8_t* table, const uint8_t* scale,
                               const int64_t* ids, void* out, cudaStream_t stream) {
  if (p.format != WeightFormat::kEngramRows)
    return invalid_argument("run_engram_rows_dequant: plan is for another format");
  if (!aligned16(table) || !aligned16(out))
    return invalid_argument("run_engram_rows_dequant: table and output must be 16-byte aligned");
  const unsigned grid = blocks_for(p.work_items, p.threads);
  if (p.out_dtype == DType::kF32)
    launch(engram_rows_kernel<float>, grid, p.threads, 0, stream, table, scale, ids, p.out_dim, p.in_dim,
           p.work_items, static_cast<float*>(out));
  else
    launch(engram_rows_kernel<__nv_bfloat16>, grid, p.threads, 0, stream, table, scale, ids, p.out_dim, p.in_dim,
           p.work_items, static_cast<__nv_bfloat16*>(out));
  return last_launch_status("engram_rows_dequant");
}

}  // namespace ds41::cuda
