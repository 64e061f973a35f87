// ds41 backends/cuda: packed KV rows addressed by byte offsets into a pool (MODEL_SPEC 3.9, 5.2):
// gather-decode to float32, encode-scatter from float32, and in-place fake quantization. Bit-exact
// with src/quant (the lane code is fake_quant_device.cuh, shared with fake_quant_kernels.cu).
// One thread per channel; CTAs of 256 threads, rows a multiple of the op's block wide, so a
// quantization block is a (half) warp inside one row.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;

template <int kOp>
__global__ void decode_rows_gather_kernel(const uint8_t* __restrict__ base,
                                          const int64_t* __restrict__ offsets, int64_t n, int64_t total,
                                          float* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= total) return;
  const int64_t r = e / n, i = e % n;
  const int64_t off = offsets[r];
  out[e] = off < 0 ? 0.0f : fq::decode_elem<kOp>(base + off, n, i);
}

template <int kOp>
__global__ void encode_rows_scatter_kernel(const float* __restrict__ x, int64_t n, int64_t total,
                                           uint8_t* __restrict__ base, const int64_t* __restrict__ offsets) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const fq::LaneCode c = fq::encode_lane<kOp>(v);  // every lane: shuffles
  const uint32_t packed = fq::pack_byte<kOp>(c);
  if (!active) return;
  const int64_t r = e / n, i = e % n;
  const int64_t off = offsets[r];
  if (off < 0) return;
  fq::store_lane<kOp>(base + off, n, i, c, packed);
}

// decode(encode(x)) per channel: the code and scale byte decode exactly as the packed row would.
template <int kOp>
__global__ void fake_quant_inplace_kernel(float* __restrict__ x, int64_t total) {
  dev::pdl_enter();
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = e < total;
  const float v = active ? x[e] : 0.0f;
  const fq::LaneCode c = fq::encode_lane<kOp>(v);
  if (active) x[e] = fq::decode_code<kOp>(c.code, c.scale);
}

const char* op_name(FakeQuantOp op) {
  return op == FakeQuantOp::kWin ? "Q_win" : op == FakeQuantOp::kKv ? "Q_kv" : "Q_idx";
}

// Validates the op and shape; *total = m * channels, 0 when there is nothing to do.
Status check_rows(const char* fn, FakeQuantOp op, int64_t channels, int64_t m, int64_t* total) {
  const int iop = static_cast<int>(op);
  if (iop < 0 || iop > 2)
    return invalid_argument(std::string(fn) + ": op " + std::to_string(iop) + " unknown");
  const int64_t block = fq::block_of(iop);
  if (channels <= 0 || channels % block || channels > (int64_t{1} << 24))
    return invalid_argument(std::string(fn) + ": channels " + std::to_string(channels) + " for " +
                            op_name(op) + " must be a positive multiple of " + std::to_string(block) +
                            " (MODEL_SPEC 3.9)");
  if (m < 0) return invalid_argument(std::string(fn) + ": m " + std::to_string(m) + " is negative");
  *total = m * channels;
  if (m > 0 && (*total + kThreads - 1) / kThreads > 0x7fffffff)
    return invalid_argument(std::string(fn) + ": m " + std::to_string(m) + " x channels too large");
  return ok_status();
}

unsigned grid_for(int64_t total) { return static_cast<unsigned>((total + kThreads - 1) / kThreads); }

}  // namespace

Status run_decode_rows_gather(FakeQuantOp op, int64_t channels, const uint8_t* base,
                              const int64_t* row_offsets, int64_t m, float* out, cudaStream_t stream) {
  int64_t total = 0;
  DS41_RETURN_IF_ERROR(check_rows("decode_rows_gather", op, channels, m, &total));
  if (total == 0) return ok_status();
  fq::dispatch_op(static_cast<int>(op), [&]<int kOp>() {
    launch(decode_rows_gather_kernel<kOp>, grid_for(total), kThreads, 0, stream, base, row_offsets, channels, total, out);
  });
  return last_launch_status("decode_rows_gather");
}

Status run_encode_rows_scatter(FakeQuantOp op, int64_t channels, const float* x, int64_t m, uint8_t* base,
                               const int64_t* row_offsets, cudaStream_t stream) {
  int64_t total = 0;
  DS41_RETURN_IF_ERROR(check_rows("encode_rows_scatter", op, channels, m, &total));
  if (total == 0) return ok_status();
  fq::dispatch_op(static_cast<int>(op), [&]<int kOp>() {
    launch(encode_rows_scatter_kernel<kOp>, grid_for(total), kThreads, 0, stream, x, channels, total, base, row_offsets);
  });
  return last_launch_status("encode_rows_scatter");
}

Status run_fake_quant_inplace(FakeQuantOp op, int64_t channels, float* x, int64_t m, cudaStream_t stream) {
  int64_t total = 0;
  DS41_RETURN_IF_ERROR(check_rows("fake_quant_inplace", op, channels, m, &total));
  if (total == 0) return ok_status();
  fq::dispatch_op(static_cast<int>(op), [&]<int kOp>() {
    launch(fake_quant_inplace_kernel<kOp>, grid_for(total), kThreads, 0, stream, x, total);
  });
  return last_launch_status("fake_quant_inplace");
}

}  // namespace ds41::cuda
