// ds41 backends/cuda: the vision tower's pointwise ops (MODEL_SPEC 3.11): bias add over rows and the
// exact (erf) GELU of the aligner. Contract shared by the GPU executor (src/gpu) and the kernels:
// device pointers, the stream last, errors as Status, no allocation or synchronisation
// (graph-capturable), semantics of the CPU op in src/ops/backend.h (Backend::add_bias, gelu_erf;
// tests/parity/cuda/vision_parity_test.cpp compares them). The residual add is run_add_inplace
// (elementwise_kernels.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// y[r, i] += bias[i] for n rows of dim (one fp32 add: bit-identical to the CPU op).
Status run_add_bias(float* y, int64_t n, int64_t dim, const float* bias, cudaStream_t stream);
// x = float(0.5 * x * (1 + erf(x / sqrt(2)))) in float64, in place (the CPU op's order).
Status run_gelu_erf(float* x, int64_t count, cudaStream_t stream);

}  // namespace ds41::cuda
