// ds41 backends/cuda: tc_prep_kernels.h.
#include "backends/cuda/tc_prep_kernels.h"

#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

// The group of row r: the g with off[g] <= r < off[g + 1] (binary search; offsets ascending).
__device__ __forceinline__ void group_of(const int64_t* off, int64_t groups, int64_t rows, int64_t r,
                                         int64_t* begin, int64_t* count) {
  if (off == nullptr) {
    *begin = 0;
    *count = rows;
    return;
  }
  int64_t lo = 0, hi = groups;  // invariant: off[lo] <= r < off[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (off[mid] <= r)
      lo = mid;
    else
      hi = mid;
  }
  *begin = off[lo];
  *count = off[lo + 1] - off[lo];
}

// One block per input row.
__global__ void split3_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                              const int64_t* __restrict__ off, int64_t groups, __nv_bfloat16* __restrict__ out) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  int64_t b = 0, cnt = 0;
  group_of(off, groups, rows, r, &b, &cnt);
  const int64_t i = r - b;
  __nv_bfloat16* o0 = out + (3 * b + i) * cols;
  __nv_bfloat16* o1 = out + (3 * b + cnt + i) * cols;
  __nv_bfloat16* o2 = out + (3 * b + 2 * cnt + i) * cols;
  const float* xr = x + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = xr[c];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    __nv_bfloat16 l = __float2bfloat16_rn(0.0f), l2 = l;
    if (isfinite(v)) {
      const float r1 = v - __bfloat162float(h);  // exact in fp32
      l = __float2bfloat16_rn(r1);
      l2 = __float2bfloat16_rn(r1 - __bfloat162float(l));  // exact in fp32
    }
    o0[c] = h;
    o1[c] = l;
    o2[c] = l2;
  }
}

__global__ void sum3_kernel(const float* __restrict__ y3, int64_t rows, int64_t cols,
                            const int64_t* __restrict__ off, int64_t groups, float* __restrict__ y) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  int64_t b = 0, cnt = 0;
  group_of(off, groups, rows, r, &b, &cnt);
  const int64_t i = r - b;
  const float* a0 = y3 + (3 * b + i) * cols;
  const float* a1 = y3 + (3 * b + cnt + i) * cols;
  const float* a2 = y3 + (3 * b + 2 * cnt + i) * cols;
  float* yr = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = a0[c] + (a1[c] + a2[c]);
}

__device__ __forceinline__ void store32_bf16(__nv_bfloat16* dst, const float* v) {
  // 32 values = 4 x 16 bytes (dst 16-byte aligned: in_dim % 32 == 0 and the buffer is aligned).
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    __nv_bfloat162 p[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = __floats2bfloat162_rn(v[q * 8 + 2 * k], v[q * 8 + 2 * k + 1]);
    *reinterpret_cast<uint4*>(dst + q * 8) = *reinterpret_cast<const uint4*>(p);
  }
}

constexpr int64_t kTile = 32;

// grid (chunks of 32-element row blocks, experts); one thread per 32 elements of a row.
__global__ void experts_dequant_kernel(const DeviceWeight* __restrict__ weights, const int32_t* __restrict__ ids,
                                       int64_t out_dim, int64_t in_dim, __nv_bfloat16* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = blockIdx.y;
  const int64_t nb = in_dim / 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= out_dim * nb) return;
  const DeviceWeight w = weights[ids[e]];
  const int64_t o = idx / nb, blk = idx % nb;
  float v[32];
  if (w.format == quant::WeightFormat::kFp4Rows) {
    const float s = dev::e8m0_decode(w.scale[o * nb + blk]);
    const uint4* p = reinterpret_cast<const uint4*>(w.data + o * (in_dim / 2) + blk * 16);
    uint32_t b[16];
    dev::unpack16(__ldg(p), b);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      v[2 * k] = dev::e2m1_decode(b[k] & 15u) * s;  // low nibble = even element (MODEL_SPEC 7.17)
      v[2 * k + 1] = dev::e2m1_decode(b[k] >> 4) * s;
    }
  } else if (w.format == quant::WeightFormat::kFp8Tiles) {
    const int64_t tiles_in = (in_dim + kTile - 1) / kTile;
    const float s = dev::e8m0_decode(w.scale[(o / kTile) * tiles_in + blk]);
    const uint4* p = reinterpret_cast<const uint4*>(w.data + o * in_dim + blk * 32);
    uint32_t b[2][16];
    dev::unpack16(__ldg(p), b[0]);
    dev::unpack16(__ldg(p + 1), b[1]);
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = dev::e4m3_decode(b[k / 16][k % 16]) * s;
  } else if (w.format == quant::WeightFormat::kBF16) {
    const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(w.data) + o * in_dim + blk * 32;
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = __bfloat162float(p[k]);
  } else {
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = dev::nan_f32();
  }
  store32_bf16(out + (e * out_dim + o) * in_dim + blk * 32, v);
}

Status check_rows(int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols <= 0)
    return invalid_argument(std::string(what) + ": rows " + std::to_string(rows) + " / cols " +
                            std::to_string(cols) + " out of range");
  if (rows > 0x7fffffff) return invalid_argument(std::string(what) + ": more than 2^31 rows");
  return ok_status();
}

}  // namespace

Status run_split3_bf16(const float* x, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                       __nv_bfloat16* out, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows(rows, cols, "split3"));
  if (offsets && groups <= 0) return invalid_argument("split3: groups must be > 0 with offsets");
  if (rows == 0) return ok_status();
  launch(split3_kernel, static_cast<unsigned>(rows), 256, 0, stream, x, rows, cols, offsets, groups, out);
  return last_launch_status("split3_kernel");
}

Status run_sum3(const float* y3, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups, float* y,
                cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows(rows, cols, "sum3"));
  if (offsets && groups <= 0) return invalid_argument("sum3: groups must be > 0 with offsets");
  if (rows == 0) return ok_status();
  launch(sum3_kernel, static_cast<unsigned>(rows), 256, 0, stream, y3, rows, cols, offsets, groups, y);
  return last_launch_status("sum3_kernel");
}

Status run_experts_dequant_bf16(const DeviceWeight* weights, const int32_t* ids, int64_t count, int64_t out_dim,
                                int64_t in_dim, __nv_bfloat16* out, cudaStream_t stream) {
  if (count < 0 || count > 65535)
    return invalid_argument("experts dequant: count " + std::to_string(count) + " outside [0, 65535]");
  if (out_dim <= 0 || in_dim <= 0 || in_dim % 32 != 0)
    return invalid_argument("experts dequant: dims " + std::to_string(out_dim) + " x " + std::to_string(in_dim) +
                            " (in_dim must be a positive multiple of 32)");
  if (count == 0) return ok_status();
  const int64_t items = out_dim * (in_dim / 32);
  const dim3 grid(static_cast<unsigned>((items + 255) / 256), static_cast<unsigned>(count));
  launch(experts_dequant_kernel, grid, 256, 0, stream, weights, ids, out_dim, in_dim, out);
  return last_launch_status("experts_dequant_kernel");
}

}  // namespace ds41::cuda
