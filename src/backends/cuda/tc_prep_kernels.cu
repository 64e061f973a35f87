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
                                         int64_t* begin, int64_t* count, int64_t* index = nullptr) {
  if (off == nullptr) {
    *begin = 0;
    *count = rows;
    if (index) *index = 0;
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
  if (index) *index = lo;
}

// One block per input row.
__global__ void split3_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                              const int64_t* __restrict__ off, int64_t groups, __nv_bfloat16* __restrict__ out,
                              const int64_t* __restrict__ rows_of) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  int64_t b = 0, cnt = 0;
  group_of(off, groups, rows, r, &b, &cnt);
  const int64_t i = r - b;
  __nv_bfloat16* o0 = out + (3 * b + i) * cols;
  __nv_bfloat16* o1 = out + (3 * b + cnt + i) * cols;
  __nv_bfloat16* o2 = out + (3 * b + 2 * cnt + i) * cols;
  const float* xr = x + (rows_of ? rows_of[r] : r) * cols;
  auto part3 = [](float v, __nv_bfloat16* h, __nv_bfloat16* l, __nv_bfloat16* l2) {
    *h = __float2bfloat16_rn(v);
    *l = __float2bfloat16_rn(0.0f);
    *l2 = *l;
    if (isfinite(v)) {
      const float r1 = v - __bfloat162float(*h);  // exact in fp32
      *l = __float2bfloat16_rn(r1);
      *l2 = __float2bfloat16_rn(r1 - __bfloat162float(*l));  // exact in fp32
    }
  };
  // Four columns per thread (16-byte loads, 8-byte stores) where the rows allow it; the same
  // per-element arithmetic as the scalar loop.
  int64_t c0 = 0;
  if (cols % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0 && (reinterpret_cast<uintptr_t>(out) & 7u) == 0) {
    for (int64_t c = 4 * threadIdx.x; c < cols; c += 4 * blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(xr + c);
      const float vv[4] = {v.x, v.y, v.z, v.w};
      __nv_bfloat16 h[4], l[4], l2[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) part3(vv[q], &h[q], &l[q], &l2[q]);
      *reinterpret_cast<uint2*>(o0 + c) = *reinterpret_cast<const uint2*>(h);
      *reinterpret_cast<uint2*>(o1 + c) = *reinterpret_cast<const uint2*>(l);
      *reinterpret_cast<uint2*>(o2 + c) = *reinterpret_cast<const uint2*>(l2);
    }
    c0 = cols;
  }
  for (int64_t c = c0 + threadIdx.x; c < cols; c += blockDim.x) {
    __nv_bfloat16 h, l, l2;
    part3(xr[c], &h, &l, &l2);
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
  int64_t c0 = 0;
  if (cols % 4 == 0 && (reinterpret_cast<uintptr_t>(y3) & 15u) == 0 && (reinterpret_cast<uintptr_t>(y) & 15u) == 0) {
    for (int64_t c = 4 * threadIdx.x; c < cols; c += 4 * blockDim.x) {  // the same sums, 16 bytes a load
      const float4 u = *reinterpret_cast<const float4*>(a0 + c), v = *reinterpret_cast<const float4*>(a1 + c),
                   w = *reinterpret_cast<const float4*>(a2 + c);
      *reinterpret_cast<float4*>(yr + c) =
          make_float4(u.x + (v.x + w.x), u.y + (v.y + w.y), u.z + (v.z + w.z), u.w + (v.w + w.w));
    }
    c0 = cols;
  }
  for (int64_t c = c0 + threadIdx.x; c < cols; c += blockDim.x) yr[c] = a0[c] + (a1[c] + a2[c]);
}

__device__ __forceinline__ __nv_bfloat162 pack2(float a, float b, const __nv_bfloat16*) {
  return __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ __half2 pack2(float a, float b, const __half*) { return __floats2half2_rn(a, b); }

// 32 values rounded to T (bfloat16 or fp16) = 4 x 16 bytes (dst 16-byte aligned: in_dim % 32 == 0
// and the buffer is aligned).
// The 16-byte chunk q (values 8 q .. 8 q + 7) of 32 values rounded to T.
template <typename T>
__device__ __forceinline__ uint4 pack8(const float* v, int q, const T* tag) {
  decltype(pack2(0.0f, 0.0f, tag)) p[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) p[k] = pack2(v[q * 8 + 2 * k], v[q * 8 + 2 * k + 1], tag);
  return *reinterpret_cast<const uint4*>(p);
}

template <typename T>
__device__ __forceinline__ void store32(T* dst, const float* v) {
#pragma unroll
  for (int q = 0; q < 4; ++q) *reinterpret_cast<uint4*>(dst + q * 8) = pack8(v, q, dst);
}

constexpr int64_t kTile = 32;

// The E8M0 scale byte of row o, block blk of an FP4-row (one per 32 of a row) or FP8-tile (one per
// 32 x 32 tile) weight; in_dim % 32 == 0.
__device__ __forceinline__ uint32_t scale_byte(const DeviceWeight& w, int64_t o, int64_t blk) {
  const int64_t nb = w.in_dim / 32;
  return w.format == quant::WeightFormat::kFp4Rows ? w.scale[o * nb + blk] : w.scale[(o / kTile) * nb + blk];
}

// 32 values of row o, block blk of an FP4-row or FP8-tile weight, each code's value times s.
__device__ __forceinline__ void decode32(const DeviceWeight& w, int64_t o, int64_t blk, float s, float (&v)[32]) {
  const int64_t in_dim = w.in_dim;
  if (w.format == quant::WeightFormat::kFp4Rows) {
    const uint4* p = reinterpret_cast<const uint4*>(w.data + o * (in_dim / 2) + blk * 16);
    uint32_t b[16];
    dev::unpack16(__ldg(p), b);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      v[2 * k] = dev::e2m1_decode(b[k] & 15u) * s;  // low nibble = even element (MODEL_SPEC 7.17)
      v[2 * k + 1] = dev::e2m1_decode(b[k] >> 4) * s;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(w.data + o * in_dim + blk * 32);
    uint32_t b[2][16];
    dev::unpack16(__ldg(p), b[0]);
    dev::unpack16(__ldg(p + 1), b[1]);
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = dev::e4m3_decode(b[k / 16][k % 16]) * s;
  }
}

// grid (chunks of 32-element row blocks, experts); one thread per 32 elements of a row. A block's
// items are consecutive 32-element blocks of one expert's rows, so its output is one contiguous
// range: the 64 bytes of each thread go through shared memory and leave as consecutive 16-byte
// stores (a warp's store instruction covering 512 contiguous bytes instead of 32 half sectors).
constexpr int kDequantThreads = 256;
__global__ void __launch_bounds__(kDequantThreads)
    experts_dequant_kernel(const DeviceWeight* __restrict__ weights, const int32_t* __restrict__ ids,
                           int64_t out_dim, int64_t in_dim, __nv_bfloat16* __restrict__ out) {
  dev::pdl_enter();
  __shared__ uint4 stage[kDequantThreads * 4];
  const int64_t e = blockIdx.y;
  const int64_t nb = in_dim / 32, items = out_dim * nb;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kDequantThreads;
  const int64_t idx = first + threadIdx.x;
  if (idx < items) {
    const DeviceWeight w = weights[ids[e]];
    const int64_t o = idx / nb, blk = idx % nb;
    float v[32];
    if (w.format == quant::WeightFormat::kFp4Rows || w.format == quant::WeightFormat::kFp8Tiles) {
      decode32(w, o, blk, dev::e8m0_decode(scale_byte(w, o, blk)), v);
    } else if (w.format == quant::WeightFormat::kBF16) {
      const __nv_bfloat16* p = reinterpret_cast<const __nv_bfloat16*>(w.data) + o * in_dim + blk * 32;
#pragma unroll
      for (int k = 0; k < 32; ++k) v[k] = __bfloat162float(p[k]);
    } else {
#pragma unroll
      for (int k = 0; k < 32; ++k) v[k] = dev::nan_f32();
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) stage[threadIdx.x * 4 + q] = pack8(v, q, out);
  }
  __syncthreads();
  const int64_t chunks = 4 * min(static_cast<int64_t>(kDequantThreads), items - first);
  uint4* dst = reinterpret_cast<uint4*>(out + (e * out_dim * nb + first) * 32);
  for (int64_t k = threadIdx.x; k < chunks; k += kDequantThreads) dst[k] = stage[k];
}

// ---- The two-part fp16 split (tc_prep_kernels.h) ----

constexpr int kSplitThreads = 256;

// One block per input row: the row's max |x| (finite values), tau, then the two parts.
__global__ void split2_f16_kernel(const float* __restrict__ x, int64_t rows, int64_t cols,
                                  const int64_t* __restrict__ off, int64_t groups, __half* __restrict__ out,
                                  int32_t* __restrict__ row_shift, const int64_t* __restrict__ rows_of) {
  dev::pdl_enter();
  __shared__ float red[kSplitThreads / 32];
  const int64_t r = blockIdx.x;
  int64_t b = 0, cnt = 0;
  group_of(off, groups, rows, r, &b, &cnt);
  const int64_t i = r - b;
  const float* xr = x + (rows_of ? rows_of[r] : r) * cols;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float a = fabsf(xr[c]);
    if (a <= 3.402823466e38f) m = fmaxf(m, a);  // finite only
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red[0];
#pragma unroll
  for (int w = 1; w < kSplitThreads / 32; ++w) m = fmaxf(m, red[w]);
  int tau = 0;
  if (m > 0.0f) {
    int e = 0;
    frexpf(m, &e);  // m = f 2^e, f in [0.5, 1): m 2^(15 - e) in [2^14, 2^15)
    tau = 15 - e;
  }
  if (threadIdx.x == 0) row_shift[r] = tau;
  __half* o0 = out + (2 * b + i) * cols;
  __half* o1 = out + (2 * b + cnt + i) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = scalbnf(xr[c], tau);  // exact: |v| < 2^15 (finite), no value leaves fp32's range downward
    const __half h = __float2half_rn(v);  // that fp16 could hold
    __half l = __float2half_rn(0.0f);
    if (isfinite(v)) l = __float2half_rn(v - __half2float(h));  // the difference is exact in fp32
    o0[c] = h;
    o1[c] = l;
  }
}

__global__ void sum2_scaled_kernel(const float* __restrict__ y2, int64_t rows, int64_t cols,
                                   const int64_t* __restrict__ off, int64_t groups,
                                   const int32_t* __restrict__ row_shift, const int32_t* __restrict__ group_shift,
                                   float* __restrict__ y) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  int64_t b = 0, cnt = 0, g = 0;
  group_of(off, groups, rows, r, &b, &cnt, &g);
  const int64_t i = r - b;
  const float* a0 = y2 + (2 * b + i) * cols;
  const float* a1 = y2 + (2 * b + cnt + i) * cols;
  const int tau = row_shift[r];
  const int32_t* sig = group_shift + g * ((cols + 31) / 32);  // the group's bands of 32 columns
  float* yr = y + r * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = scalbnf(a0[c] + a1[c], -(tau + sig[c / 32]));
}

// sigma of one band of 32 output rows (a row of FP8 tiles; 32 FP4 rows): its largest finite E8M0
// scale byte puts the band's max |w| at 448 2^7 (FP8) or 6 2^13 (FP4). The band's scales are one
// contiguous range. One warp per band.
__device__ int band_shift(const DeviceWeight& w, int64_t band) {
  const bool fp4 = w.format == quant::WeightFormat::kFp4Rows;
  const int64_t nb = w.in_dim / 32;
  int64_t b0, b1;
  if (fp4) {
    b0 = band * 32 * nb;
    b1 = min(band * 32 + 32, w.out_dim) * nb;
  } else {
    b0 = band * nb;
    b1 = b0 + nb;
  }
  int smax = -1;
  for (int64_t j = b0 + (threadIdx.x & 31); j < b1; j += 32) {
    const int s = w.scale[j];
    if (s != 255) smax = max(smax, s);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, o));
  if (smax < 0) return 0;  // no finite scale: every value of the band is NaN
  return (fp4 ? 13 : 7) - (smax - 127);
}

// grid (ceil(bands / 8), weights), 8 warps per block, a warp per band: shifts[slot * bands + band]
// = sigma (slot = ids[blockIdx.y], or 0 for a dense weight).
__global__ void band_shift_kernel(DeviceWeight dense, const DeviceWeight* __restrict__ weights,
                                  const int32_t* __restrict__ ids, int32_t* __restrict__ shifts) {
  dev::pdl_enter();
  const int32_t slot = ids ? ids[blockIdx.y] : 0;
  const DeviceWeight w = ids ? weights[slot] : dense;
  const int64_t bands = (w.out_dim + 31) / 32;
  const int64_t band = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (band >= bands) return;
  const int sigma = band_shift(w, band);
  if ((threadIdx.x & 31) == 0) shifts[slot * bands + band] = sigma;
}

// 2^k as a float multiplier (exact); 0 below fp32's normal range (such values are far under fp16's
// smallest subnormal), NaN for a NaN scale.
__device__ __forceinline__ float pow2_mult(uint32_t scale_byte, int sigma) {
  if (scale_byte == 255u) return dev::nan_f32();
  const int k = static_cast<int>(scale_byte) - 127 + sigma;
  if (k < -126) return 0.0f;
  return __uint_as_float(static_cast<uint32_t>(k + 127) << 23);
}

// grid (chunks of 32-element row blocks, weights); one thread per 32 elements of a row. Dense:
// ids null, the weight by value, its bands' sigmas at shifts[0 ..).
__global__ void dequant_f16_kernel(DeviceWeight dense, const DeviceWeight* __restrict__ weights,
                                   const int32_t* __restrict__ ids, int64_t out_dim, int64_t in_dim,
                                   const int32_t* __restrict__ shifts, __half* __restrict__ out) {
  dev::pdl_enter();
  const int64_t e = blockIdx.y;
  const int64_t nb = in_dim / 32;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= out_dim * nb) return;
  const int32_t slot = ids ? ids[e] : 0;
  const DeviceWeight w = ids ? weights[slot] : dense;
  const int64_t o = idx / nb, blk = idx % nb;
  float v[32];
  // f16_split_supported: FP4 rows or FP8 tiles only.
  decode32(w, o, blk, pow2_mult(scale_byte(w, o, blk), shifts[slot * ((out_dim + 31) / 32) + o / 32]), v);
  store32(out + (e * out_dim + o) * in_dim + blk * 32, v);
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
                       __nv_bfloat16* out, cudaStream_t stream, const int64_t* rows_of) {
  DS41_RETURN_IF_ERROR(check_rows(rows, cols, "split3"));
  if (offsets && groups <= 0) return invalid_argument("split3: groups must be > 0 with offsets");
  if (rows == 0) return ok_status();
  launch(split3_kernel, static_cast<unsigned>(rows), 256, 0, stream, x, rows, cols, offsets, groups, out, rows_of);
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
  const dim3 grid(static_cast<unsigned>((items + kDequantThreads - 1) / kDequantThreads),
                  static_cast<unsigned>(count));
  launch(experts_dequant_kernel, grid, kDequantThreads, 0, stream, weights, ids, out_dim, in_dim, out);
  return last_launch_status("experts_dequant_kernel");
}

bool f16_split_supported(const DeviceWeight& w) {
  return (w.format == quant::WeightFormat::kFp8Tiles || w.format == quant::WeightFormat::kFp4Rows) &&
         w.in_dim > 0 && w.out_dim > 0 && w.in_dim % 32 == 0 && w.data && w.scale &&
         (reinterpret_cast<uintptr_t>(w.data) & 15u) == 0;
}

Status run_split2_f16(const float* x, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                      __half* out, int32_t* row_shift, cudaStream_t stream, const int64_t* rows_of) {
  DS41_RETURN_IF_ERROR(check_rows(rows, cols, "split2"));
  if (offsets && groups <= 0) return invalid_argument("split2: groups must be > 0 with offsets");
  if (rows == 0) return ok_status();
  launch(split2_f16_kernel, static_cast<unsigned>(rows), kSplitThreads, 0, stream, x, rows, cols, offsets, groups,
         out, row_shift, rows_of);
  return last_launch_status("split2_f16_kernel");
}

Status run_sum2_scaled(const float* y2, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                       const int32_t* row_shift, const int32_t* group_shift, float* y, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows(rows, cols, "sum2"));
  if (offsets && groups <= 0) return invalid_argument("sum2: groups must be > 0 with offsets");
  if (rows == 0) return ok_status();
  launch(sum2_scaled_kernel, static_cast<unsigned>(rows), 256, 0, stream, y2, rows, cols, offsets, groups,
         row_shift, group_shift, y);
  return last_launch_status("sum2_scaled_kernel");
}

Status run_weight_dequant_f16(const DeviceWeight& w, __half* out, int32_t* shift, cudaStream_t stream) {
  if (!f16_split_supported(w))
    return invalid_argument("fp16 weight decode: needs FP8 tiles or FP4 rows with in_dim % 32 == 0 (got " +
                            std::to_string(w.out_dim) + " x " + std::to_string(w.in_dim) +
                            ") and a 16-byte aligned payload");
  const int64_t bands = (w.out_dim + 31) / 32;
  launch(band_shift_kernel, dim3(static_cast<unsigned>((bands + 7) / 8), 1u), 256, 0, stream, w,
         static_cast<const DeviceWeight*>(nullptr), static_cast<const int32_t*>(nullptr), shift);
  DS41_RETURN_IF_ERROR(last_launch_status("band_shift_kernel"));
  const int64_t items = w.out_dim * (w.in_dim / 32);
  launch(dequant_f16_kernel, dim3(static_cast<unsigned>((items + 255) / 256), 1u), 256, 0, stream, w,
         static_cast<const DeviceWeight*>(nullptr), static_cast<const int32_t*>(nullptr), w.out_dim, w.in_dim,
         static_cast<const int32_t*>(shift), out);
  return last_launch_status("dequant_f16_kernel");
}

Status run_experts_dequant_f16(const DeviceWeight* weights, const int32_t* ids, int64_t count, int64_t out_dim,
                               int64_t in_dim, __half* out, int32_t* shifts, cudaStream_t stream) {
  if (count < 0 || count > 65535)
    return invalid_argument("experts dequant (fp16): count " + std::to_string(count) + " outside [0, 65535]");
  if (out_dim <= 0 || in_dim <= 0 || in_dim % 32 != 0)
    return invalid_argument("experts dequant (fp16): dims " + std::to_string(out_dim) + " x " +
                            std::to_string(in_dim) + " (in_dim must be a positive multiple of 32)");
  if (count == 0) return ok_status();
  const int64_t bands = (out_dim + 31) / 32;
  launch(band_shift_kernel, dim3(static_cast<unsigned>((bands + 7) / 8), static_cast<unsigned>(count)), 256, 0,
         stream, DeviceWeight{}, weights, ids, shifts);
  DS41_RETURN_IF_ERROR(last_launch_status("band_shift_kernel"));
  const int64_t items = out_dim * (in_dim / 32);
  const dim3 grid(static_cast<unsigned>((items + 255) / 256), static_cast<unsigned>(count));
  launch(dequant_f16_kernel, grid, 256, 0, stream, DeviceWeight{}, weights, ids, out_dim, in_dim,
         static_cast<const int32_t*>(shifts), out);
  return last_launch_status("dequant_f16_kernel");
}

}  // namespace ds41::cuda
