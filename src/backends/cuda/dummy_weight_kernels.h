// ds41 backends/cuda: random weights generated directly on the device (`--load-format dummy`,
// issue 10), in the checkpoint formats of MODEL_SPEC 2.1: BF16 / F32 tensors (or float32 device
// vectors), FP8 E4M3 linears with 32x32 E8M0 tiles, FP4 E2M1 expert rows with per-32 E8M0 scales,
// Engram E4M3 rows with per-32 E8M0 scales. No host copy of any weight.
//
// Values follow make-checkpoint's recipe (src/model/random_weights.cpp, golden README "How the
// weights were drawn"): the same distribution and scale per tensor role, the same per-tile /
// per-row-block gains 2^U(-1,1), then the same quantization rule (k = ceil(log2(amax / max_code)),
// codes = round(w / 2^k)) — so scales are valid E8M0 and codes valid E4M3 / E2M1. The draws come
// from a counter-based generator: element i of the tensor with stream id s under seed S is a pure
// function of (S, s, i), so a tensor is reproducible alone, in any order, in parallel. The values
// are not those of make-checkpoint's sequential generator (same distributions, other samples).
//
// Launchers as everywhere in backends/cuda: device pointers, the stream last, errors as Status,
// no allocation, no synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41::cuda {

enum class DummyDist : uint8_t {
  kNormal,       // a * N(0,1) (times the format's block gain where the recipe has one)
  kNormClamp,    // clamp(1 + 0.15 N, 0.5, 1.5) (RMSNorm weights)
  kShifted,      // b + a * N(0,1) (attention sink: 1 + N)
  kUniform,      // U(a, b)
  kEmbed,        // N(0,1) + a * d[col] (a = 0.8 sqrt(H); d the shared unit direction)
  kRouter,       // a * N(0,1) with the row's component along d projected out
  kWeightsProj,  // a * d[col] + 0.1 a * N(0,1) (a = 1/sqrt(H))
};

struct DummyParams {
  DummyDist dist = DummyDist::kNormal;
  float a = 1.0f, b = 0.0f;
  uint64_t seed = 0;                 // the user's seed
  uint64_t stream = 0;               // per tensor (the loader uses model::name_hash of the param name)
  bool gains = false;                // FP8: per 32x32 tile gain 2^U(-1,1); FP4 / Engram rows: per row per 32
  const float* direction = nullptr;  // device, dir_len floats (kEmbed, kRouter, kWeightsProj)
  int64_t dir_len = 0;
};

// A row-major [rows, cols] tensor; out_dtype kF32 or kBF16. With round_to_bf16 and kF32 output the
// float values are the BF16 roundings (a BF16 checkpoint tensor as the loader's float32 copy).
Status run_dummy_plain(const DummyParams& p, int64_t rows, int64_t cols, DType out_dtype, bool round_to_bf16,
                       void* out, cudaStream_t stream);

// FP8 linear [rows, cols]: w rows*cols bytes, scale ceil(rows/32)*ceil(cols/32) bytes.
Status run_dummy_fp8_tiles(const DummyParams& p, int64_t rows, int64_t cols, uint8_t* w, uint8_t* scale,
                           cudaStream_t stream);

// FP4 expert rows [rows, cols] (cols % 32 == 0): packed rows*cols/2 bytes (low nibble = even
// element), scale rows*cols/32 bytes.
Status run_dummy_fp4_rows(const DummyParams& p, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale,
                          cudaStream_t stream);

// Engram table [rows, dim] (dim % 32 == 0): E4M3 rows*dim bytes, E8M0 rows*dim/32 bytes.
Status run_dummy_engram_rows(const DummyParams& p, int64_t rows, int64_t dim, uint8_t* table, uint8_t* scale,
                             cudaStream_t stream);

// out[i] = bf16(U(lo, hi) of stream_a)[i] * bf16(U(lo, hi) of stream_b)[i], i < n: the Engram
// omega = q_weight * k_weight of two BF16 tensors (MODEL_SPEC 3.2.4), as the loader computes it.
Status run_dummy_uniform_product(uint64_t seed, uint64_t stream_a, uint64_t stream_b, float lo, float hi,
                                 int64_t n, float* out, cudaStream_t stream);

}  // namespace ds41::cuda
