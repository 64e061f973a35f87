// ds41 backends/cuda: Q_win / Q_kv / Q_idx kernels (MODEL_SPEC 3.9) and packed-row decoders
// (MODEL_SPEC 5.2). One thread per channel; a quantization block (32 or 16 channels) is a warp
// or a half warp, so the block maximum is a shuffle reduction and E2M1 nibble pairs are joined
// with one shuffle. Every lane of a warp takes part in the shuffles (no early return).
#include <cfloat>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fake_quant_kernels.h"
#include "backends/cuda/quant_device.cuh"

namespace ds41::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// max |x| over groups of `width` lanes (width 32 or 16); NaN ignored (fmaxf returns the other
// operand), inf counted as FLT_MAX — the rules of quant::block_amax.
template <int kWidth>
__device__ __forceinline__ float group_amax(float v) {
  float a = fabsf(v);
  a = isnan(a) ? 0.0f : a;
#pragma unroll
  for (int off = kWidth / 2; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(kFull, a, off));
  return fminf(a, FLT_MAX);
}

// Q_win: blocks of 32 = one warp. Row: n E4M3 codes then n/32 E8M0 exponents.
__global__ void q_win_encode_kernel(const float* __restrict__ x, int64_t n, int64_t total,
                                    uint8_t* __restrict__ rows) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const float a = fmaxf(group_amax<32>(v), 1e-4f);
  const int k = dev::pow2ceil_exponent(a * (1.0f / 448.0f));
  const float s = dev::exp2_int(k);
  if (!active) return;
  const int64_t r = e / n, i = e % n;
  uint8_t* row = rows + r * (n + n / 32);
  row[i] = static_cast<uint8_t>(
      isnan(v) ? 0x7fu : dev::e4m3_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -448.0f, 448.0f)));
  if ((i & 31) == 0) row[n + i / 32] = static_cast<uint8_t>(k + 127);
}

// Q_kv: blocks of 16 = half a warp. Row: n/2 packed E2M1 bytes then n/16 E4M3 scales.
__global__ void q_kv_encode_kernel(const float* __restrict__ x, int64_t n, int64_t total,
                                   uint8_t* __restrict__ rows) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const float a = fmaxf(group_amax<16>(v), 6.0f * 0x1p-9f);
  const uint32_t sc = dev::e4m3_encode(__fdiv_rn(a, 6.0f));
  const float s = dev::e4m3_decode(sc);
  const uint32_t code = dev::e2m1_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -6.0f, 6.0f));
  const uint32_t odd = __shfl_down_sync(kFull, code, 1);
  if (!active) return;
  const int64_t r = e / n, i = e % n;
  uint8_t* row = rows + r * (n / 2 + n / 16);
  if ((i & 1) == 0) row[i / 2] = static_cast<uint8_t>(code | (odd << 4));  // low nibble = even element
  if ((i & 15) == 0) row[n / 2 + i / 16] = static_cast<uint8_t>(sc);
}

// Q_idx: blocks of 32 = one warp. Row: n/2 packed E2M1 bytes then n/32 E8M0 exponents.
__global__ void q_idx_encode_kernel(const float* __restrict__ x, int64_t n, int64_t total,
                                    uint8_t* __restrict__ rows) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const float a = fmaxf(group_amax<32>(v), 6.0f * 0x1p-126f);
  const int k = dev::pow2ceil_exponent(a * (1.0f / 6.0f));
  const float s = dev::exp2_int(k);
  const uint32_t code = dev::e2m1_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -6.0f, 6.0f));
  const uint32_t odd = __shfl_down_sync(kFull, code, 1);
  if (!active) return;
  const int64_t r = e / n, i = e % n;
  uint8_t* row = rows + r * (n / 2 + n / 32);
  if ((i & 1) == 0) row[i / 2] = static_cast<uint8_t>(code | (odd << 4));
  if ((i & 31) == 0) row[n / 2 + i / 32] = static_cast<uint8_t>(k + 127);
}

template <typename T>
__device__ __forceinline__ void put(T* out, int64_t e, float v);
template <>
__device__ __forceinline__ void put<float>(float* out, int64_t e, float v) {
  out[e] = v;
}
template <>
__device__ __forceinline__ void put<__nv_bfloat16>(__nv_bfloat16* out, int64_t e, float v) {
  out[e] = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void fake_quant_decode_kernel(int op, const uint8_t* __restrict__ rows, int64_t n, int64_t total,
                                         T* __restrict__ out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t r = e / n, i = e % n;
  float v;
  if (op == 0) {
    const uint8_t* row = rows + r * (n + n / 32);
    v = dev::e4m3_decode(row[i]) * dev::e8m0_decode(row[n + i / 32]);
  } else {
    const uint8_t* row = rows + r * (n / 2 + (op == 1 ? n / 16 : n / 32));
    const uint32_t b = row[i / 2];
    const uint32_t code = (i & 1) ? (b >> 4) : (b & 15u);
    const float s = op == 1 ? dev::e4m3_decode(row[n / 2 + i / 16]) : dev::e8m0_decode(row[n / 2 + i / 32]);
    v = dev::e2m1_decode(code) * s;
  }
  put<T>(out, e, v);
}

__global__ void e4m3_encode_kernel(const float* __restrict__ x, int64_t n, uint8_t* __restrict__ codes) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) codes[e] = static_cast<uint8_t>(dev::e4m3_encode(x[e]));
}
__global__ void e2m1_encode_kernel(const float* __restrict__ x, int64_t n, uint8_t* __restrict__ codes) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) codes[e] = static_cast<uint8_t>(dev::e2m1_encode(x[e]));
}

unsigned grid_for(int64_t items, int threads) {
  return static_cast<unsigned>((items + threads - 1) / threads);
}

Status check_elementwise(const char* what, int64_t n) {
  if (n <= 0 || (n + 255) / 256 > 0x7fffffff)
    return invalid_argument(std::string(what) + ": element count " + std::to_string(n) + " out of range");
  return ok_status();
}

}  // namespace

Result<FakeQuantPlan> plan_fake_quant(FakeQuantOp op, int64_t n, int64_t rows) {
  const char* name = op == FakeQuantOp::kWin ? "Q_win" : op == FakeQuantOp::kKv ? "Q_kv" : "Q_idx";
  const int64_t block = op == FakeQuantOp::kKv ? 16 : 32;
  if (n <= 0 || n % block || n > (int64_t{1} << 24))
    return invalid_argument(std::string(name) + ": row width " + std::to_string(n) +
                            " must be a positive multiple of " + std::to_string(block) +
                            " (MODEL_SPEC 3.9 block size)");
  if (rows <= 0 || rows > (int64_t{1} << 40))
    return invalid_argument(std::string(name) + ": row count " + std::to_string(rows) + " out of range");
  FakeQuantPlan p;
  p.op = op;
  p.n = n;
  p.rows = rows;
  p.row_bytes = op == FakeQuantOp::kWin  ? n + n / 32
                : op == FakeQuantOp::kKv ? n / 2 + n / 16
                                         : n / 2 + n / 32;
  DS41_RETURN_IF_ERROR(check_elementwise(name, n * rows));
  return p;
}

Status run_fake_quant_encode(const FakeQuantPlan& p, const float* x, uint8_t* packed_rows,
                             cudaStream_t stream) {
  const int64_t total = p.n * p.rows;
  const unsigned grid =
      grid_for(total, p.threads);  // threads is a multiple of 32: blocks never straddle CTAs
  switch (p.op) {
    case FakeQuantOp::kWin:
      q_win_encode_kernel<<<grid, p.threads, 0, stream>>>(x, p.n, total, packed_rows);
      break;
    case FakeQuantOp::kKv:
      q_kv_encode_kernel<<<grid, p.threads, 0, stream>>>(x, p.n, total, packed_rows);
      break;
    case FakeQuantOp::kIdx:
      q_idx_encode_kernel<<<grid, p.threads, 0, stream>>>(x, p.n, total, packed_rows);
      break;
  }
  return last_launch_status("fake_quant_encode");
}

Status run_fake_quant_decode(const FakeQuantPlan& p, const uint8_t* packed_rows, DType out_dtype, void* out,
                             cudaStream_t stream) {
  const int64_t total = p.n * p.rows;
  const unsigned grid = grid_for(total, p.threads);
  const int op = static_cast<int>(p.op);
  if (out_dtype == DType::kF32)
    fake_quant_decode_kernel<<<grid, p.threads, 0, stream>>>(op, packed_rows, p.n, total,
                                                             static_cast<float*>(out));
  else if (out_dtype == DType::kBF16)
    fake_quant_decode_kernel<<<grid, p.threads, 0, stream>>>(op, packed_rows, p.n, total,
                                                             static_cast<__nv_bfloat16*>(out));
  else
    return invalid_argument(std::string("fake_quant_decode: output dtype ") + dtype_name(out_dtype) +
                            " (want F32 or BF16)");
  return last_launch_status("fake_quant_decode");
}

Status run_e4m3_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_elementwise("e4m3_encode", n));
  e4m3_encode_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, codes);
  return last_launch_status("e4m3_encode");
}

Status run_e2m1_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_elementwise("e2m1_encode", n));
  e2m1_encode_kernel<<<grid_for(n, 256), 256, 0, stream>>>(x, n, codes);
  return last_launch_status("e2m1_encode");
}

}  // namespace ds41::cuda
