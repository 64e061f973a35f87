// ds41 backends/cuda: the device half of run_rows_norm_rope_quant (fused_rows_kernels.h): one row's
// RMSNorm -> RoPE -> fake quantization by one block, one thread per channel, shared by
// rows_norm_rope_quant_kernel (fused_rows_kernels.cu) and the window KV step (gx_step_kernels.cu
// run_window_kv_step). The row is loaded once; RMSNorm's sum of squares runs in run_rms_norm's order
// (rms_norm_device.cuh, whatever the block size) and scales as rms_norm_kernel does; the RoPE angles
// are rope_kernel's (float32 angle, float64 sincos rounded to float32) and the pair update its four
// roundings; the fake quantization is fq::encode_lane per channel as encode_rows_scatter_kernel /
// fake_quant_inplace_kernel run it (a quantization block is a warp or a half warp of one row, so the
// blocks are the same). Bit-identical to the unfused sequence.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/rms_norm_device.cuh"
#include "backends/cuda/rope_table.cuh"

namespace ds41::cuda::dev {

constexpr int64_t kMaxNormRopeRowDim = 1024;  // channels of a row: one thread each

// Row r of `a` by this block (blockDim.x a multiple of 32 and >= a.dim; every thread calls it: barriers).
// kOp: fq::kWin / kKv / kIdx, or -1 (no quantization). Shared memory: row and cs of
// kMaxNormRopeRowDim floats, scratch of 32 doubles.
// wait(): called once, before anything an earlier kernel wrote is read (the kernels pass their PDL wait).
// Before it: the thread's norm weight and the rotation table (positions from the step plan's upload,
// inv_freq a weight: written by no kernel of the step, launch.h contract 1), so their loads and the fp64
// sincos overlap the previous kernel's tail instead of following the row's norm. The same values reach
// the same operations: the same bits.
template <int kOp, class Wait>
__device__ __forceinline__ void norm_rope_quant_row(const RowsNormRopeQuantArgs& a, int sum_threads, int64_t r,
                                                    float* row, float* cs, double* scratch, Wait&& wait) {
  const int64_t dim = a.dim;
  const int t = threadIdx.x;
  const bool active = t < dim;
  const float nw = (a.norm && active && a.norm_weight) ? a.norm_weight[t] : 1.0f;
  if (a.n_freq > 0)  // cs is read after the barriers below
    rope_table_fill(static_cast<float>(a.pos[r / a.rows_per_pos]), a.inv_freq, a.n_freq, a.inverse, cs, t,
                    blockDim.x);
  wait();
  float v = active ? a.in[r * dim + t] : 0.0f;
  if (a.norm) {
    if (active) row[t] = v;
    __syncthreads();
    const float inv = rms_inv_like_rms_norm([&](int64_t i) { return row[i]; }, dim, sum_threads, a.eps, scratch);
    if (active) {
      v = __fmul_rn(v, inv) * nw;
      if (a.normed) a.normed[r * dim + t] = v;
    }
  }
  if (a.n_freq > 0) {
    __syncthreads();  // the norm's reads of row[] are done
    if (active) row[t] = v;
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

}  // namespace ds41::cuda::dev
