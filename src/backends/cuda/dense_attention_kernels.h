// ds41 backends/cuda: full (bidirectional) multi-head attention within segments — the vision
// tower's attention over the patches of one image (MODEL_SPEC 3.11). Contract shared by the GPU
// executor (src/gpu) and the kernels: device pointers, the stream last, errors as Status, no
// allocation or synchronisation (graph-capturable), semantics of Backend::dense_attention
// (src/ops/backend.h; tests/parity/cuda/vision_parity_test.cpp compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// As ops::DenseAttentionArgs, with row strides: row r of q / k / v starts at base + r * ld_in
// (0: n_heads * head_dim), so the GPU tower reads q, k and v inside its fused qkv rows.
struct DenseAttentionDeviceArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0;  // head_dim <= 128
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t ld_in = 0;
  const int64_t* seg_offsets = nullptr;  // device [n_segs + 1], seg_offsets[0] = 0, seg_offsets[n_segs] = n
  int64_t n_segs = 0;                    // <= 65535
  int64_t max_seg_rows = 0;  // host: an upper bound of every segment's length (rows past it are not computed)
  float scale = 1.0f;
  float* out = nullptr;  // [n, n_heads, head_dim]
};
Status run_dense_attention(const DenseAttentionDeviceArgs& a, cudaStream_t stream);

}  // namespace ds41::cuda
