// ds41 scripts/cuda-host-emu: a host SIMT emulator that runs the CUDA kernels of src/backends/cuda on
// the CPU, so their logic (indexing, barriers, warp shuffles / ballots / match, shared memory,
// tie handling) can be checked against the CPU reference on a machine without a GPU. A verification
// aid, not part of the build: see run.sh. One fiber (ucontext) per CUDA thread on one OS thread,
// CTAs run one after the other (so a function-local `static` stands in for __shared__); the fibers
// of a CTA run round-robin until each waits at a barrier (__syncthreads, or a warp intrinsic, where
// all live lanes of the warp rendezvous) or exits; exited threads drop out of barriers like on the
// GPU. A barrier nobody can release (divergent __syncthreads, a lane missing from a shuffle) aborts.
// Float arithmetic is the host's (IEEE, -ffp-contract=off, like --fmad=false), libm's expf/exp
// instead of CUDA's, and the pre-sm_89 paths of quant_device.cuh. Not emulated: memory-model races
// between warps without a barrier, the read-only cache, resource limits (registers, shared memory
// size), performance. Launches from several host threads are serialized (one kernel at a time).
#pragma once
#define DS41_SIMT_EMU 1
#define __global__
#define __device__
#define __host__
#define __shared__ static
#include <cuda_runtime_api.h>
#include <vector_functions.h>  // make_float4 & co. (host-callable)
#undef __launch_bounds__
#define __launch_bounds__(...)
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>
using std::isnan;
using std::isfinite;

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
enum State { kRun, kWaitWarp, kWaitBlock, kDone };
struct Fiber {
  ucontext_t ctx;
  State state = kRun;
};
constexpr size_t kStack = 128 * 1024;
struct Block {
  std::vector<Fiber> f;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<uint64_t> buf;  // warp exchange slots, one per thread
  std::vector<unsigned char> smem;
  std::function<void()> body;
  ucontext_t sched;
  int cur = 0;
};
inline Block blk;
inline int lane() { return blk.cur % 32; }
inline void wait(State s) {
  Fiber& f = blk.f[blk.cur];
  f.state = s;
  swapcontext(&f.ctx, &blk.sched);
}
inline void trampoline() {
  blk.body();
  blk.f[blk.cur].state = kDone;  // returns to blk.sched through uc_link
}
template <class T> T* dyn_smem() { return reinterpret_cast<T*>(blk.smem.data()); }
template <class T> T exch(T v, int src) {
  const int base = blk.cur / 32 * 32;
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  blk.buf[blk.cur] = u;
  wait(kWaitWarp);
  const uint64_t r = blk.buf[base + src];
  wait(kWaitWarp);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}
// Runs one CTA of n threads to completion.
inline void run_block(unsigned n, uint3 bx, dim3 grid, size_t smem, std::function<void()> body) {
  blk.f.assign(n, Fiber{});
  while (blk.stacks.size() < n) blk.stacks.push_back(std::make_unique<char[]>(kStack));
  blk.buf.assign((n + 31) / 32 * 32, 0);
  blk.smem.assign(smem + 64, 0xCD);
  blk.body = std::move(body);
  blockIdx = bx;
  blockDim = dim3(n);
  gridDim = grid;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = blk.f[t];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = blk.stacks[t].get();
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &blk.sched;
    makecontext(&f.ctx, trampoline, 0);
  }
  for (;;) {
    for (unsigned t = 0; t < n; ++t) {
      if (blk.f[t].state != kRun) continue;
      blk.cur = static_cast<int>(t);
      threadIdx = uint3{t, 0, 0};
      swapcontext(&blk.sched, &blk.f[t].ctx);
    }
    // Every live fiber waits (or all are done): release what can be released.
    bool live = false, released = false, all_block = true;
    for (unsigned w = 0; w * 32 < n; ++w) {
      bool any = false, all_warp = true;
      for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); ++t) {
        const State s = blk.f[t].state;
        if (s == kDone) continue;
        any = true;
        live = true;
        all_warp = all_warp && s == kWaitWarp;
        all_block = all_block && s == kWaitBlock;
      }
      if (any && all_warp) {
        for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); ++t)
          if (blk.f[t].state == kWaitWarp) blk.f[t].state = kRun;
        released = true;
      }
    }
    if (!live) return;
    if (!released && all_block) {
      for (Fiber& f : blk.f)
        if (f.state == kWaitBlock) f.state = kRun;
      released = true;
    }
    if (!released) {
      std::fprintf(stderr, "simt_emu: deadlock in block (%u, %u, %u) (divergent barrier or warp intrinsic)\n", bx.x,
                   bx.y, bx.z);
      std::abort();
    }
  }
}
}  // namespace emu

inline void __syncthreads() { emu::wait(emu::kWaitBlock); }
template <class T> T __shfl_xor_sync(unsigned, T v, int m) { return emu::exch(v, emu::lane() ^ m); }
template <class T> T __shfl_down_sync(unsigned, T v, unsigned d) {
  const int s = emu::lane() + static_cast<int>(d);
  return emu::exch(v, s < 32 ? s : emu::lane());
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned d) {
  const int s = emu::lane() - static_cast<int>(d);
  return emu::exch(v, s >= 0 ? s : emu::lane());
}
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu::exch(v, src & 31); }
// Lanes that exited count as 0 / non-matching (the kernels call these with full warps only).
inline unsigned warp_gather_mask(uint64_t mine, bool (*pred)(uint64_t, uint64_t)) {
  const int base = emu::blk.cur / 32 * 32, me = emu::blk.cur;
  emu::blk.buf[me] = mine;
  emu::wait(emu::kWaitWarp);
  unsigned r = 0;
  for (int i = 0; i < 32 && base + i < static_cast<int>(emu::blk.f.size()); ++i)
    if (emu::blk.f[base + i].state != emu::kDone && pred(emu::blk.buf[base + i], mine)) r |= 1u << i;
  emu::wait(emu::kWaitWarp);
  return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
  return warp_gather_mask(p ? 1 : 0, [](uint64_t other, uint64_t) { return other != 0; });
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0u; }
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, !p) == 0u; }
inline unsigned __match_any_sync(unsigned, int v) {
  return warp_gather_mask(static_cast<uint64_t>(static_cast<int64_t>(v)),
                          [](uint64_t other, uint64_t mine) { return other == mine; });
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old + v;
  return old;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }  // one rounding, as CUDA
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
// The read-only cache path and the streaming load: plain loads on the host.
template <class T> T __ldg(const T* p) { return *p; }
template <class T> T __ldcs(const T* p) { return *p; }
template <class T> T __ldcg(const T* p) { return *p; }
// CTAs run one after another: every earlier CTA's writes are already visible.
inline void __threadfence() {}
// A warp barrier: every live lane of the warp rendezvous (as at a shuffle).
inline void __syncwarp(unsigned = 0xffffffffu) { emu::wait(emu::kWaitWarp); }
inline float cospif(float x) { return static_cast<float>(std::cos(M_PI * static_cast<double>(x))); }
inline float sinpif(float x) { return static_cast<float>(std::sin(M_PI * static_cast<double>(x))); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyintf(x)); }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace emu {
// One for every kernel (a static inside run() would be one per instantiation).
inline std::recursive_mutex& launch_mutex() {
  static std::recursive_mutex m;
  return m;
}
// Grids of up to three dimensions (blockIdx.x fastest, like the hardware's usual order).
struct Launch {
  dim3 grid;
  unsigned block;
  size_t smem;
  Launch(dim3 g, unsigned b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(b), smem(s) {}
  Launch(dim3 g, int b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(static_cast<unsigned>(b)), smem(s) {}
  template <class K, class... A>
  void run(K k, A... a) {
    // Launches from several host threads (the vision encoder thread next to the engine loop's)
    // run one at a time: the CTA state above is global.
    std::lock_guard<std::recursive_mutex> lk(launch_mutex());
    for (unsigned bz = 0; bz < grid.z; ++bz)
      for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) run_block(block, uint3{bx, by, bz}, grid, smem, [&] { k(a...); });
  }
};
}  // namespace emu
