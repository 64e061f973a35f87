// ds41 backends/cuda: fused row kernels of the decode step (fused_rows_kernels.h).
//
// rows_norm_rope_quant: one CTA per row, one thread per channel (blockDim = dim rounded up to 32,
//   dim <= 1024). The row is loaded once; RMSNorm's sum of squares runs in run_rms_norm's order
//   (rms_norm_device.cuh) and scales as rms_norm_kernel does; the RoPE angles are rope_kernel's
//   (float32 angle, float64 sincos rounded to float32) and the pair update its four roundings; the
//   fake quantization is fq::encode_lane per channel as encode_rows_scatter_kernel /
//   fake_quant_inplace_kernel run it (a quantization block is a warp or a half warp of one row, so
//   the blocks are the same). Bit-identical to the unfused sequence; other shapes run it.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rms_norm_device.cuh"

namespace ds41::cuda {
namespace {

constexpr int64_t kMaxRowDim = 1024;

// kOp: fq::kWin / kKv / kIdx, or -1 (no quantization).
template <int kOp>
__global__ void __launch_bounds__(kMaxRowDim)
    rows_norm_rope_quant_kernel(RowsNormRopeQuantArgs a, int sum_threads) {
  dev::pdl_enter();
  __shared__ float row[kMaxRowDim];
  __shared__ float cs[kMaxRowDim];
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x, dim = a.dim;
  const int t = threadIdx.x;
  const bool active = t < dim;
  float v = active ? a.in[r * dim + t] : 0.0f;
  if (a.norm) {
    if (active) row[t] = v;
    __syncthreads();
    const float inv = dev::rms_inv_like_rms_norm([&](int64_t i) { return row[i]; }, dim, sum_threads, a.eps, scratch);
    if (active) {
      v = __fmul_rn(v, inv) * (a.norm_weight ? a.norm_weight[t] : 1.0f);
      if (a.normed) a.normed[r * dim + t] = v;
    }
  }
  if (a.n_freq > 0) {
    __syncthreads();  // the norm's reads of row[] are done
    if (active) row[t] = v;
    const float p = static_cast<float>(a.pos[r / a.rows_per_pos]);
    for (int64_t i = t; i < a.n_freq; i += blockDim.x) {
      const float ang = __fmul_rn(p, a.inv_freq[i]);
      double s, c;
      sincos(static_cast<double>(ang), &s, &c);
      cs[2 * i] = static_cast<float>(c);
      const float sf = static_cast<float>(s);
      cs[2 * i + 1] = a.inverse ? -sf : sf;
    }
    __syncthreads();
    const int64_t off = dim - 2 * a.n_freq;
    if (active && t >= off) {
      const int64_t q = (t - off) >> 1;
      const float e = row[off + 2 * q], o = row[off + 2 * q + 1], c = cs[2 * q], s = cs[2 * q + 1];
      v = ((t - off) & 1) == 0 ? __fsub_rn(__fmul_rn(e, c), __fmul_rn(o, s))
                               : __fadd_rn(__fmul_rn(e, s), __fmul_rn(o, c));
    }
  }
  if constexpr (kOp >= 0) {
    const fq::LaneCode c = fq::encode_lane<kOp>(v);  // every lane: shuffles
    const uint32_t packed = fq::pack_byte<kOp>(c);
    if (active && a.offsets) {
      const int64_t off = a.offsets[r];
      if (off >= 0) fq::store_lane<kOp>(a.base + off, dim, t, c, packed);
    }
    if (a.quant_inplace) v = fq::decode_code<kOp>(c.code, c.scale);
  }
  if (active && a.out) a.out[r * dim + t] = v;
}

Status bad(const std::string& what) { return invalid_argument("rows_norm_rope_quant: " + what); }

// The unfused sequence (shapes the kernel does not take).
Status unfused(const RowsNormRopeQuantArgs& a, cudaStream_t s) {
  const int64_t n = a.rows;
  float* x = a.out;
  if (!x) return bad("shape without a fused kernel needs out");
  if (a.norm) {
    DS41_RETURN_IF_ERROR(run_rms_norm(a.in, n, a.dim, a.norm_weight, a.eps, a.normed ? a.normed : x, s));
    if (a.normed)
      DS41_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(x, a.normed, static_cast<size_t>(n * a.dim) * sizeof(float),
                                                       cudaMemcpyDeviceToDevice, s),
                                       "rows_norm_rope_quant copy"));
  } else if (a.in != x) {
    DS41_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(x, a.in, static_cast<size_t>(n * a.dim) * sizeof(float), cudaMemcpyDeviceToDevice, s),
        "rows_norm_rope_quant copy"));
  }
  if (a.n_freq > 0)
    DS41_RETURN_IF_ERROR(run_rope(x, n / a.rows_per_pos, a.rows_per_pos, a.dim, a.pos, a.inv_freq, a.n_freq,
                                  a.inverse, s));
  if (a.quant && a.offsets) DS41_RETURN_IF_ERROR(run_encode_rows_scatter(a.op, a.dim, x, n, a.base, a.offsets, s));
  if (a.quant && a.quant_inplace) DS41_RETURN_IF_ERROR(run_fake_quant_inplace(a.op, a.dim, x, n, s));
  return ok_status();
}

}  // namespace

Status run_rows_norm_rope_quant(const RowsNormRopeQuantArgs& a, cudaStream_t stream) {
  if (a.rows < 0 || a.rows > 0x7fffffff) return bad("rows " + std::to_string(a.rows) + " out of range");
  if (a.dim <= 0) return bad("dim must be positive");
  if (a.rows_per_pos <= 0 || a.rows % a.rows_per_pos) return bad("rows not a multiple of rows_per_pos");
  if (a.n_freq < 0 || 2 * a.n_freq > a.dim) return bad("n_freq " + std::to_string(a.n_freq) + " > dim / 2");
  if (a.n_freq > 0 && (!a.pos || !a.inv_freq)) return bad("rope without pos / inv_freq");
  if (!a.in) return bad("in is null");
  if (a.quant) {
    const int64_t block = fq::block_of(static_cast<int>(a.op));
    if (a.dim % block) return bad("dim not a multiple of the quantization block");
    if (a.offsets && !a.base) return bad("offsets without base");
  }
  if (a.rows == 0) return ok_status();
  if (a.dim > kMaxRowDim) return unfused(a, stream);
  const int threads = static_cast<int>((a.dim + 31) / 32 * 32);
  const int sum_threads = rms_norm_sum_threads(a.rows, a.dim);
  const dim3 grid(static_cast<unsigned>(a.rows));
  if (!a.quant) {
    launch(rows_norm_rope_quant_kernel<-1>, grid, dim3(threads), 0, stream, a, sum_threads);
  } else {
    fq::dispatch_op(static_cast<int>(a.op), [&]<int kOp>() {
      launch(rows_norm_rope_quant_kernel<kOp>, grid, dim3(threads), 0, stream, a, sum_threads);
    });
  }
  return last_launch_status("rows_norm_rope_quant");
}

}  // namespace ds41::cuda
