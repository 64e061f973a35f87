// ds41 backends/cuda: the fake-quant operators Q_win / Q_kv / Q_idx on the GPU (MODEL_SPEC 3.9)
// writing the packed row layouts of src/quant/fake_quant.h (528 B window rows, 288 B main KV
// rows, 68 B indexer key rows at the released sizes; MODEL_SPEC 5.2), and the decoders back to
// float32 / bfloat16. Bit-identical to src/quant (tests/parity/cuda). Also elementwise E4M3 /
// E2M1 encoders (the scalar casts used by those operators).
// plan_*() validates and sizes on the CPU; run_*() takes device pointers only (graph-capturable,
// no allocation, no synchronisation).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41::cuda {

enum class FakeQuantOp : uint8_t { kWin, kKv, kIdx };

struct FakeQuantPlan {
  FakeQuantOp op = FakeQuantOp::kWin;
  int64_t n = 0;  // channels per row (multiple of the op's block: 32 / 16 / 32)
  int64_t rows = 0;
  int64_t row_bytes = 0;  // bytes of one packed row
  int threads = 256;
};

// x: rows x n float32 (row-major, contiguous) -> rows x row_bytes packed bytes.
Result<FakeQuantPlan> plan_fake_quant(FakeQuantOp op, int64_t n, int64_t rows);
Status run_fake_quant_encode(const FakeQuantPlan& plan, const float* x, uint8_t* packed_rows,
                             cudaStream_t stream);
// packed rows -> rows x n values of out_dtype (kF32 or kBF16).
Status run_fake_quant_decode(const FakeQuantPlan& plan, const uint8_t* packed_rows, DType out_dtype,
                             void* out, cudaStream_t stream);

// Elementwise casts with the contracts of quant::e4m3_from_float / quant::e2m1_from_float
// (one code per byte for E2M1). n values.
Status run_e4m3_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream);
Status run_e2m1_encode(const float* x, int64_t n, uint8_t* codes, cudaStream_t stream);

// The official path's activation quantization (--numerics fp8-act, quant/act_quant.h): out[r, :] =
// quant::act_quant_fp8_rows of x[r, :] (rows x k, blocks of 32 along k, a short last block with its own
// scale), bit for bit; out may alias x. One warp per block of 32.
Status run_act_quant_rows(const float* x, int64_t rows, int64_t k, float* out, cudaStream_t stream);

}  // namespace ds41::cuda
