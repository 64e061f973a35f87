// ds41 backends/cuda: dequantization of the checkpoint weight formats on the GPU
// (MODEL_SPEC 2.1) to float32 or bfloat16, bit-identical to src/quant/weight_formats (the bf16
// output is the RNE rounding of that float32, which is exact for every finite result).
//   FP8 linear:   E4M3 [out, in] + E8M0 [ceil(out/32), ceil(in/32)]  -> rows [row_begin, row_end)
//   FP4 expert:   packed E2M1 [out, in/2] + E8M0 [out, in/32]        -> rows [row_begin, row_end)
//   Engram rows:  E4M3 [rows, dim] + E8M0 [rows, dim/32], gathered by row id
// Launchers are split as ARCHITECTURE.md asks: plan_*() validates shapes and computes the launch
// geometry on the CPU; run_*() takes device pointers only, never allocates or synchronises, and
// may be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"
#include "quant/weight_format.h"

namespace ds41::cuda {

// The format table is quant's (quant/weight_format.h): the plans below cover kFp8Tiles,
// kFp4Rows and kEngramRows, and their device kernels are bit-identical to the traits table's
// host dequant_rows.
using quant::WeightFormat;

struct WeightDequantPlan {
  WeightFormat format = WeightFormat::kFp8Tiles;
  DType out_dtype = DType::kF32;       // kF32 or kBF16
  int64_t out_dim = 0, in_dim = 0;     // Engram: table rows, dim
  int64_t row_begin = 0, row_end = 0;  // Engram: number of ids in [0, row_end)
  bool vec16 = false;                  // FP8/Engram: 16 bytes per thread (in_dim % 16 == 0)
  int64_t work_items = 0;              // threads needed on the vector path (or per element otherwise)
  int64_t scalar_items = 0;            // threads needed on the per-element fallback (unaligned pointers)
  int threads = 256;
};

// FP8 32x32-tile linear; out receives (row_end - row_begin) x in_dim values, row-major.
Result<WeightDequantPlan> plan_fp8_tiles_dequant(int64_t out_dim, int64_t in_dim, int64_t row_begin,
                                                 int64_t row_end, DType out_dtype);
Status run_fp8_tiles_dequant(const WeightDequantPlan& plan, const uint8_t* w, const uint8_t* scale, void* out,
                             cudaStream_t stream);

// FP4 expert rows (in_dim % 32 == 0); same output layout.
Result<WeightDequantPlan> plan_fp4_rows_dequant(int64_t out_dim, int64_t in_dim, int64_t row_begin,
                                                int64_t row_end, DType out_dtype);
Status run_fp4_rows_dequant(const WeightDequantPlan& plan, const uint8_t* packed, const uint8_t* scale,
                            void* out, cudaStream_t stream);

// Engram table rows (dim % 32 == 0) gathered by n_ids row ids into out [n_ids, dim]. An id
// outside [0, table_rows) yields a row of NaN (a visible poison value; callers validate ids).
Result<WeightDequantPlan> plan_engram_rows_dequant(int64_t table_rows, int64_t dim, int64_t n_ids,
                                                   DType out_dtype);
Status run_engram_rows_dequant(const WeightDequantPlan& plan, const uint8_t* table, const uint8_t* scale,
                               const int64_t* ids, void* out, cudaStream_t stream);

}  // namespace ds41::cuda
