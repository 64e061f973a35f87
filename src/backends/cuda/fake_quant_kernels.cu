// ds41 backends/cuda: Q_win / Q_kv / Q_idx kernels (MODEL_SPEC 3.9) and packed-row decoders
// (MODEL_SPEC 5.2) over contiguous rows. The per-lane device code (one thread per channel, block
// maxima by shuffles, nibble pairs joined by one shuffle) is in fake_quant_device.cuh, shared with
// kv_rows_kernels.cu. Every lane of a warp takes part in the shuffles (no early return).
#include <cfloat>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/fake_quant_kernels.h"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

// One thread per channel; threads is a multiple of 32 and n of the op's block, so a quantization
// block never straddles a warp or a CTA (fake_quant_device.cuh).
template <int kOp>
__global__ void fake_quant_encode_kernel(const float* __restrict__ x, int64_t n, int64_t total,
                                         uint8_t* __restrict__ rows) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const fq::LaneCode c = fq::encode_lane<kOp>(v);
  const uint32_t packed = fq::pack_byte<kOp>(c);
  if (!active) return;
  const int64_t r = e / n, i = e % n;
  fq::store_lane<kOp>(rows + r * fq::row_bytes(kOp, n), n, i, c, packed);
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

template <int kOp, typename T>
__global__ void fake_quant_decode_kernel(const uint8_t* __restrict__ rows, int64_t n, int64_t total,
                                         T* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t r = e / n, i = e % n;
  put<T>(out, e, fq::decode_elem<kOp>(rows + r * fq::row_bytes(kOp, n), n, i));
}

__global__ void e4m3_encode_kernel(const float* __restrict__ x, int64_t n, uint8_t* __restrict__ codes) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) codes[e] = static_cast<uint8_t>(dev::e4m3_encode(x[e]));
}
__global__ void e2m1_encode_kernel(const float* __restrict__ x, int64_t n, uint8_t* __restrict__ codes) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) codes[e] = static_cast<uint8_t>(dev::e2m1_encode(x[e]));
}

// One warp per 32-value block of a row (blocks_per_row = ceil(k / 32)); lanes past k take 0, which
// leaves the block maximum of the row's values (the short last block's own scale).
__global__ void act_quant_rows_kernel(const float* x, int64_t k, int64_t blocks_per_row, int64_t total_blocks,
                                      float* out) {
  dev::pdl_enter();
  const int64_t blk = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (blk >= total_blocks) return;  // whole warps: blk is the same on every lane of a warp
  const int64_t r = blk / blocks_per_row, i = (blk % blocks_per_row) * 32 + (threadIdx.x & 31);
  const bool in = i < k;
  const float v = in ? x[r * k + i] : 0.0f;
  const fq::LaneCode c = fq::encode_lane<fq::kWin>(v);
  if (in) out[r * k + i] = fq::decode_code<fq::kWin>(c.code, c.scale);
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
  fq::dispatch_op(static_cast<int>(p.op), [&]<int kOp>() {
    launch(fake_quant_encode_kernel<kOp>, grid, p.threads, 0, stream, x, p.n, total, packed_rows);
  });
  return last_launch_status("fake_quant_encode");
}

Status run_fake_quant_decode(const FakeQuantPlan& p, const uint8_t* packed_rows, DType out_dtype, void* out,
                             cudaStream_t stream) {
  const int64_t total = p.n * p.rows;
  const unsigned grid = grid_for(total, p.threads);
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16)
    return invalid_argument(std::string("fake_quant_decode: output dtype ") + dtype_name(out_dtype) +
                            " (want F32 or BF16)");
  fq::dispatch_op(static_cast<int>(p.op), [&]<int kOp>() {
    if (out_dtype == DType::kF32)
      launch(fake_quant_decode_kernel<kOp, float>, grid, p.threads, 0, stream, packed_rows, p.n, total, static_cast<float*>(out));
    else
      launch(fake_quant_decode_kernel<kOp, __nv_bfloat16>, grid, p.threads, 0, stream, packed_rows, p.n, total, static_cast<__nv_bfloat16*>(out));
  });
  return last_launch_status("fake_quant_decode");
}

Status run_act_quant_rows(const float* x, int64_t rows, int64_t k, float* out, cudaStream_t stream) {
  if (rows < 0 || k <= 0 || k > (int64_t{1} << 24))
    return invalid_argument("act_quant_rows: " + std::to_string(rows) + " rows of " + std::to_string(k) +
                            " values out of range");
  if (rows == 0) return ok_status();
  const int64_t bpr = (k + 31) / 32, total = rows * bpr;
  DS41_RETURN_IF_ERROR(check_elementwise("act_quant_rows", total * 32));
  launch(act_quant_rows_kernel, grid_for(total * 32, 256), 256, 0, stream, x, k, bpr, total, out);
  return last_launch_status("act_quant_rows");
}

Status run_e4m3_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_elementwise("e4m3_encode", n));
  launch(e4m3_encode_kernel, grid_for(n, 256), 256, 0, stream, x, n, codes);
  return last_launch_status("e4m3_encode");
}

Status run_e2m1_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_elementwise("e2m1_encode", n));
  launch(e2m1_encode_kernel, grid_for(n, 256), 256, 0, stream, x, n, codes);
  return last_launch_status("e2m1_encode");
}

}  // namespace ds41::cuda
