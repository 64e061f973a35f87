// ds41 backends/cuda: packed KV rows in pools: gather-decode, encode-scatter, in-place fake quantization
// (MODEL_SPEC 3.9, 5.2), bit-exact with src/quant. Contract shared by the GPU executor (src/gpu) and the
// kernels: device pointers, the stream last, errors as Status, no allocation or synchronisation
// (graph-capturable), semantics of the CPU op in src/ops/backend.h (the oracle; tests/parity/cuda compares
// them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/fake_quant_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

// out[i, :] = decode(row at base + row_offsets[i]) as float32 (channels wide); offset < 0 -> zeros.
Status run_decode_rows_gather(FakeQuantOp op, int64_t channels, const uint8_t* base,
                              const int64_t* row_offsets, int64_t m, float* out, cudaStream_t stream);
// Packs x[i, :] into the row at base + row_offsets[i] (bytes); offset < 0 -> skipped.
Status run_encode_rows_scatter(FakeQuantOp op, int64_t channels, const float* x, int64_t m, uint8_t* base,
                               const int64_t* row_offsets, cudaStream_t stream);
// x[i, :] = decode(encode(x[i, :])) in place, bit-exact with quant::q_{win,kv,idx}_inplace.
Status run_fake_quant_inplace(FakeQuantOp op, int64_t channels, float* x, int64_t m, cudaStream_t stream);

}  // namespace ds41::cuda
