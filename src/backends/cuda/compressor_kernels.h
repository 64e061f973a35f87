// ds41 backends/cuda: ratio-r compressor pooling (MODEL_SPEC 3.4.4).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// out[g, d] = sum_i softmax_i(b[g, i, d]) * a[g, i, d] over r rows, for `groups` groups;
// a, b: [groups, r, dim] contiguous (the caller gathers the rows of each group).
Status run_softmax_pool(const float* a, const float* b, int64_t groups, int64_t r, int64_t dim, float* out,
                        cudaStream_t stream);

}  // namespace ds41::cuda
