// ds41 backends/cuda: indexer scores over the visible compressed keys (MODEL_SPEC 3.4.6).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// out[r, t] = sum_h w[r,h] * relu(q[r,h] . keys[key_begin[r] + t]) * scale for t < visible[r],
// -inf for visible[r] <= t < t_stride. keys: float [*, head_dim] (sequences' keys concatenated).
struct IndexerDeviceArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0, t_stride = 0;
  const float* q = nullptr;            // [n, n_heads, head_dim]
  const float* w = nullptr;            // [n, n_heads]
  const float* keys = nullptr;         // [*, head_dim]
  const int64_t* key_begin = nullptr;  // [n]
  const int64_t* visible = nullptr;    // [n]
  float scale = 1.0f;
  float* out = nullptr;  // [n, t_stride]
};
Status run_indexer_scores(const IndexerDeviceArgs& a, cudaStream_t stream);

}  // namespace ds41::cuda
