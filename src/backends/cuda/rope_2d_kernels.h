// ds41 backends/cuda: the vision tower's 2D RoPE (MODEL_SPEC 3.11, split-half convention: the angle
// vector [row * f, col * f] rotates channel j with channel j + head_dim/2). Contract shared by the
// GPU executor (src/gpu) and the kernels: device pointers, the stream last, errors as Status, no
// allocation or synchronisation (graph-capturable), semantics of Backend::rope_2d
// (src/ops/backend.h; tests/parity/cuda/vision_parity_test.cpp compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// As Backend::rope_2d on n rows of `heads` vectors of head_dim, except that row r starts at
// x + r * ld (ld >= heads * head_dim): the GPU tower rotates q and k in place inside the fused
// qkv rows ([q | k | v], ld = 3 * D, heads = 2 * vision heads). row / col: device int32 [n];
// inv_freq: device float [head_dim / 4]. head_dim % 4 == 0, head_dim <= 4096.
Status run_rope_2d(float* x, int64_t n, int64_t heads, int64_t head_dim, int64_t ld, const int32_t* row,
                   const int32_t* col, const float* inv_freq, cudaStream_t stream);

}  // namespace ds41::cuda
