// ds41 backends/cuda: full attention within segments (dense_attention_kernels.h). One CTA per
// (64 query rows, head, segment); every thread owns one query row: q and the output accumulator in
// registers, the segment's keys and values streamed through shared memory in tiles of 32 rows,
// an online softmax per tile (the tile's scores kept in registers, one rescale per tile). The CPU
// op (src/backends/cpu/cpu_vision_ops.cpp) takes the row max first and sums exp in float64; here
// scores are the same float32 products (s = float(q . k) * scale) and exp / sums are float32 in
// another order, so outputs agree to a few float32 ulps of the output scale (the parity table's
// bound). Not a tensor-core kernel: at the released widths (head 64, <= 9216 patches per image)
// the tower's linears dominate for typical images (docs/vision.md "GPU tower").
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/dense_attention_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kQ = 64;  // query rows (threads) per CTA
constexpr int kT = 32;  // key rows per shared-memory tile

template <int HD>
__global__ void __launch_bounds__(kQ)
    dense_attention_kernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, int64_t ld, const int64_t* __restrict__ seg,
                           int64_t heads, int64_t hd, float scale, float* __restrict__ out) {
  dev::pdl_enter();
  constexpr int V4 = HD / 4;
  __shared__ float4 ks[kT][V4];
  __shared__ float4 vs[kT][V4];
  const int64_t h = blockIdx.y, s = blockIdx.z;
  const int64_t b = seg[s], L = seg[s + 1] - b;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kQ;
  if (q0 >= L) return;  // uniform over the CTA
  const int64_t r = q0 + threadIdx.x;
  const bool active = r < L;
  float4 qv[V4], acc[V4];
#pragma unroll
  for (int i = 0; i < V4; ++i) {
    float e[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t ch = 4 * i + c;
      e[c] = active && ch < hd ? q[(b + r) * ld + h * hd + ch] : 0.0f;
    }
    qv[i] = make_float4(e[0], e[1], e[2], e[3]);
    acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = 0; k0 < L; k0 += kT) {
    __syncthreads();  // the previous tile is no longer read
    for (int e = threadIdx.x; e < kT * HD; e += kQ) {
      const int j = e / HD, ch = e % HD;
      float kk = 0.0f, vv = 0.0f;
      if (k0 + j < L && ch < hd) {
        const int64_t at = (b + k0 + j) * ld + h * hd + ch;
        kk = k[at];
        vv = v[at];
      }
      reinterpret_cast<float*>(&ks[j][0])[ch] = kk;
      reinterpret_cast<float*>(&vs[j][0])[ch] = vv;
    }
    __syncthreads();
    if (!active) continue;
    const int64_t cnt = L - k0 < kT ? L - k0 : kT;
    float sc[kT];
    float tmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < V4; ++i) {
        const float4 kk = ks[j][i];
        d = __fmaf_rn(qv[i].x, kk.x, d);
        d = __fmaf_rn(qv[i].y, kk.y, d);
        d = __fmaf_rn(qv[i].z, kk.z, d);
        d = __fmaf_rn(qv[i].w, kk.w, d);
      }
      sc[j] = j < cnt ? __fmul_rn(d, scale) : -INFINITY;
      tmax = fmaxf(tmax, sc[j]);
    }
    const float mn = fmaxf(m, tmax);
    const float corr = expf(m - mn);  // 0 on the first tile (m = -inf)
    l = __fmul_rn(l, corr);
#pragma unroll
    for (int i = 0; i < V4; ++i) {
      acc[i].x = __fmul_rn(acc[i].x, corr);
      acc[i].y = __fmul_rn(acc[i].y, corr);
      acc[i].z = __fmul_rn(acc[i].z, corr);
      acc[i].w = __fmul_rn(acc[i].w, corr);
    }
    m = mn;
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      const float p = expf(sc[j] - m);  // 0 for the padding rows (-inf)
      l = __fadd_rn(l, p);
#pragma unroll
      for (int i = 0; i < V4; ++i) {
        const float4 vv = vs[j][i];
        acc[i].x = __fmaf_rn(p, vv.x, acc[i].x);
        acc[i].y = __fmaf_rn(p, vv.y, acc[i].y);
        acc[i].z = __fmaf_rn(p, vv.z, acc[i].z);
        acc[i].w = __fmaf_rn(p, vv.w, acc[i].w);
      }
    }
  }
  if (!active) return;
  float* o = out + ((b + r) * heads + h) * hd;
#pragma unroll
  for (int i = 0; i < V4; ++i) {
    const float e[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (4 * i + c < hd) o[4 * i + c] = __fdiv_rn(e[c], l);
  }
}

}  // namespace

Status run_dense_attention(const DenseAttentionDeviceArgs& a, cudaStream_t stream) {
  const std::string fn = "dense_attention: ";
  if (a.n < 0 || a.n_heads <= 0 || a.n_heads > 65535 || a.head_dim <= 0 || a.head_dim > 128)
    return invalid_argument(fn + "n " + std::to_string(a.n) + ", heads " + std::to_string(a.n_heads) +
                            ", head_dim " + std::to_string(a.head_dim) +
                            " (want heads <= 65535, head_dim <= 128)");
  if (a.n_segs < 0 || a.n_segs > 65535 || a.max_seg_rows < 0)
    return invalid_argument(fn + std::to_string(a.n_segs) + " segments (at most 65535), max_seg_rows " +
                            std::to_string(a.max_seg_rows));
  const int64_t ld = a.ld_in > 0 ? a.ld_in : a.n_heads * a.head_dim;
  if (ld < a.n_heads * a.head_dim)
    return invalid_argument(fn + "row stride " + std::to_string(ld) + " < heads * head_dim");
  if (!a.q || !a.k || !a.v || !a.out || !a.seg_offsets) return invalid_argument(fn + "null pointer");
  if (a.n == 0 || a.n_segs == 0 || a.max_seg_rows == 0) return ok_status();
  const int64_t tiles = (a.max_seg_rows + kQ - 1) / kQ;
  if (tiles > 0x7fffffff) return invalid_argument(fn + "max_seg_rows out of range");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.n_heads),
                  static_cast<unsigned>(a.n_segs));
  if (a.head_dim <= 32)
    launch(dense_attention_kernel<32>, grid, kQ, 0, stream, a.q, a.k, a.v, ld, a.seg_offsets, a.n_heads, a.head_dim, a.scale, a.out);
  else if (a.head_dim <= 64)
    launch(dense_attention_kernel<64>, grid, kQ, 0, stream, a.q, a.k, a.v, ld, a.seg_offsets, a.n_heads, a.head_dim, a.scale, a.out);
  else
    launch(dense_attention_kernel<128>, grid, kQ, 0, stream, a.q, a.k, a.v, ld, a.seg_offsets, a.n_heads, a.head_dim, a.scale, a.out);
  return last_launch_status("dense_attention");
}

}  // namespace ds41::cuda
