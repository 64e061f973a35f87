// ds41 backends/cuda: device-side scalar codecs of the quant formats (MODEL_SPEC 2.1, 3.9),
// bit-compatible with src/quant (checked by tests/parity/cuda). Decoders build the float from
// its bit fields (exact); the E4M3 encoder uses the hardware cvt.rn.satfinite (sm_89+), the
// E2M1 encoder compares against the midpoints (no FP4 cvt before sm_100).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace ds41::cuda::dev {

__device__ __forceinline__ float nan_f32() { return __uint_as_float(0x7fc00000u); }

// The 16 bytes of a uint4 load, little-endian, one per entry (payload bytes in memory order).
__device__ __forceinline__ void unpack16(uint4 raw, uint32_t (&b)[16]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 16; ++k) b[k] = (words[k / 4] >> (8 * (k % 4))) & 0xffu;
}

// E4M3 FN byte -> float (0x7f/0xff NaN). Subnormals m * 2^-9, normals (1 + m/8) * 2^(e-7).
__device__ __forceinline__ float e4m3_decode(uint32_t b) {
  uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15u && m == 7u) return nan_f32();
  if (e == 0u)
    v = static_cast<float>(m) * 0x1p-9f;
  else
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}

// E8M0 byte -> 2^(b-127); 0xff is NaN; b = 0 is the float subnormal 2^-127.
__device__ __forceinline__ float e8m0_decode(uint32_t b) {
  if (b == 255u) return nan_f32();
  if (b == 0u) return __uint_as_float(0x00400000u);
  return __uint_as_float(b << 23);
}

// E2M1 nibble -> float: e = bits 1..2, m = bit 0; e == 0: m/2, else (1 + m/2) * 2^(e-1).
__device__ __forceinline__ float e2m1_decode(uint32_t code) {
  uint32_t e = (code >> 1) & 3u, m = code & 1u;
  float v = e == 0u ? (m ? 0.5f : 0.0f) : __uint_as_float(((e + 126u) << 23) | (m << 22));
  return (code & 8u) ? -v : v;
}

// Float -> E4M3 FN, round to nearest even, |x| >= 448 and inf saturate, NaN -> 0x7f, sign of
// zero and of underflow kept (same contract as quant::e4m3_from_float).
__device__ __forceinline__ uint32_t e4m3_encode(float x) {
  if (isnan(x)) return 0x7fu;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
#else
  uint32_t sign = (__float_as_uint(x) >> 24) & 0x80u;
  float a = fabsf(x);
  if (a >= 448.0f) return sign | 0x7eu;
  uint32_t code;
  if (a < 0x1p-6f) {
    code = static_cast<uint32_t>(__float2int_rn(a * 512.0f));
  } else {
    uint32_t u = __float_as_uint(a);
    uint32_t e = (u >> 23) - 127u + 7u, mant = u & 0x7fffffu;
    uint32_t m = mant >> 20, rest = mant & 0xfffffu;
    code = (e << 3) + m;
    if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) ++code;
    if (code > 0x7eu) code = 0x7eu;
  }
  return sign | code;
#endif
}

// Float -> E2M1 code: nearest, ties to the even code (0.25->0, 0.75->1, 1.25->1, 1.75->2,
// 2.5->2, 3.5->4, 5->4), |x| > 6 saturates, NaN -> +0, sign kept (-0 allowed).
__device__ __forceinline__ uint32_t e2m1_encode(float x) {
  if (isnan(x)) return 0u;
  uint32_t sign = (__float_as_uint(x) >> 28) & 8u;
  float a = fabsf(x);
  uint32_t c = a <= 0.25f   ? 0u
               : a < 0.75f  ? 1u
               : a <= 1.25f ? 2u
               : a < 1.75f  ? 3u
               : a <= 2.5f  ? 4u
               : a < 3.5f   ? 5u
               : a <= 5.0f  ? 6u
                            : 7u;
  return sign | c;
}

// pow2ceil exponent of MODEL_SPEC 3.9 from the bit pattern of a positive normal float.
__device__ __forceinline__ int pow2ceil_exponent(float t) {
  uint32_t u = __float_as_uint(t);
  return static_cast<int>((u >> 23) & 0xffu) - 127 + ((u & 0x7fffffu) ? 1 : 0);
}

// 2^k for k in [-126, 127] (normal floats only).
__device__ __forceinline__ float exp2_int(int k) {
  return __uint_as_float(static_cast<uint32_t>(k + 127) << 23);
}

// The CPU clamp (NaN passes through unchanged).
__device__ __forceinline__ float clamp_keep_nan(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace ds41::cuda::dev
