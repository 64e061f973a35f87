// ds41 backends/cuda: device helpers of `ds41 bench kernels` (tools/cmd_bench_kernels.cpp): the
// streaming copy kernel whose bandwidth is the HBM roofline term of the benchmark, seeded fills of
// weight payloads / activations, and the activation conversions the cuBLASLt reference needs (BF16,
// FP8 E4M3). Launchers as everywhere in this folder: device pointers, the stream last, errors as
// Status, no allocation or synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// dst[i] = src[i] for i < n floats (16-byte loads/stores where both are 16-byte aligned and
// n % 4 == 0; a grid-stride loop sized for a full device).
Status run_copy_f32(const float* src, float* dst, int64_t n, cudaStream_t stream);

// p[i] = base + (hash(seed, i) & mask) for n bytes (weight payloads: FP8 E4M3 with mask 0xf7 has
// no NaN; E8M0 scales as base 120, mask 7).
Status run_fill_bytes(uint8_t* p, int64_t n, uint64_t seed, uint8_t base, uint8_t mask, cudaStream_t stream);

// p[i] uniform in [-scale, scale) from hash(seed, i): float32, or bfloat16 bits.
Status run_fill_uniform_f32(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream);
Status run_fill_uniform_bf16(uint16_t* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream);

// Conversions of float32 activations: to bfloat16 bits (RNE) and to FP8 E4M3 (RNE, saturating).
Status run_f32_to_bf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);
Status run_f32_to_e4m3(const float* src, uint8_t* dst, int64_t n, cudaStream_t stream);

}  // namespace ds41::cuda
