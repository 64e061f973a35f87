// ds41 backends/cuda: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) in the one form the FP4 expert GEMM
// uses (expert_gemm_kernels.cu, "The wgmma form"): m64nNk16, f16 x f16 -> f32, A from registers (each warp's
// 16 rows in mma.sync m16n8k16's A fragment layout), B from shared memory in the K-major layout without
// swizzle, D in registers (per warp and column tile of 8: mma.sync m16n8's D fragment).
//
// B's layout (PTX ISA, "Shared Memory Matrix Layout", no swizzle, K-major): core matrices of 8 columns x 16
// bytes (8 K values of one column contiguous, the 8 columns 16 bytes apart: 128 contiguous bytes); within a
// k16 slice the two core matrices of a column group are kLbo = 128 bytes apart (the "leading dimension byte
// offset": K-adjacent core matrices), column groups kSbo = 256 bytes apart (the "stride dimension byte
// offset": N-adjacent). So element (k, n) of a slice lies at (n / 8) 256 + (k / 8) 128 + (n % 8) 16 + (k % 8) 2.
//
// The calls are warpgroup-collective (all 128 threads, converged). mma_async only issues: D is valid after
// commit() and wait<0>() (or wait<N> with N newer groups still pending); the A registers and D must not be
// touched in between (fence_operand and fence_a after the wait keep the compiler from moving their uses across
// it or giving their registers to other values before it). fence() (wgmma.fence)
// comes before the first mma_async after ordinary writes of A or D; fence_proxy_async() after shared
// memory written by ordinary stores or cp.async, before a barrier that publishes it to mma_async (the async
// proxy). Without a device (the host SIMT emulator, scripts/cuda-host-emu) mma_rs computes each lane's D
// with the same arithmetic and summation order as tcg::mma_16816's emulation, synchronously; the fences and
// waits do nothing.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "backends/cuda/tc_frag.cuh"

namespace ds41::cuda::wg {

constexpr int kMaxAcc = 48;             // D floats per thread at N = 96
constexpr uint32_t kLbo = 128, kSbo = 256;  // B's core-matrix offsets (bytes)
// Byte offset of B element (k, n) within a k16 slice.
__host__ __device__ constexpr int b_offset(int k, int n) { return (n >> 3) * 256 + (k >> 3) * 128 + (n & 7) * 16 + (k & 7) * 2; }

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving reads or writes of d across this point (the registers stay put).
__device__ __forceinline__ void fence_operand(float (&d)[kMaxAcc]) {
#pragma unroll
  for (int i = 0; i < kMaxAcc; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The same for A fragments in flight: placed after the wait, it keeps them live (and their registers out of the
// next decode's hands) until the chain that reads them has completed.
template <int Q>
__device__ __forceinline__ void fence_a(uint32_t (&a)[Q][4]) {
#pragma unroll
  for (int q = 0; q < Q; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[q][i])::"memory");
}
// The descriptor of a B slice at shared address b (16-byte aligned): start, LBO, SBO (each >> 4), no swizzle.
__device__ __forceinline__ uint64_t b_desc(const void* b) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(b));
  return static_cast<uint64_t>((s & 0x3ffffu) >> 4) | (static_cast<uint64_t>(kLbo >> 4) << 16) |
         (static_cast<uint64_t>(kSbo >> 4) << 32);
}
template <int N>
__device__ __forceinline__ void mma_rs(float (&d)[kMaxAcc], const uint32_t (&a)[4], uint64_t desc, int scale_d);
// clang-format off
template <>
__device__ __forceinline__ void mma_rs<32>(float (&d)[kMaxAcc], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
template <>
__device__ __forceinline__ void mma_rs<64>(float (&d)[kMaxAcc], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
template <>
__device__ __forceinline__ void mma_rs<96>(float (&d)[kMaxAcc], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
      "{%48, %49, %50, %51}, %52, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// clang-format on
// d (the first N / 2 floats) = (scale_d ? d : 0) + A (64 x 16, this warpgroup's rows) . B (16 x N at b).
template <int N>
__device__ __forceinline__ void mma(float (&d)[kMaxAcc], const uint32_t (&a)[4], const void* b, int scale_d) {
  mma_rs<N>(d, a, b_desc(b), scale_d);
}
#else  // the host SIMT emulator
__device__ __forceinline__ void fence() {}
__device__ __forceinline__ void commit() {}
template <int N>
__device__ __forceinline__ void wait() {}
__device__ __forceinline__ void fence_proxy_async() {}
__device__ __forceinline__ void fence_operand(float (&)[kMaxAcc]) {}
template <int Q>
__device__ __forceinline__ void fence_a(uint32_t (&)[Q][4]) {}
template <int N>
__device__ __forceinline__ void mma(float (&d)[kMaxAcc], const uint32_t (&a)[4], const void* b, int scale_d) {
  const int lane = static_cast<int>(threadIdx.x & 31), r = lane >> 2, g = lane & 3;
  const uint8_t* bb = static_cast<const uint8_t*>(b);
  auto bv = [&](int k, int n) {
    uint16_t h;
    std::memcpy(&h, bb + b_offset(k, n), 2);
    return tcg::part_float<false>(h);
  };
  auto h = [](uint32_t v, int i) { return tcg::part_float<false>(i ? v >> 16 : v); };
  float sum[N / 2] = {};
  for (int gs = 0; gs < 4; ++gs) {  // tcg::mma_16816's order: lane group, then the pair's element
    uint32_t ar[4];
    for (int i = 0; i < 4; ++i) ar[i] = __shfl_sync(0xffffffffu, a[i], 4 * r + gs);
    for (int c = 0; c < N / 8; ++c)
      for (int cc = 0; cc < 2; ++cc) {
        const int n = 8 * c + 2 * g + cc;
        for (int i = 0; i < 2; ++i) {
          const int k0 = 2 * gs + i, k1 = 8 + 2 * gs + i;
          sum[4 * c + cc] += h(ar[0], i) * bv(k0, n) + h(ar[2], i) * bv(k1, n);
          sum[4 * c + 2 + cc] += h(ar[1], i) * bv(k0, n) + h(ar[3], i) * bv(k1, n);
        }
      }
  }
  for (int i = 0; i < N / 2; ++i) d[i] = (scale_d ? d[i] : 0.f) + sum[i];
}
#endif

}  // namespace ds41::cuda::wg
