// ds41 backends/cuda: in-register decoders of the linear-weight formats (MODEL_SPEC 2.1) used by
// the linear kernels. Each decoder turns V consecutive weights W[o, k .. k+V) into floats with
// the same products as the host reference (quant::weight_format_traits(f).dequant_rows), so the
// dequantized values are bit-identical; only the summation order of the products differs.
//   F32   V=4: one float4            (data 16-byte aligned, in % 4 == 0)
//   BF16  V=4: one 8-byte load       (data 8-byte aligned,  in % 4 == 0)
//   FP8   V=4: one 4-byte load, one E8M0 per 32x32 tile (data 4-byte aligned, in % 4 == 0)
//   FP4   V=8: one 4-byte load (8 nibbles, low nibble = even element), one E8M0 per row per 32
// The Scalar* decoders (V=1) have no alignment or width condition (the fallback path).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/quant_device.cuh"

namespace ds41::cuda::dev {

// One weight matrix as the kernels see it: row o starts at element o * in.
struct WView {
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;
  int64_t in = 0;
};

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }

struct DecF32 {
  static constexpr int V = 4;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(w.data) + ((o * w.in + k) >> 2));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  }
};

struct DecBF16 {
  static constexpr int V = 4;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(w.data) + ((o * w.in + k) >> 2));
    v[0] = bf16_bits_to_f32(q.x & 0xffffu);
    v[1] = bf16_bits_to_f32(q.x >> 16);
    v[2] = bf16_bits_to_f32(q.y & 0xffffu);
    v[3] = bf16_bits_to_f32(q.y >> 16);
  }
};

__device__ __forceinline__ float fp8_tile_scale(const WView& w, int64_t o, int64_t k) {
  const int64_t tiles_in = (w.in + 31) >> 5;
  return e8m0_decode(__ldg(w.scale + (o >> 5) * tiles_in + (k >> 5)));
}

struct DecFp8 {
  static constexpr int V = 4;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    const uint32_t q = __ldg(reinterpret_cast<const unsigned int*>(w.data) + ((o * w.in + k) >> 2));
    const float s = fp8_tile_scale(w, o, k);  // k % 4 == 0: the four values share a tile
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = e4m3_decode((q >> (8 * i)) & 0xffu) * s;
  }
};

struct DecFp4 {
  static constexpr int V = 8;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    const uint32_t q =
        __ldg(reinterpret_cast<const unsigned int*>(w.data) + ((o * (w.in >> 1) + (k >> 1)) >> 2));
    const float s = e8m0_decode(__ldg(w.scale + o * (w.in >> 5) + (k >> 5)));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = e2m1_decode((q >> (4 * i)) & 15u) * s;
  }
};

struct ScalarF32 {
  static constexpr int V = 1;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    v[0] = __ldg(reinterpret_cast<const float*>(w.data) + o * w.in + k);
  }
};

struct ScalarBF16 {
  static constexpr int V = 1;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    v[0] = bf16_bits_to_f32(__ldg(reinterpret_cast<const unsigned short*>(w.data) + o * w.in + k));
  }
};

struct ScalarFp8 {
  static constexpr int V = 1;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    v[0] = e4m3_decode(__ldg(w.data + o * w.in + k)) * fp8_tile_scale(w, o, k);
  }
};

struct ScalarFp4 {
  static constexpr int V = 1;
  __device__ __forceinline__ static void load(const WView& w, int64_t o, int64_t k, float (&v)[V]) {
    const uint32_t b = __ldg(w.data + o * (w.in >> 1) + (k >> 1));
    const float s = e8m0_decode(__ldg(w.scale + o * (w.in >> 5) + (k >> 5)));
    v[0] = e2m1_decode((k & 1) ? (b >> 4) : (b & 15u)) * s;
  }
};

}  // namespace ds41::cuda::dev
