// ds41 backends/cuda: the aligner's unshuffle (MODEL_SPEC 3.11): a ViT grid zero-padded to multiples
// of k, k x k windows in reading order, each flattened channel-major (ch, dy, dx). Contract shared
// by the GPU executor (src/gpu) and the kernels: device pointers, the stream last, errors as
// Status, no allocation or synchronisation (graph-capturable), semantics of
// Backend::space_to_depth (src/ops/backend.h; tests/parity/cuda/vision_parity_test.cpp compares
// them bit for bit: pure data movement).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// x: [grid_h * grid_w, c]; out: [ceil(grid_h / k) * ceil(grid_w / k), c * k * k].
Status run_space_to_depth(const float* x, int64_t grid_h, int64_t grid_w, int64_t c, int64_t k, float* out,
                          cudaStream_t stream);

}  // namespace ds41::cuda
