// ds41 scripts/cuda-host-emu: a host SIMT emulator that runs the CUDA kernels of src/backends/cuda on
// the CPU, so their logic (indexing, barriers, warp shuffles / ballots / match, shared memory,
// tie handling) can be checked against the CPU reference on a machine without a GPU. A verification
// aid, not part of the build: see run.sh. One std::thread per CUDA thread, CTAs run one after the
// other (so a function-local `static` stands in for __shared__), std::barrier for __syncthreads and
// for the warp intrinsics (all lanes of a warp rendezvous; exited threads drop out like on the GPU).
// Float arithmetic is the host's (IEEE, -ffp-contract=off, like --fmad=false), libm's expf/exp
// instead of CUDA's, and the pre-sm_89 paths of quant_device.cuh. Not emulated: memory-model races
// between warps without a barrier, the read-only cache, resource limits (registers, shared memory
// size), performance.
#pragma once
#define __global__
#define __device__
#define __host__
#define __shared__ static
#include <cuda_runtime_api.h>
#undef __launch_bounds__
#define __launch_bounds__(...)
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#include <algorithm>
using std::isnan;

namespace emu {
struct Warp { std::unique_ptr<std::barrier<>> bar; uint64_t buf[32]; };
struct Block { std::unique_ptr<std::barrier<>> bar; std::vector<Warp> warps; std::vector<unsigned char> smem; };
inline thread_local Block* tl_block = nullptr;
inline thread_local int tl_lane = 0, tl_warp = 0;
template <class T> T* dyn_smem() { return reinterpret_cast<T*>(tl_block->smem.data()); }
template <class T> T exch(T v, int src) {
  Warp& w = tl_block->warps[tl_warp];
  uint64_t u = 0; std::memcpy(&u, &v, sizeof(T)); w.buf[tl_lane] = u;
  w.bar->arrive_and_wait();
  uint64_t r = w.buf[src];
  w.bar->arrive_and_wait();
  T out; std::memcpy(&out, &r, sizeof(T)); return out;
}
}  // namespace emu
inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
inline void __syncthreads() { emu::tl_block->bar->arrive_and_wait(); }
template <class T> T __shfl_xor_sync(unsigned, T v, int m) { return emu::exch(v, emu::tl_lane ^ m); }
template <class T> T __shfl_down_sync(unsigned, T v, unsigned d) {
  int s = emu::tl_lane + (int)d; return emu::exch(v, s < 32 ? s : emu::tl_lane);
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned d) {
  int s = emu::tl_lane - (int)d; return emu::exch(v, s >= 0 ? s : emu::tl_lane);
}
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu::exch(v, src & 31); }
inline unsigned __ballot_sync(unsigned, int p) {
  emu::Warp& w = emu::tl_block->warps[emu::tl_warp];
  w.buf[emu::tl_lane] = p ? 1 : 0; w.bar->arrive_and_wait();
  unsigned r = 0; for (int i = 0; i < 32; ++i) r |= (w.buf[i] ? 1u : 0u) << i;
  w.bar->arrive_and_wait(); return r;
}
inline unsigned __match_any_sync(unsigned, int v) {
  emu::Warp& w = emu::tl_block->warps[emu::tl_warp];
  w.buf[emu::tl_lane] = (uint64_t)(int64_t)v; w.bar->arrive_and_wait();
  unsigned r = 0; for (int i = 0; i < 32; ++i) r |= (w.buf[i] == (uint64_t)(int64_t)v ? 1u : 0u) << i;
  w.bar->arrive_and_wait(); return r;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float x) { return (int)std::nearbyintf(x); }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace emu {
struct Launch {
  unsigned grid, block; size_t smem;
  Launch(unsigned g, unsigned b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block(b), smem(s) {}
  Launch(unsigned g, int b, size_t s = 0, cudaStream_t = nullptr) : grid(g), block((unsigned)b), smem(s) {}
  template <class K, class... A> void run(K k, A... a) {
    for (unsigned bx = 0; bx < grid; ++bx) {
      Block B; B.bar = std::make_unique<std::barrier<>>(block);
      B.warps.resize((block + 31) / 32);
      for (auto& w : B.warps) w.bar = std::make_unique<std::barrier<>>(32);
      B.smem.assign(smem + 64, 0xCD);
      std::vector<std::thread> th;
      for (unsigned t = 0; t < block; ++t)
        th.emplace_back([&, t, bx] {
          tl_block = &B; tl_lane = t % 32; tl_warp = t / 32;
          threadIdx = uint3{t, 0, 0}; blockIdx = uint3{bx, 0, 0};
          blockDim = dim3(block); gridDim = dim3(grid);
          k(a...);
          B.warps[tl_warp].bar->arrive_and_drop();
          B.bar->arrive_and_drop();
        });
      for (auto& x : th) x.join();
    }
  }
};
}  // namespace emu
