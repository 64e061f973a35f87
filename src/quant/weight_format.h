// ds41 quant: the one table of linear-weight storage formats (MODEL_SPEC 2.1). Every layer that
// names a format uses this enum (ops::WeightRef, the CPU reference, the CUDA dequantizers); a
// format's storage facts (bits per value, scale block shape, scale layout) and its host
// reference dequantizer are one row of kWeightFormatTraits (ARCHITECTURE "add a weight or KV
// format: quant/<format>.h + traits row").
#pragma once

#include <array>
#include <cstdint>

#include "quant/weight_formats.h"

namespace ds41::quant {

enum class WeightFormat : uint8_t {
  kNone,        // absent
  kF32,         // float32 [out, in]
  kBF16,        // bfloat16 [out, in]
  kFp8Tiles,    // E4M3 [out, in] + E8M0 [ceil(out/32), ceil(in/32)]
  kFp4Rows,     // packed E2M1 [out, in/2] + E8M0 [out, in/32]
  kEngramRows,  // E4M3 [rows, dim] + E8M0 [rows, dim/32] (Engram tables, gathered by row id)
};
inline constexpr int kWeightFormatCount = 6;

// Where the E8M0 scales of a block-quantized format live.
enum class ScaleLayout : uint8_t {
  kNone,       // unscaled (f32, bf16)
  kTiles,      // one scale per block_rows x block_cols tile, [ceil(out/br), ceil(in/bc)]
  kRowBlocks,  // one scale per row per block_cols inputs, [out, in/bc] (in % bc == 0)
};

// Rows [row_begin, row_end) of an [out_dim, in_dim] weight, dequantized to float32 row-major.
using DequantRowsFn = void (*)(const uint8_t* data, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                               int64_t row_begin, int64_t row_end, float* out);

struct WeightFormatTraits {
  WeightFormat format;
  const char* name;
  int bits_per_value;        // payload bits per weight value (4 for packed E2M1)
  ScaleLayout scale_layout;  // kNone: block_rows = block_cols = 0
  int block_rows, block_cols;
  bool in_must_divide_block;   // in_dim % block_cols == 0 is part of the format's contract
  DequantRowsFn dequant_rows;  // host reference (bit-exact oracle of every backend); null for kNone
};

void f32_dequant_rows(const uint8_t* data, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                      int64_t row_begin, int64_t row_end, float* out);
void bf16_dequant_rows(const uint8_t* data, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                       int64_t row_begin, int64_t row_end, float* out);
void engram_dequant_rows(const uint8_t* data, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                         int64_t row_begin, int64_t row_end, float* out);
// fp8_tiles_dequant_rows / fp4_rows_dequant_rows: quant/weight_formats.h (same signature).

// Indexed by static_cast<int>(WeightFormat).
inline constexpr std::array<WeightFormatTraits, kWeightFormatCount> kWeightFormatTraits = {{
    {WeightFormat::kNone, "none", 0, ScaleLayout::kNone, 0, 0, false, nullptr},
    {WeightFormat::kF32, "f32", 32, ScaleLayout::kNone, 0, 0, false, &f32_dequant_rows},
    {WeightFormat::kBF16, "bf16", 16, ScaleLayout::kNone, 0, 0, false, &bf16_dequant_rows},
    {WeightFormat::kFp8Tiles, "fp8-tiles-32", 8, ScaleLayout::kTiles, 32, 32, false, &fp8_tiles_dequant_rows},
    {WeightFormat::kFp4Rows, "fp4-rows-32", 4, ScaleLayout::kRowBlocks, 1, 32, true, &fp4_rows_dequant_rows},
    {WeightFormat::kEngramRows, "engram-rows-32", 8, ScaleLayout::kRowBlocks, 1, 32, true,
     &engram_dequant_rows},
}};

constexpr const WeightFormatTraits& weight_format_traits(WeightFormat f) {
  return kWeightFormatTraits[static_cast<int>(f)];
}
constexpr const char* weight_format_name(WeightFormat f) { return weight_format_traits(f).name; }

// Bytes of the payload / of the E8M0 scales of an [out_dim, in_dim] weight.
constexpr int64_t weight_payload_bytes(WeightFormat f, int64_t out_dim, int64_t in_dim) {
  return out_dim * in_dim * weight_format_traits(f).bits_per_value / 8;
}
constexpr int64_t weight_scale_bytes(WeightFormat f, int64_t out_dim, int64_t in_dim) {
  const WeightFormatTraits& t = weight_format_traits(f);
  switch (t.scale_layout) {
    case ScaleLayout::kNone: return 0;
    case ScaleLayout::kTiles:
      return ((out_dim + t.block_rows - 1) / t.block_rows) * ((in_dim + t.block_cols - 1) / t.block_cols);
    case ScaleLayout::kRowBlocks: return out_dim * (in_dim / t.block_cols);
  }
  return 0;
}

}  // namespace ds41::quant
