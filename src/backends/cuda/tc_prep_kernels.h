// ds41 backends/cuda: the element kernels around the tensor-core prefill linears
// (gpu/tensor_core_linear.h): x split into three bfloat16 parts, the three partial products summed
// back, and the routed experts' weights decoded to bfloat16 for a batch of experts in one launch.
//
// Why three parts (docs/gpu_kernels.md "Prefill on tensor cores"): the CPU oracle multiplies fp32 x
// by the exactly dequantized weight. Every FP8 / FP4 / BF16 weight value is exact in bfloat16, and
// x = hi + lo + lo2 with hi = bf16(x), lo = bf16(x - hi), lo2 = bf16(x - hi - lo) keeps 24
// significant bits (the differences are exact in fp32), so a BF16 tensor-core product accumulated
// in fp32 differs from the oracle only in the order of the fp32 additions, like the GEMV path.
//
// Row layout of a split ("stacked"): for each group g of rows [off[g], off[g+1]) (one group when
// offsets is null: [0, rows)), its hi rows, then its lo rows, then its lo2 rows, starting at row
// 3 * off[g]; so a group's three parts form one [3 * count, cols] matrix that one GEMM multiplies.
// All launchers: device pointers, the stream last, no allocation or synchronisation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "core/status.h"

namespace ds41::cuda {

// x [rows, cols] fp32 -> out [3 * rows, cols] bf16 stacked per group. offsets: device int64
// [groups + 1] (offsets[0] == 0, rows == offsets[groups]) or null (one group). Non-finite x: hi
// carries it, lo and lo2 are 0 (so an inf stays inf instead of becoming inf - inf = NaN).
Status run_split3_bf16(const float* x, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                       __nv_bfloat16* out, cudaStream_t stream);

// y [rows, cols] = y3_hi + (y3_lo + y3_lo2) for the stacked [3 * rows, cols] fp32 products.
Status run_sum3(const float* y3, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups, float* y,
                cudaStream_t stream);

// out [count, out_dim, in_dim] bf16: the weights weights[ids[i]] decoded exactly (as
// quant dequant_rows, then bf16, which is exact for FP8 tiles / FP4 rows / BF16). weights: DEVICE
// array; ids: device int32 [count]. Needs in_dim % 32 == 0 and 16-byte aligned payloads (the
// caller checks: tensor_core_linear.cpp's expert path); the format is read per expert.
Status run_experts_dequant_bf16(const DeviceWeight* weights, const int32_t* ids, int64_t count, int64_t out_dim,
                                int64_t in_dim, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace ds41::cuda
