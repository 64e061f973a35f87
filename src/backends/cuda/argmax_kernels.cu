// ds41 backends/cuda: argmax_kernels.h. Pass 1: CTA (s, r) reduces slice s of row r to its best
// (value, index) over the non-NaN entries (larger value, then lower index); pass 2: one warp per
// row reduces the slices and applies the first-entry rule. The order of the comparisons does not
// matter: "larger, then lower index" is a total order on the non-NaN entries, so the result is
// the sequential scan's whatever the grouping.
#include <cmath>
#include <string>

#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

constexpr int kArgThreads = 256;
constexpr int64_t kSlice = 4096;  // entries per CTA of pass 1

struct Best {
  float v;
  int32_t i;  // -1: no non-NaN entry
  // The checked mode's row validity (engine/sampler.h Sampler::sample): a NaN or +inf entry seen;
  // an entry above -inf seen.
  uint32_t bad, live;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  const uint32_t bad = a.bad | b.bad, live = a.live | b.live;
  Best r = a.i < 0 ? b : (b.i < 0 ? a : ((b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a));
  r.bad = bad;
  r.live = live;
  return r;
}

__device__ __forceinline__ Best warp_best(Best b) {
  for (int off = 16; off > 0; off >>= 1) {
    Best o;
    o.v = __shfl_xor_sync(0xffffffffu, b.v, off);
    o.i = __shfl_xor_sync(0xffffffffu, b.i, off);
    o.bad = __shfl_xor_sync(0xffffffffu, b.bad, off);
    o.live = __shfl_xor_sync(0xffffffffu, b.live, off);
    b = better(b, o);
  }
  return b;
}

__global__ void __launch_bounds__(kArgThreads)
    argmax_slices_kernel(const float* __restrict__ x, int64_t t, int64_t slices, Best* __restrict__ part) {
  dev::pdl_enter();
  __shared__ Best wb[kArgThreads / 32];
  const int64_t r = blockIdx.y, s = blockIdx.x;
  const int64_t b0 = s * kSlice, b1 = min(t, b0 + kSlice);
  const float* row = x + r * t;
  Best b{0.0f, -1, 0, 0};
  for (int64_t i = b0 + threadIdx.x; i < b1; i += kArgThreads) {
    const float v = row[i];
    b.bad |= !(v < INFINITY);  // NaN or +inf
    b.live |= v > -INFINITY;
    if (!isnan(v)) b = better(b, Best{v, static_cast<int32_t>(i), 0, 0});
  }
  b = warp_best(b);
  if ((threadIdx.x & 31) == 0) wb[threadIdx.x >> 5] = b;
  __syncthreads();
  if (threadIdx.x < 32) {
    Best c = threadIdx.x < kArgThreads / 32 ? wb[threadIdx.x] : Best{0.0f, -1, 0, 0};
    c = warp_best(c);
    if (threadIdx.x == 0) part[r * slices + s] = c;
  }
}

__global__ void __launch_bounds__(32)
    argmax_finish_kernel(const float* __restrict__ x, int64_t t, int64_t slices, const Best* __restrict__ part,
                         int32_t* __restrict__ out, bool checked) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x;
  Best b{0.0f, -1, 0, 0};
  for (int64_t s = threadIdx.x; s < slices; s += 32) b = better(b, part[r * slices + s]);
  b = warp_best(b);
  if (threadIdx.x == 0) {
    if (checked && (b.bad || !b.live))
      out[r] = kArgmaxInvalidRow;
    else
      out[r] = (b.i < 0 || isnan(x[r * t])) ? 0 : b.i;
  }
}

int64_t slices_of(int64_t t) { return (t + kSlice - 1) / kSlice; }

}  // namespace

size_t argmax_workspace_bytes(int64_t n, int64_t t) {
  if (n <= 0 || t <= 0) return 0;
  return static_cast<size_t>(n * slices_of(t)) * sizeof(Best);
}

Status run_argmax_rows(const float* x, int64_t n, int64_t t, int32_t* out, void* workspace, cudaStream_t stream,
                       bool checked) {
  if (n < 0 || n > 65535) return invalid_argument("argmax_rows: n " + std::to_string(n) + " outside [0, 65535]");
  if (t < 1 || t >= (int64_t{1} << 31))
    return invalid_argument("argmax_rows: t " + std::to_string(t) + " outside [1, 2^31)");
  if (n == 0) return ok_status();
  if (!x || !out || !workspace) return invalid_argument("argmax_rows: x, out or workspace is null");
  const int64_t slices = slices_of(t);
  Best* part = static_cast<Best*>(workspace);
  launch(argmax_slices_kernel, dim3(static_cast<unsigned>(slices), static_cast<unsigned>(n)), dim3(kArgThreads), 0,
         stream, x, t, slices, part);
  DS41_RETURN_IF_ERROR(last_launch_status("argmax_slices"));
  launch(argmax_finish_kernel, dim3(static_cast<unsigned>(n)), dim3(32), 0, stream, x, t, slices, part, out,
         checked);
  return last_launch_status("argmax_finish");
}

}  // namespace ds41::cuda
