// ds41 backends/cuda: tensor-core building blocks shared by the mma.sync kernels over bf16 operands
// (sparse_attention_tc_kernels.cu, indexer_tc_kernels.cu): bf16 rounding and the exact three-part
// split of a float, mma.sync m16n8k16 (bf16 x bf16 -> f32), swizzled shared-memory rows and ldmatrix.
// Without a device (the host SIMT emulator, scripts/cuda-host-emu) the mma and ldmatrix are emulated
// with the same arithmetic through plain loads and warp shuffles.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace ds41::cuda::dev {

constexpr unsigned kFullMask = 0xffffffffu;

// Round-to-nearest-even float -> bf16 bits (finite inputs; the device instruction does the same).
__device__ __forceinline__ uint32_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_value(uint32_t b) {
  const uint32_t u = b << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Two floats as bf16x2 (lo in the low half: the element with the smaller index).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return bf16_bits(lo) | (bf16_bits(hi) << 16);
#endif
}
// x = p0 + p1 + p2 exactly (bf16 parts, each the rounding of the remainder).
__device__ __forceinline__ void split3(float x, float& p0, float& p1, float& p2) {
  p0 = bf16_value(bf16_bits(x));
  const float r1 = x - p0;
  p1 = bf16_value(bf16_bits(r1));
  p2 = r1 - p1;  // exact in bf16 up to subnormal underflow (rounded by the pack)
}

// mma.sync m16n8k16, bf16 inputs, f32 accumulation (fragments as in tc_gemv_kernels.cu).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  const int lane = static_cast<int>(threadIdx.x & 31), r = lane >> 2, g = lane & 3;
  auto h = [](uint32_t v, int i) { return bf16_value(i ? v >> 16 : v & 0xffffu); };
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
  for (int gs = 0; gs < 4; ++gs) {
    uint32_t ar[4], bc[2][2];
    for (int i = 0; i < 4; ++i) ar[i] = __shfl_sync(kFullMask, a[i], 4 * r + gs);
    for (int c = 0; c < 2; ++c) {
      bc[c][0] = __shfl_sync(kFullMask, b0, 4 * (2 * g + c) + gs);
      bc[c][1] = __shfl_sync(kFullMask, b1, 4 * (2 * g + c) + gs);
    }
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i) {
        sum[c] += h(ar[0], i) * h(bc[c][0], i) + h(ar[2], i) * h(bc[c][1], i);
        sum[2 + c] += h(ar[1], i) * h(bc[c][0], i) + h(ar[3], i) * h(bc[c][1], i);
      }
  }
  for (int i = 0; i < 4; ++i) d[i] += sum[i];
#endif
}

// Shared bf16 matrix with rows of `cols` bf16 (cols % 8 == 0), 16-byte chunks swizzled.
__device__ __forceinline__ uint32_t swz(int row, int col, int cols) {
  const int chunk = (col >> 3) ^ (row & 7);
  return static_cast<uint32_t>(row * cols + chunk * 8 + (col & 7));  // element index
}

// ldmatrix x4 (optionally .trans) of four 8 x 8 bf16 matrices of `m` (rows of `cols` bf16): matrix
// i (0..3) has its 8 rows at row 8 * bit kRowBit of i, its 8 columns at col + 8 * the other bit.
// r[i] gets the thread's fragment of matrix i.
template <bool kTrans, int kRowBit>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* m, int cols, int col) {
  const int lane = static_cast<int>(threadIdx.x & 31);
#if defined(__CUDA_ARCH__)
  const int i = lane >> 3;
  const int row = 8 * ((i >> kRowBit) & 1) + (lane & 7), c = col + 8 * ((i >> (1 - kRowBit)) & 1);
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(m + swz(row, c, cols)));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#else
  for (int i = 0; i < 4; ++i) {
    const int row0 = 8 * ((i >> kRowBit) & 1), col0 = col + 8 * ((i >> (1 - kRowBit)) & 1);
    if constexpr (kTrans) {  // elements (row 2(l%4), col l/4) and (row 2(l%4)+1, col l/4)
      const int rr = row0 + 2 * (lane & 3), cc = col0 + (lane >> 2);
      r[i] = static_cast<uint32_t>(m[swz(rr, cc, cols)]) | (static_cast<uint32_t>(m[swz(rr + 1, cc, cols)]) << 16);
    } else {  // elements (row l/4, cols 2(l%4), 2(l%4)+1)
      const int rr = row0 + (lane >> 2), cc = col0 + 2 * (lane & 3);
      r[i] = static_cast<uint32_t>(m[swz(rr, cc, cols)]) | (static_cast<uint32_t>(m[swz(rr, cc + 1, cols)]) << 16);
    }
  }
#endif
}

}  // namespace ds41::cuda::dev
