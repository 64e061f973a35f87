// ds41 quant: the official path's block-32 FP8 activation quantization (MODEL_SPEC 3.0, Q3).
#include "quant/act_quant.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "quant/e4m3.h"
#include "quant/e8m0.h"

namespace ds41::quant {

const char* act_numerics_name(ActNumerics a) {
  switch (a) {
    case ActNumerics::kExact: return "exact";
    case ActNumerics::kFp8Block32: return "fp8-act";
  }
  return "?";
}

Result<ActNumerics> parse_act_numerics(std::string_view s) {
  if (s == "exact") return ActNumerics::kExact;
  if (s == "fp8-act") return ActNumerics::kFp8Block32;
  return invalid_argument("unknown numerics '" + std::string(s) +
                                  "' (accepted: exact, fp8-act)");
}

void act_quant_fp8_rows(const float* x, int64_t rows, int64_t k, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    float* yr = out + r * k;
    for (int64_t b0 = 0; b0 < k; b0 += kActQuantBlock) {
      const int64_t b1 = std::min(k, b0 + kActQuantBlock);
      float a = 0.0f;
      for (int64_t i = b0; i < b1; ++i) {
        const float v = std::fabs(xr[i]);
        if (v > a) a = v;  // false for NaN
      }
      a = std::max(std::min(a, FLT_MAX), 1e-4f);
      const float s = std::ldexp(1.0f, pow2ceil_exponent(a * (1.0f / 448.0f)));
      for (int64_t i = b0; i < b1; ++i) {
        const float v = xr[i];
        yr[i] = std::isnan(v) ? v : e4m3_round(std::clamp(v / s, -448.0f, 448.0f)) * s;
      }
    }
  }
}

}  // namespace ds41::quant
