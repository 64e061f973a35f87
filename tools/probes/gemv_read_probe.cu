// ds41 tools/probes/gemv_read_probe.cu — a standalone probe (not built by CMake): how fast can a
// one-row GEMV's weight stream be read on this GPU with the read patterns the tensor-core GEMV could
// use, with no arithmetic (the bytes are folded into a checksum): (a) the kernel's per-lane register
// ring (8-byte pieces of rows r and r + 8, U in flight), (b) 16-byte pieces, (c) cp.async.bulk row
// chunks into a per-warp shared-memory ring completing on mbarriers; split-K so every shape fills
// the GPU; a copy-read roofline in the same run. Results: docs/perf/README.md (session of
// 2026-12-05 09:19 UTC).
//   nvcc -arch=sm_90 -O3 -std=c++17 tools/probes/gemv_read_probe.cu -o /tmp/gemv_probe && /tmp/gemv_probe
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cstdlib>
#include <type_traits>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

struct Shape { const char* name; int64_t rows, row_bytes; };

__device__ __forceinline__ uint2 ldnc8(const uint8_t* p) {
  uint2 v; asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p)); return v;
}
__device__ __forceinline__ uint4 ldnc16(const uint8_t* p) {
  uint4 v; asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v;
}

__device__ __forceinline__ uint2 ld_piece(const uint8_t* p, uint2) { return ldnc8(p); }
__device__ __forceinline__ uint4 ld_piece(const uint8_t* p, uint4) { return ldnc16(p); }
__device__ __forceinline__ uint32_t fold(uint2 a, uint2 b) { return a.x + a.y * 3 + b.x * 5 + b.y; }
__device__ __forceinline__ uint32_t fold(uint4 a, uint4 b) {
  return a.x + a.y * 3 + a.z + a.w * 7 + b.x * 5 + b.y + b.z + b.w;
}

// tasks: (row group of 16, K split ks of KS); warps loop over tasks. PIECE bytes per lane and row.
template <int U, int PIECE>
__global__ void __launch_bounds__(256) reg_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t rb, int KS, uint32_t* out) {
  using P = std::conditional_t<PIECE == 8, uint2, uint4>;
  const int lane = threadIdx.x & 31, r = lane >> 2, g = lane & 3;
  const int64_t warp = (blockIdx.x * 256 + threadIdx.x) >> 5, nwarps = (gridDim.x * 256) >> 5;
  const int64_t groups = rows / 16, tasks = groups * KS;
  constexpr int STEP = 4 * PIECE;  // bytes of a row per step
  const int64_t steps_all = rb / STEP;
  uint32_t acc = 0;
  for (int64_t t = warp; t < tasks; t += nwarps) {
    const int64_t rg = t / KS, ks = t % KS;
    const int64_t s0 = steps_all * ks / KS, s1 = steps_all * (ks + 1) / KS, n = s1 - s0;
    const uint8_t* pa = w + (rg * 16 + r) * rb + s0 * STEP + PIECE * g;
    const uint8_t* pb = pa + 8 * rb;
    P qa[U], qb[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < n) {
        qa[u] = ld_piece(pa + u * STEP, P{});
        qb[u] = ld_piece(pb + u * STEP, P{});
      }
    for (int64_t k = 0; k < n; k += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (k + u < n) {
          acc ^= fold(qa[u], qb[u]);
          if (k + u + U < n) {
            qa[u] = ld_piece(pa + (k + u + U) * STEP, P{});
            qb[u] = ld_piece(pb + (k + u + U) * STEP, P{});
          }
        }
      }
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ unsigned sa(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned cnt) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sa(b)), "r"(cnt)); }
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sa(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}" :: "r"(sa(b)), "r"(parity) : "memory");
}

// Per warp: S stages of 16 rows x C bytes (row stride C + 16 in shared memory); lane 0 issues a
// stage's 16 bulk copies (one per row) on the stage's mbarrier.
template <int S, int C>
__global__ void bulk_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t rb, int KS, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int RS = C + 16, STAGE = 16 * RS;
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, r = lane >> 2, g = lane & 3;
  const int wpb = blockDim.x >> 5;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem) + wib * S;
  uint8_t* ring = smem + 8 * S * wpb + 128 + wib * S * STAGE;
  ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ring) + 127) & ~uintptr_t(127));
  if (lane == 0) for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  const int64_t warp = blockIdx.x * wpb + wib, nwarps = gridDim.x * wpb;
  const int64_t groups = rows / 16, tasks = groups * KS;
  const int64_t chunks_all = rb / C;
  uint32_t acc = 0;
  uint32_t phase = 0;
  int64_t issued_total = 0;  // running stage index across tasks
  for (int64_t t = warp; t < tasks; t += nwarps) {
    const int64_t rg = t / KS, ks = t % KS;
    const int64_t c0 = chunks_all * ks / KS, c1 = chunks_all * (ks + 1) / KS, n = c1 - c0;
    const uint8_t* base = w + rg * 16 * rb + c0 * C;
    // prologue
    for (int u = 0; u < S && u < n; ++u) {
      if (lane == 0) {
        uint64_t* b = bars + u;
        mbar_expect(b, 16 * C);
        for (int i = 0; i < 16; ++i) bulk_g2s(ring + u * STAGE + i * RS, base + i * rb + u * C, C, b);
      }
    }
    for (int64_t k = 0; k < n; ++k) {
      const int s = static_cast<int>(k % S);
      mbar_wait(bars + s, (phase >> s) & 1u);
      phase ^= 1u << s;
      const uint8_t* st = ring + s * STAGE;
#pragma unroll
      for (int j = 0; j < C / 32; ++j) {
        const uint2 a = *reinterpret_cast<const uint2*>(st + r * RS + 32 * j + 8 * g);
        const uint2 b = *reinterpret_cast<const uint2*>(st + (r + 8) * RS + 32 * j + 8 * g);
        acc ^= a.x + a.y * 3 + b.x * 5 + b.y;
      }
      __syncwarp();
      if (lane == 0 && k + S < n) {
        uint64_t* b = bars + s;
        mbar_expect(b, 16 * C);
        for (int i = 0; i < 16; ++i) bulk_g2s(ring + s * STAGE + i * RS, base + i * rb + (k + S) * C, C, b);
      }
    }
    (void)issued_total;
  }
  if (acc == 0x12345678u) out[0] = acc;
}


// CTA-level stream (the pattern of a TMA-pipelined GEMM's A operand): the weight is cut into chunks of
// CH contiguous bytes (a block iteration's 16 x RPB full rows are contiguous); CTA b takes chunks b, b +
// G, ... One producer warp (the last) issues one bulk copy per chunk into an S-stage ring (full barrier
// per stage, tx bytes); the consumer warps read the stage with 16-byte shared loads and arrive on the
// stage's empty barrier; the producer waits for it before refilling.
template <int S, int CH>
__global__ void cta_kernel(const uint8_t* __restrict__ w, int64_t bytes, uint32_t* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + S;
  uint8_t* ring = smem + 1024;
  const int consumers = static_cast<int>(blockDim.x / 32) - 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) { mbar_init(full + s, 1); mbar_init(empty + s, consumers); }
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const int64_t n_chunks = bytes / CH;
  const int64_t mine = n_chunks > blockIdx.x ? (n_chunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  uint32_t acc = 0;
  if (warp == consumers) {  // producer
    if (lane == 0) {
      for (int64_t k = 0; k < mine; ++k) {
        const int s = static_cast<int>(k % S);
        if (k >= S) mbar_wait(empty + s, static_cast<unsigned>(((k / S) - 1) & 1));
        mbar_expect(full + s, CH);
        bulk_g2s(ring + s * CH, w + (blockIdx.x + k * gridDim.x) * CH, CH, full + s);
      }
    }
  } else {
    for (int64_t k = 0; k < mine; ++k) {
      const int s = static_cast<int>(k % S);
      mbar_wait(full + s, static_cast<unsigned>((k / S) & 1));
      const uint4* st = reinterpret_cast<const uint4*>(ring + s * CH);
      for (int i = threadIdx.x; i < CH / 16; i += consumers * 32) {
        const uint4 v = st[i];
        acc ^= v.x + v.y * 3 + v.z * 5 + v.w;
      }
      __syncwarp();
      if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(sa(empty + s)) : "memory");
    }
  }
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void copy_read(const float4* __restrict__ p, int64_t n, uint32_t* out) {
  float s = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float4 v = __ldg(p + i); s += v.x + v.y + v.z + v.w;
  }
  if (s == 1234.5f) out[0] = 1;
}

int main() {
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const size_t pool_bytes = size_t(2) << 30;
  uint8_t* pool; CK(cudaMalloc(&pool, pool_bytes)); CK(cudaMemset(pool, 0x3c, pool_bytes));
  uint32_t* out; CK(cudaMalloc(&out, 64));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  printf("{\"device\": \"%s\", \"sms\": %d, \"l2_mb\": %d, \"results\": [\n", prop.name, sms, prop.l2CacheSize >> 20);
  {  // copy-read roofline
    const int64_t n = pool_bytes / 16; int iters = 10;
    copy_read<<<sms * 8, 512>>>((const float4*)pool, n, out);
    CK(cudaEventRecord(e0)); for (int i = 0; i < iters; ++i) copy_read<<<sms * 8, 512>>>((const float4*)pool, n, out);
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("  {\"kernel\": \"copy_read\", \"bytes\": %zu, \"us\": %.2f, \"tbps\": %.3f},\n", pool_bytes, 1e3 * ms / iters, pool_bytes * iters / (ms * 1e-3) / 1e12);
  }
  std::vector<Shape> shapes = {{"wq_b 32768x1280 fp8", 32768, 1280}, {"wo_b 5120x8192 fp8", 5120, 8192},
                               {"wq_a 1280x5120 fp8", 1280, 5120}, {"shared_w1 2304x5120 fp8", 2304, 5120},
                               {"experts_pair 12x2304x5120 fp4", 12 * 2304, 2560}, {"experts_w2 6x5120x2304 fp4", 6 * 5120, 1152}};
  auto bench = [&](const char* kname, const Shape& sh, auto launch) {
    const int64_t bytes = sh.rows * sh.row_bytes;
    int copies = static_cast<int>(std::min<int64_t>(pool_bytes / bytes, 64));
    const int iters = 200;
    launch(pool); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int i = 0; i < iters; ++i) launch(pool + (i % copies) * bytes);
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us = 1e3 * ms / iters;
    printf("  {\"kernel\": \"%s\", \"shape\": \"%s\", \"bytes\": %lld, \"us\": %.2f, \"tbps\": %.3f},\n", kname, sh.name, (long long)bytes, us, bytes / (us * 1e-6) / 1e12);
  };
  for (const Shape& sh : shapes) {
    const int64_t groups = sh.rows / 16;
    auto ks_for = [&](int64_t warps, int64_t steps) { int64_t ks = 1; while (groups * ks < warps && steps / (ks * 2) >= 4) ks *= 2; return (int)ks; };
    {
      const int blocks = 2 * sms; const int64_t warps = blocks * 8; const int KS = ks_for(warps, sh.row_bytes / 32);
      bench("reg8_u4", sh, [&](const uint8_t* w) { reg_kernel<4, 8><<<blocks, 256>>>(w, sh.rows, sh.row_bytes, KS, out); });
      bench("reg8_u8", sh, [&](const uint8_t* w) { reg_kernel<8, 8><<<blocks, 256>>>(w, sh.rows, sh.row_bytes, KS, out); });
      const int KS16 = ks_for(warps, sh.row_bytes / 64);
      bench("reg16_u4", sh, [&](const uint8_t* w) { reg_kernel<4, 16><<<blocks, 256>>>(w, sh.rows, sh.row_bytes, KS16, out); });
      const int blocks4 = 4 * sms; const int KS4 = ks_for(blocks4 * 8, sh.row_bytes / 64);
      bench("reg16_u4_4blk", sh, [&](const uint8_t* w) { reg_kernel<4, 16><<<blocks4, 256>>>(w, sh.rows, sh.row_bytes, KS4, out); });
    }
    auto bulk = [&](auto kern, int S, int C, int wpb, int bps, const char* name) {
      const int smem = 8 * S * wpb + 256 + wpb * S * 16 * (C + 16);
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int blocks = bps * sms; const int64_t warps = (int64_t)blocks * wpb;
      int KS = 1; while (groups * KS < warps && sh.row_bytes / C / (KS * 2) >= 2) KS *= 2;
      if (sh.row_bytes % C) return;
      bench(name, sh, [&](const uint8_t* w) { kern<<<blocks, wpb * 32, smem>>>(w, sh.rows, sh.row_bytes, KS, out); });
    };
    bulk(bulk_kernel<4, 256>, 4, 256, 4, 3, "bulk_s4_c256_w4x3");
    bulk(bulk_kernel<3, 256>, 3, 256, 8, 2, "bulk_s3_c256_w8x2");
    bulk(bulk_kernel<2, 512>, 2, 512, 4, 3, "bulk_s2_c512_w4x3");
    bulk(bulk_kernel<4, 128>, 4, 128, 8, 3, "bulk_s4_c128_w8x3");
    auto cta = [&](auto kern, int S, int CH, int warps, int bps, const char* name) {
      const int smem = 1024 + S * CH;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int64_t bytes = sh.rows * sh.row_bytes;
      if (bytes % CH) return;
      const int64_t n_chunks = bytes / CH;
      const int blocks = static_cast<int>(std::min<int64_t>(n_chunks, (int64_t)bps * sms));
      bench(name, sh, [&](const uint8_t* w) { kern<<<blocks, (warps + 1) * 32, smem>>>(w, bytes, out); });
    };
    cta(cta_kernel<4, 16384>, 4, 16384, 4, 1, "cta_s4_c16k_1blk");
    cta(cta_kernel<6, 16384>, 6, 16384, 4, 1, "cta_s6_c16k_1blk");
    cta(cta_kernel<4, 16384>, 4, 16384, 4, 2, "cta_s4_c16k_2blk");
    cta(cta_kernel<3, 16384>, 3, 16384, 4, 2, "cta_s3_c16k_2blk");
    cta(cta_kernel<4, 8192>, 4, 8192, 4, 2, "cta_s4_c8k_2blk");
    cta(cta_kernel<8, 8192>, 8, 8192, 4, 2, "cta_s8_c8k_2blk");
    cta(cta_kernel<4, 32768>, 4, 32768, 4, 1, "cta_s4_c32k_1blk");
    cta(cta_kernel<2, 32768>, 2, 32768, 4, 3, "cta_s2_c32k_3blk");
    cta(cta_kernel<6, 4096>, 6, 4096, 4, 4, "cta_s6_c4k_4blk");
  }
  printf("  {}]}\n");
  return 0;
}
