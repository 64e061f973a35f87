// ds41 quant: the unscaled and Engram rows of the weight-format traits table (weight_format.h);
// the FP8 tile and FP4 row dequantizers live in weight_formats.cpp.
#include "quant/weight_format.h"

#include <cstring>

#include "core/dtype.h"
#include "quant/weight_formats.h"

namespace ds41::quant {

static_assert(weight_format_traits(WeightFormat::kFp4Rows).format == WeightFormat::kFp4Rows &&
                  weight_format_traits(WeightFormat::kEngramRows).format == WeightFormat::kEngramRows,
              "kWeightFormatTraits rows must be in enum order");

void f32_dequant_rows(const uint8_t* data, const uint8_t*, int64_t, int64_t in_dim, int64_t row_begin,
                      int64_t row_end, float* out) {
  std::memcpy(out, data + row_begin * in_dim * 4, static_cast<size_t>((row_end - row_begin) * in_dim) * 4);
}

void bf16_dequant_rows(const uint8_t* data, const uint8_t*, int64_t, int64_t in_dim, int64_t row_begin,
                       int64_t row_end, float* out) {
  for (int64_t i = row_begin * in_dim; i < row_end * in_dim; ++i) {
    uint16_t v;
    std::memcpy(&v, data + 2 * i, 2);
    out[i - row_begin * in_dim] = bf16_to_f32(v);
  }
}

void engram_dequant_rows(const uint8_t* data, const uint8_t* scale, int64_t, int64_t in_dim,
                         int64_t row_begin, int64_t row_end, float* out) {
  const int64_t nb = in_dim / kEngramBlock;
  for (int64_t r = row_begin; r < row_end; ++r)
    engram_row_dequant(data + r * in_dim, scale + r * nb, in_dim, out + (r - row_begin) * in_dim);
}

}  // namespace ds41::quant
