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

// Many small blocks, not one: each SM's copy engine walks its own bulk prefetches, so one block would
// take ~100 us for 24 MB.
__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(L2Regions r, int64_t cap) {
  // After the previous kernel (its own loads keep the bandwidth), and the next kernel may start now:
  // nothing here is read by anyone.
  dev::pdl_wait();
  dev::pdl_trigger();
  dev::l2_prefetch_chunks(r, cap, static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x,
                          static_cast<int64_t>(gridDim.x) * kThreads);
}

}  // namespace

Status check_l2_regions(const L2Regions& r) {
  if (r.count < 0 || r.count > L2Regions::kMax) return invalid_argument("l2_prefetch: region count out of range");
  for (int i = 0; i < r.count; ++i) {
    if (r.bytes[i] < 0) return invalid_argument("l2_prefetch: region " + std::to_string(i) + " has negative bytes");
    if (r.bytes[i] > 0 && r.ptr[i] == nullptr)
      return invalid_argument("l2_prefetch: region " + std::to_string(i) + " is null");
  }
  return ok_status();
}

Status run_l2_prefetch(const L2Regions& r, int64_t cap_bytes, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_l2_regions(r));
  if (cap_bytes <= 0 || r.count == 0 || r.total() == 0) return ok_status();
  const int64_t bytes = std::min(cap_bytes, r.total()), chunks = (bytes + dev::kL2Chunk - 1) / dev::kL2Chunk;
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, (chunks + kThreads - 1) / kThreads));
  launch(l2_prefetch_kernel, dim3(blocks), dim3(kThreads), 0, stream, r, cap_bytes);
  return last_launch_status("l2_prefetch");
}

}  // namespace ds41::cuda
