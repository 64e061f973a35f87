// ds41 backends/cuda: Engram table gather and the per-stream gate update (MODEL_SPEC 3.2.4).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// out[r] = concat over cols of the dequantized rows row_ids[r*cols + j] (E4M3 + E8M0 per 32).
// table / scale may be device memory or mapped host-pinned memory; table and out 16-byte aligned,
// dim % 32 == 0; an id outside [0, table_rows) gives a NaN row (weight_dequant.h).
Status run_engram_gather(const uint8_t* table, const uint8_t* scale, int64_t table_rows, int64_t dim,
                         const int64_t* row_ids, int64_t n, int64_t cols, float* out, cudaStream_t stream);
// As ops::Backend::engram_update, keys and value taken from the wkv output z [n, (C + 1) * H]:
// keys = z[r, 0 : C*H] as [C, H], value = z[r, C*H : (C+1)*H].
Status run_engram_update(float* streams, const float* z, const float* omega,
                         const uint8_t* dead /* nullable */, int64_t n, int64_t c, int64_t h, float eps,
                         float* gates, cudaStream_t stream);

}  // namespace ds41::cuda
