// ds41 backends/cuda: the tensor-core fragments shared by the decode GEMV (tc_gemv_kernels.cu) and the
// prefill FP4 expert GEMM (expert_gemm_kernels.cu): x's 16-bit parts, mma.sync m16n8k16 with fp32
// accumulation, the E8M0 scale window of the fast path, and E2M1 codes decoded into f16 A fragments.
// The numerics they carry are documented at the top of tc_gemv_kernels.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::tcg {

// mma.sync m16n8k16, f16 inputs, f32 accumulation: d += A (16 x 16) . B (16 x 8). Fragments (PTX
// ISA, "mma.m16n8k16"): a[0] = rows r, k (2g, 2g+1); a[1] = rows r + 8, same k; a[2] = rows r,
// k (8+2g, 9+2g); a[3] = rows r + 8, same; b0 = k (2g, 2g+1), b1 = k (8+2g, 9+2g), column r;
// d[0..1] = row r, columns (2g, 2g+1); d[2..3] = row r + 8. kBf: the same with bf16 inputs (BF16
// weights). Without a device (the host SIMT emulator) the same arithmetic through warp shuffles.
// The 16-bit parts of x: f16 (FP8 / FP4 weights, decoded to f16) or bf16 (BF16 weights as they are).
template <bool kBf>
__host__ __device__ __forceinline__ float part_float(uint32_t bits) {
  if constexpr (kBf) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(bits & 0xffffu);
    return __bfloat162float(__nv_bfloat16(raw));
  } else {
    __half_raw raw;
    raw.x = static_cast<unsigned short>(bits & 0xffffu);
    return __half2float(__half(raw));
  }
}
template <bool kBf>
__device__ __forceinline__ uint32_t part_bits(float v) {  // round to nearest even
  if constexpr (kBf) {
    return __nv_bfloat16_raw(__float2bfloat16_rn(v)).x;
  } else {
    return __half_raw(__float2half_rn(v)).x;
  }
}

template <bool kBf>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
// One instruction text per input type T (a string literal: "f16" or "bf16").
#define DS41_TCG_MMA(T)                                                                                   \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
               "{%8, %9}, {%0, %1, %2, %3};"                                                              \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                           \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (kBf) {
    DS41_TCG_MMA("bf16");
  } else {
    DS41_TCG_MMA("f16");
  }
#undef DS41_TCG_MMA
#else
  const int lane = static_cast<int>(threadIdx.x & 31), r = lane >> 2, g = lane & 3;
  auto h = [](uint32_t v, int i) { return part_float<kBf>(i ? v >> 16 : v); };
  float sum[4] = {0.f, 0.f, 0.f, 0.f};
  for (int gs = 0; gs < 4; ++gs) {
    uint32_t ar[4], bc[2][2];
    for (int i = 0; i < 4; ++i) ar[i] = __shfl_sync(0xffffffffu, a[i], 4 * r + gs);
    for (int c = 0; c < 2; ++c) {
      bc[c][0] = __shfl_sync(0xffffffffu, b0, 4 * (2 * g + c) + gs);
      bc[c][1] = __shfl_sync(0xffffffffu, b1, 4 * (2 * g + c) + gs);
    }
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 2; ++i) {  // k = 2gs + i and 8 + 2gs + i
        sum[c] += h(ar[0], i) * h(bc[c][0], i) + h(ar[2], i) * h(bc[c][1], i);
        sum[2 + c] += h(ar[1], i) * h(bc[c][0], i) + h(ar[3], i) * h(bc[c][1], i);
      }
  }
  for (int i = 0; i < 4; ++i) d[i] += sum[i];
#endif
}


// The fast path's scale window: a tile whose E8M0 scale byte sb is in [64, 191] multiplies its
// mma sum by 2^(sb - 127), a normal float in [2^-63, 2^64], into the accumulator; x's power of two
// 2^(e + kExp) is applied once, to the finished output (WarpTask::run, block_rows). In that window no
// dequantized weight overflows (max |E4M3| 448 * 2^64 < 2^73), no partial sum overflows (|x'| < 2^15,
// K <= 2^16: < 2^105) and no nonzero product leaves the normal floats (>= 2^-24 * 2^-15 * 2^-63), so
// the accumulator holds y * 2^-(e + kExp) with the bits the former per-tile multiplier 2^(sb - 127 + e)
// gave (an fma's rounding does not see a power-of-two scale of all its operands): the window depends
// on the weight alone, not on x. Any other byte (NaN 255 included) sends its tile to exact_tile.
constexpr uint32_t kFastScaleLo = 64, kFastScaleSpan = 127;
__host__ __device__ __forceinline__ bool scale_fast(uint32_t sb) { return sb - kFastScaleLo <= kFastScaleSpan; }
// All four bytes of v in the window: a byte b = 128 h + l is in [64, 191] iff bit 7 of h XOR (l + 64)
// is set (l + 64 < 256: no carry between bytes).
__host__ __device__ __forceinline__ bool scale_word_fast(uint32_t v) {
  return ((v ^ ((v & 0x7f7f7f7fu) + 0x40404040u)) & 0x80808080u) == 0x80808080u;
}


// E2M1 codes into f16 A fragments. From a row's word of 8 codes (code j = bits 4j .. 4j + 3, K offset
// 8g + j): f16x2 pairs of codes (i, i + 4), i = 0..3, each code as the f16 bits s.000e1e0m.000000000
// (the E2M1 value times 2^-14, subnormal 0.5 included; as WideFp4::pair). First every byte's two
// codes become the high bytes of their f16 (s << 7 | e1e0m << 1): xe from the even codes (low
// nibbles), xo from the odd ones; then a byte permute with zero low bytes picks each pair: codes
// (0, 4) = xe bytes 0, 2; (2, 6) = xe bytes 1, 3; (1, 5), (3, 7) from xo. 11 instructions per 8
// codes where the per-pair shifts and masks took 16; the same fragments, bit for bit.
__device__ __forceinline__ uint32_t fp4_pick(uint32_t v, bool hi) {  // bytes 0, 2 (hi: 1, 3) into bytes 1, 3
#if defined(__CUDA_ARCH__)
  return __byte_perm(v, 0u, hi ? 0x3414u : 0x2404u);
#else
  return hi ? (v & 0xff00ff00u) : ((v << 8) & 0xff00ff00u);
#endif
}
__device__ __forceinline__ void fp4_row_pairs(uint32_t w, uint32_t (&p)[4]) {
  const uint32_t xe = ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu);
  const uint32_t xo = (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu);
  p[0] = fp4_pick(xe, false);
  p[1] = fp4_pick(xo, false);
  p[2] = fp4_pick(xe, true);
  p[3] = fp4_pick(xo, true);
}
// The K offset in a lane group's 8 (past 8g) of B slot s (0..3) of mma m (slots 0, 1 = b0's halves,
// 2, 3 = b1's) for fp4_row_pairs' fragments: a0 = (pa[0], pb[0], pa[1], pb[1]), a1 = the pairs 2, 3.
__host__ __device__ constexpr int fp4_kofs(int m, int s) { return 2 * m + ((s & 1) ? 4 : 0) + (s >> 1); }

// x staged for the mma's B operand (the decode GEMV's stage_x, the FP4 expert GEMM's split): a row's
// exponent e = ilogb(max |x|) - 14 (subnormal maxima included; 0 for zero, inf or NaN, which propagate), in
// [-163, 113], so that x' = x 2^-e has its largest |x'| in [2^14, 2^15).
__device__ __forceinline__ int stage_exponent(float max_abs) {
  return (max_abs > 0.f && isfinite(max_abs)) ? ilogbf(max_abs) - 14 : 0;
}
// 2^-e as one or two exact power-of-two factors (2^-e up to 2^163): x' = x * f0 * f1.
__device__ __forceinline__ void stage_factors(int e, float& f0, float& f1) {
  const int a = min(-e, 127), b = -e - a;
  f0 = __uint_as_float(static_cast<uint32_t>(127 + a) << 23);
  f1 = __uint_as_float(static_cast<uint32_t>(127 + b) << 23);
}
// A lane group's 8 values of x' (f, in K order) as its B fragments: out[m][p] = (b0, b1) of mma m and part p
// (hi = the 16-bit rounding of x', lo = of the rest, lo2 = of the rest of that; the differences are exact in
// fp32), slot s of mma m holding f[Order::kofs(m, s)].
template <bool kBf, class Order>
__device__ __forceinline__ void stage_fragments(const float (&f)[8], uint2 (&out)[2][3]) {
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    uint32_t h[3][4];
#pragma unroll
    for (int sl = 0; sl < 4; ++sl) {
      const float val = f[Order::kofs(m, sl)];
      const uint32_t p0 = part_bits<kBf>(val);
      const float r1 = val - part_float<kBf>(p0);
      const uint32_t p1 = part_bits<kBf>(r1);
      h[0][sl] = p0;
      h[1][sl] = p1;
      h[2][sl] = part_bits<kBf>(r1 - part_float<kBf>(p1));
    }
#pragma unroll
    for (int p = 0; p < 3; ++p) out[m][p] = make_uint2(h[p][0] | (h[p][1] << 16), h[p][2] | (h[p][3] << 16));
  }
}

}  // namespace ds41::cuda::tcg
