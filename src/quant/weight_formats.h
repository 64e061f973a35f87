// ds41 quant: the three checkpoint weight formats (MODEL_SPEC 2.1) — dequantization to float32
// (the CPU reference's exact path) and quantization (used by `ds41 make-checkpoint`).
//   FP8 linear:      weight E4M3 [out, in], scale E8M0 [ceil(out/32), ceil(in/32)] (32x32 tiles)
//   FP4 expert:      weight I8 [out, in/2] packed E2M1, scale E8M0 [out, in/32] (per row per 32 inputs)
//   Engram rows:     table E4M3 [rows, dim], scale E8M0 [rows, dim/32]
// Functions here never allocate: callers pass output buffers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ds41::quant {

inline constexpr int kFp8Tile = 32;
inline constexpr int kFp4Block = 32;
inline constexpr int kEngramBlock = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [row_begin, row_end) of an FP8 linear into out (row-major, (row_end-row_begin) x in).
void fp8_tiles_dequant_rows(const uint8_t* w, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                            int64_t row_begin, int64_t row_end, float* out);
// Quantize a float32 [out, in] matrix: per 32x32 tile k = ceil(log2(amax/448)) (k = -127 for an
// all-zero tile), codes = e4m3_rne(w / 2^k). w_q: out*in bytes; scale: ceil(out/32)*ceil(in/32).
void fp8_tiles_quantize(const float* w, int64_t out_dim, int64_t in_dim, uint8_t* w_q, uint8_t* scale);

// Rows [row_begin, row_end) of an FP4 expert linear (in_dim % 32 == 0).
void fp4_rows_dequant_rows(const uint8_t* packed, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                           int64_t row_begin, int64_t row_end, float* out);
// Per row per 32 inputs k = ceil(log2(amax/6)); packed: out*in/2 bytes; scale: out*in/32.
void fp4_rows_quantize(const float* w, int64_t out_dim, int64_t in_dim, uint8_t* packed, uint8_t* scale);

// One Engram table row of dim values (dim % 32 == 0).
void engram_row_dequant(const uint8_t* row, const uint8_t* row_scale, int64_t dim, float* out);
void engram_rows_quantize(const float* w, int64_t rows, int64_t dim, uint8_t* q, uint8_t* scale);

// Exact ceil(log2(a)) for positive finite a, clamped to [-127, 127] (weight quantizers).
int ceil_log2_clamped(double a);

}  // namespace ds41::quant
