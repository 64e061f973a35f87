// ds41 ops: WeightRef helpers.
#include "ops/weight_ref.h"

namespace ds41::ops {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kNone: return "none";
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kBF16: return "bf16";
    case WeightFormat::kFp8Tiles: return "fp8-tiles-32";
    case WeightFormat::kFp4Rows: return "fp4-rows-32";
  }
  return "?";
}

int64_t WeightRef::bytes() const {
  const int64_t n = out_dim * in_dim;
  switch (format) {
    case WeightFormat::kNone: return 0;
    case WeightFormat::kF32: return 4 * n;
    case WeightFormat::kBF16: return 2 * n;
    case WeightFormat::kFp8Tiles: return n + ((out_dim + 31) / 32) * ((in_dim + 31) / 32);
    case WeightFormat::kFp4Rows: return n / 2 + out_dim * (in_dim / 32);
  }
  return 0;
}

}  // namespace ds41::ops
