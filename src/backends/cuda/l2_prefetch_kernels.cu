// ds41 backends/cuda: run_l2_prefetch (l2_prefetch_kernels.h).
#include "backends/cuda/l2_prefetch_kernels.h"

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/l2_prefetch.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"
#include "quant/weight_format.h"

namespace ds41::cuda {

bool L2Regions::add(const void* p, int64_t b) {
  if (b <= 0) return true;
  if (count >= kMax) return false;
  ptr[count] = p;
  bytes[count] = b;
  ++count;
  return true;
}

bool L2Regions::add(const DeviceWeight& w) {
  if (!w.present()) return true;
  return add(w.data, quant::weight_payload_bytes(w.format, w.out_dim, w.in_dim)) &&
         (w.scale == nullptr || add(w.scale, quant::weight_scale_bytes(w.format, w.out_dim, w.in_dim)));
}

int64_t L2Regions::total() const {
  int64_t t = 0;
  for (int i = 0; i < count; ++i) t += bytes[i];
  return t;
}

namespace {

constexpr int kThreads = 32;
constexpr int kMaxBlocks = 64;
constexpr int64_t kChunk = int64_t{16} << 10;  // bytes per bulk prefetch

// Chunk c of the regions laid end to end (up to cap bytes) goes to global thread c % (threads of the
// grid): cp.async.bulk.prefetch.L2 on sm_90 (16-byte aligned, whole 16-byte units inside the region),
// one prefetch.global.L2 per 128-byte line otherwise. Many small blocks, not one: each SM's copy
// engine walks its own bulk prefetches line by line, so one block would take ~100 us for 24 MB.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2Regions r, int64_t cap) {
  // After the previous kernel (its own loads keep the bandwidth), and the next kernel may start now:
  // nothing here is read by anyone.
  dev::pdl_wait();
  dev::pdl_trigger();
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x,
                stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t at = 0;  // bytes of the earlier regions
  for (int i = 0; i < r.count && at < cap; ++i) {
    const int64_t len = min(r.bytes[i], cap - at);
    const uintptr_t base = reinterpret_cast<uintptr_t>(r.ptr[i]);
    for (int64_t off = tid * kChunk; off < len; off += stride * kChunk) {
      const uintptr_t a = base + off, e = base + min(len, off + kChunk);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const uintptr_t a16 = (a + 15) & ~uintptr_t{15}, n16 = e > a16 ? (e - a16) & ~uintptr_t{15} : 0;
      if (n16 > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a16), "r"(static_cast<unsigned>(n16))
                     : "memory");
#else
      for (uintptr_t l = a & ~uintptr_t{127}; l < e; l += 128) dev::prefetch_l2(reinterpret_cast<const void*>(l));
#endif
    }
    at += len;
  }
}

}  // namespace

Status run_l2_prefetch(const L2Regions& r, int64_t cap_bytes, cudaStream_t stream) {
  if (r.count < 0 || r.count > L2Regions::kMax) return invalid_argument("l2_prefetch: region count out of range");
  for (int i = 0; i < r.count; ++i) {
    if (r.bytes[i] < 0) return invalid_argument("l2_prefetch: region " + std::to_string(i) + " has negative bytes");
    if (r.bytes[i] > 0 && r.ptr[i] == nullptr)
      return invalid_argument("l2_prefetch: region " + std::to_string(i) + " is null");
  }
  if (cap_bytes <= 0 || r.count == 0 || r.total() == 0) return ok_status();
  const int64_t bytes = std::min(cap_bytes, r.total()), chunks = (bytes + kChunk - 1) / kChunk;
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, (chunks + kThreads - 1) / kThreads));
  launch(l2_prefetch_kernel, dim3(blocks), dim3(kThreads), 0, stream, r, cap_bytes);
  return last_launch_status("l2_prefetch");
}

}  // namespace ds41::cuda
