// ds41 backends/cuda: 16-byte decoders of the linear-weight formats (MODEL_SPEC 2.1) for the
// streaming GEMV (decode, linear_kernels.cu). Each decoder turns one 16-byte chunk of a W row (kV
// consecutive weights, the chunk 16-byte aligned) into floats bit-identical to the host reference
// (quant::weight_format_traits(f).dequant_rows): the scale multiply is the same single float
// product of the same two exact values. Cheap paths, all exact:
//   F32   kV=4 : the floats.
//   BF16  kV=8 : bits << 16.
//   FP8   kV=16: hardware E4M3x2 -> f16x2 (exact: every E4M3 value is an f16), f16 -> f32 (exact),
//                times the E8M0 tile scale (one rounding, as the host).
//   FP4   kV=32: nibble pairs (i, i+4) of a 32-bit word -> f16x2 by bit moves: code s|e1 e0|m placed
//                as f16 bits s.000e1e0m.000000000 is the E2M1 value times 2^-14 for normals and the
//                subnormal 0.5 alike; f16 -> f32, then one multiply by 2^14 * scale (a power of two:
//                one rounding of the exact product value * scale, as the host) when 2^14 * scale is
//                a float (E8M0 <= 240, or NaN); otherwise times 2^14 (exact), then the scale.
// The chunk's float4 groups of x sit swizzled in shared memory (xs_slot) so the 32 lanes of a
// warp, each on its own chunk, read x without bank conflicts.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/linear_decode.cuh"
#include "backends/cuda/quant_device.cuh"

namespace ds41::cuda::dev {

// One 16-byte load that bypasses L1 allocation (the weights are streamed once).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
#if defined(__CUDA_ARCH__)
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
#else
  return *reinterpret_cast<const uint4*>(p);
#endif
}

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(h & 0xffffu);
  raw.y = static_cast<unsigned short>(h >> 16);
  return __half22float2(__half2(raw));
}

// f16x2 bits times 2^14 (exact for the E2M1 values: |value| <= 6).
__device__ __forceinline__ uint32_t f16x2_times_2p14(uint32_t h) {
  __half2_raw raw;
  raw.x = static_cast<unsigned short>(h & 0xffffu);
  raw.y = static_cast<unsigned short>(h >> 16);
  __half2_raw k;
  k.x = k.y = 0x7400u;  // 2^14
  const __half2_raw r = __hmul2(__half2(raw), __half2(k));
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}

// Float4 slot of group q (< G = kV / 4) of chunk c in the staged x: 8 consecutive chunks of a
// quarter warp land on 8 distinct 16-byte bank groups.
template <int G>
__device__ __forceinline__ int xs_slot(int c, int q) {
  if constexpr (G == 1) {
    return c;
  } else {
    constexpr int sh = G == 2 ? 2 : (G == 4 ? 1 : 0);
    return G * c + (q ^ ((c >> sh) & (G - 1)));
  }
}

// Decoder interface: kV weights per 16-byte chunk, decoded kStep (4 or 8) at a time: step t of a
// chunk gives weights [t * kStep, (t + 1) * kStep) of it from the chunk and its scale value
// (scale_byte(scale_row(w, o), chunk) loaded with the chunk, scale() once per chunk). Steps are small so the kernel keeps few decoded values live.
struct WideF32 {
  static constexpr int kV = 4, kStep = 4;
  static constexpr int kBytesNum = 4, kBytesDen = 1;  // bytes per weight
  __device__ __forceinline__ static const uint8_t* scale_row(const WView& w, int64_t) { return w.data; }
  __device__ __forceinline__ static uint32_t scale_byte(const uint8_t*, int64_t) { return 0; }
  __device__ __forceinline__ static uint32_t scale(uint32_t) { return 0; }
  template <int t>
  __device__ __forceinline__ static void step(const uint4& q, uint32_t, float (&v)[kStep]) {
    v[0] = __uint_as_float(q.x);
    v[1] = __uint_as_float(q.y);
    v[2] = __uint_as_float(q.z);
    v[3] = __uint_as_float(q.w);
  }
};

__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : (i == 1 ? q.y : (i == 2 ? q.z : q.w));
}

struct WideBF16 {
  static constexpr int kV = 8, kStep = 4;
  static constexpr int kBytesNum = 2, kBytesDen = 1;
  __device__ __forceinline__ static const uint8_t* scale_row(const WView& w, int64_t) { return w.data; }
  __device__ __forceinline__ static uint32_t scale_byte(const uint8_t*, int64_t) { return 0; }
  __device__ __forceinline__ static uint32_t scale(uint32_t) { return 0; }
  template <int t>
  __device__ __forceinline__ static void step(const uint4& q, uint32_t, float (&v)[kStep]) {
    const uint32_t a = word_of(q, 2 * t), b = word_of(q, 2 * t + 1);
    v[0] = __uint_as_float(a << 16);
    v[1] = __uint_as_float(a & 0xffff0000u);
    v[2] = __uint_as_float(b << 16);
    v[3] = __uint_as_float(b & 0xffff0000u);
  }
};

struct WideFp8 {
  static constexpr int kV = 16, kStep = 4;
  static constexpr int kBytesNum = 1, kBytesDen = 1;
  // The scales of row o; chunk c (16 weights) lies in one 32 x 32 tile: scale c / 2 of the row.
  __device__ __forceinline__ static const uint8_t* scale_row(const WView& w, int64_t o) {
    return w.scale + (o >> 5) * ((w.in + 31) >> 5);
  }
  __device__ __forceinline__ static uint32_t scale_byte(const uint8_t* srow, int64_t c) { return __ldg(srow + (c >> 1)); }
  // The scale as float bits (the host's E8M0 value).
  __device__ __forceinline__ static uint32_t scale(uint32_t sb) { return __float_as_uint(e8m0_decode(sb)); }
  template <int t>
  __device__ __forceinline__ static void step(const uint4& q, uint32_t sbits, float (&v)[kStep]) {
    const float s = __uint_as_float(sbits);
    const uint32_t w = word_of(q, t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw r =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>((w >> (16 * h)) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(__half2(r));
      v[2 * h] = f.x * s;
      v[2 * h + 1] = f.y * s;
    }
  }
};

struct WideFp4 {
  static constexpr int kV = 32, kStep = 8;
  static constexpr int kBytesNum = 1, kBytesDen = 2;
  // One scale per chunk (32 weights).
  __device__ __forceinline__ static const uint8_t* scale_row(const WView& w, int64_t o) {
    return w.scale + o * (w.in >> 5);
  }
  __device__ __forceinline__ static uint32_t scale_byte(const uint8_t* srow, int64_t c) { return __ldg(srow + c); }
  // Nibbles i and i + 4 of w (i < 4) as f16x2 bits (value * 2^-14 each).
  template <int i>
  __device__ __forceinline__ static uint32_t pair(uint32_t w) {
    const uint32_t sg = w << (12 - 4 * i);  // bit 4i+3 -> 15
    const uint32_t mg = i < 3 ? (w << (9 - 4 * i)) : (w >> 3);  // bits 4i..4i+2 -> 9..11
    return (sg & 0x80008000u) | (mg & 0x0e000e00u);
  }
  // The multiplier of the f16 values: 2^14 * scale when that is a float (E8M0 <= 240) or NaN (255),
  // one rounding of the exact product as the host; for E8M0 241..254 the f16 values are first
  // multiplied by 2^14 in f16 (exact: |value| <= 6) and the multiplier is the scale itself.
  __device__ __forceinline__ static uint32_t scale(uint32_t sb) {
    if (sb == 255u) return __float_as_uint(nan_f32());
    return sb <= 240u ? (sb + 14u) << 23 : (sb << 23) | 1u;  // bit 0: the f16 pre-multiply (stripped)
  }
  template <int t>
  __device__ __forceinline__ static void step(const uint4& q, uint32_t mbits, float (&v)[kStep]) {
    const uint32_t w = word_of(q, t);
    const float m = __uint_as_float(mbits & ~1u);
    const bool pre = (mbits & 1u) != 0u;  // (NaN: 0x7fc00000)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t p = i == 0 ? pair<0>(w) : (i == 1 ? pair<1>(w) : (i == 2 ? pair<2>(w) : pair<3>(w)));
      if (pre) p = f16x2_times_2p14(p);
      const float2 f = half2_bits_to_float2(p);
      v[i] = f.x * m;
      v[i + 4] = f.y * m;
    }
  }
};

}  // namespace ds41::cuda::dev
