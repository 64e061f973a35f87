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
//
// The two-part fp16 split (opt-in for FP8-tile and FP4-row weights: DS41_TC_SPLIT=2, docs/gpu_kernels.md
// "Prefill linears on tensor cores"): fp16 keeps 11 significant bits where bfloat16 keeps 8, so two
// parts carry what three bfloat16 parts do, to within one unit in the last place of x:
//   - each row of x is scaled by 2^tau (tau per row: max |x| of the row lands in [2^14, 2^15)),
//     hi = f16(x 2^tau), lo = f16(x 2^tau - hi) (the difference is exact in fp32); x 2^tau - hi - lo
//     is 0 or one ulp of x (a residual of 12 bits rounded to 11), and elements below 2^-28 of the
//     row's max lose bits to fp16's subnormal range (an absolute error under 2^-39 of the max);
//   - the weight is decoded exactly into fp16 after a power-of-two shift sigma per band of 32
//     output rows (the band's largest E8M0 scale puts its max |w| at 448 2^7 (FP8) or 6 2^13 (FP4),
//     under fp16's 65504); a value is exact unless its scale lies more than 22 (FP8) / 36 (FP4)
//     binades under the band's largest, where it rounds on fp16's subnormal grid (an absolute
//     error of at most 2^-32 times the band's largest scale: relative to the output's own weights);
//   - the fp16 products are exact, the tensor core accumulates them in fp32, and
//     y[r][o] = (y_hi + y_lo) 2^-(tau_r + sigma_(o / 32)) restores the scale exactly.
// So a product hi w + lo w differs from the oracle's x w by at most one ulp of x, as the oracle's own
// fp32 product rounding does; the GEMM costs 2 instead of 3 MMA passes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "core/status.h"

namespace ds41::cuda {

// x [rows, cols] fp32 -> out [3 * rows, cols] bf16 stacked per group. offsets: device int64
// [groups + 1] (offsets[0] == 0, rows == offsets[groups]) or null (one group). Non-finite x: hi
// carries it, lo and lo2 are 0 (so an inf stays inf instead of becoming inf - inf = NaN).
// rows_of (device int64 [rows], optional): row r of the split is x row rows_of[r] (the MoE's routed
// rows split straight from the token rows, without a gathered copy); null: row r.
Status run_split3_bf16(const float* x, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                       __nv_bfloat16* out, cudaStream_t stream, const int64_t* rows_of = nullptr);

// y [rows, cols] = y3_hi + (y3_lo + y3_lo2) for the stacked [3 * rows, cols] fp32 products.
Status run_sum3(const float* y3, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups, float* y,
                cudaStream_t stream);

// out [count, out_dim, in_dim] bf16: the weights weights[ids[i]] decoded exactly (as
// quant dequant_rows, then bf16, which is exact for FP8 tiles / FP4 rows / BF16). weights: DEVICE
// array; ids: device int32 [count]. Needs in_dim % 32 == 0 and 16-byte aligned payloads (the
// caller checks: tensor_core_linear.cpp's expert path); the format is read per expert.
Status run_experts_dequant_bf16(const DeviceWeight* weights, const int32_t* ids, int64_t count, int64_t out_dim,
                                int64_t in_dim, __nv_bfloat16* out, cudaStream_t stream);

// True when the two-part fp16 path takes this weight: FP8 tiles or FP4 rows, in_dim % 32 == 0,
// 16-byte aligned payload (BF16 weights keep the three-part bfloat16 split: their values need not
// fit fp16's range).
bool f16_split_supported(const DeviceWeight& w);

// x [rows, cols] fp32 -> out [2 * rows, cols] fp16 stacked per group (hi rows, then lo rows,
// starting at row 2 * off[g]) and row_shift[r] = tau of row r (x scaled by 2^tau). Non-finite x:
// hi carries it, lo is 0, and it is left out of the row's max.
Status run_split2_f16(const float* x, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                      __half* out, int32_t* row_shift, cudaStream_t stream, const int64_t* rows_of = nullptr);

// y [rows, cols] = (y2_hi + y2_lo) 2^-(row_shift[r] + group_shift[g * bands + c / 32]) for the
// stacked [2 * rows, cols] fp32 products; g is the row's group (0 without offsets), bands =
// ceil(cols / 32) (the layout the dequant launchers write).
Status run_sum2_scaled(const float* y2, int64_t rows, int64_t cols, const int64_t* offsets, int64_t groups,
                       const int32_t* row_shift, const int32_t* group_shift, float* y, cudaStream_t stream);

// One dense weight (f16_split_supported) decoded into out [out_dim, in_dim] fp16, band b of 32 rows
// times 2^sigma_b; shift[b] (device, ceil(out_dim / 32) entries) = sigma_b.
Status run_weight_dequant_f16(const DeviceWeight& w, __half* out, int32_t* shift, cudaStream_t stream);

// The experts weights[ids[i]] decoded into out [count, out_dim, in_dim] fp16, each band times its
// own 2^sigma; shifts[ids[i] * ceil(out_dim / 32) + b] (device, by expert id) = sigma of band b.
// Every expert must pass f16_split_supported (the caller checks).
Status run_experts_dequant_f16(const DeviceWeight* weights, const int32_t* ids, int64_t count, int64_t out_dim,
                               int64_t in_dim, __half* out, int32_t* shifts, cudaStream_t stream);

}  // namespace ds41::cuda
