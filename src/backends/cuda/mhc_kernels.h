// ds41 backends/cuda: the mHC site map with Sinkhorn, collapse, expand and the stream init
// (MODEL_SPEC 3.1, 3.3). Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the
// stream last, errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op
// in src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// The fields and meaning of ops::HcMapArgs, device pointers.
struct HcMapDeviceArgs {
  int64_t n = 0, c = 0, h = 0, sinkhorn_iters = 0;
  const float* streams = nullptr;  // [n, c, h]
  const float* fn = nullptr;       // [(2 + c) * c, c * h]
  const float* scale = nullptr;    // [3]
  const float* base = nullptr;     // [(2 + c) * c]
  float hc_eps = 1e-6f, norm_eps = 1e-20f;
  float* pre = nullptr;   // [n, c]
  float* post = nullptr;  // [n, c]
  float* comb = nullptr;  // [n, c, c]
  // Device scratch of at least hc_map_workspace_bytes(n, c, h) bytes, 8-byte aligned (the split-K
  // partial sums); contents need no initialisation and are dead after the call.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
// Workspace run_hc_map needs for up to n rows (grows with n: sized once for the largest step, it
// serves every smaller one). 0 for shapes the launcher rejects.
size_t hc_map_workspace_bytes(int64_t n, int64_t c, int64_t h);
Status run_hc_map(const HcMapDeviceArgs& a, cudaStream_t stream);
Status run_hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                       float* out, cudaStream_t stream);
Status run_hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n,
                     int64_t c, int64_t h, cudaStream_t stream);
// MODEL_SPEC 3.1: streams[r, c, :] = e[r, :] for every c; pi[r, :] = one-hot(0).
Status run_hc_init(const float* e, int64_t n, int64_t c, int64_t h, float* streams, float* pi,
                   cudaStream_t stream);

}  // namespace ds41::cuda
