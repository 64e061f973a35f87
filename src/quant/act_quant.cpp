// ds41 quant: the official path's block-32 FP8 activation quantization (MODEL_SPEC 3.0, Q3).
#include "quant/act_quant.h"

#include <algorithm>

#include "quant/fake_quant.h"

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

// Q_win's operator (quant/fake_quant.h) on each full block; a short last block through Q_win padded with zeros
// (a zero leaves the block's maximum, so the block takes the scale of its own values).
void act_quant_fp8_rows(const float* x, int64_t rows, int64_t k, float* out) {
  const int64_t full = k / kActQuantBlock * kActQuantBlock;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    float* yr = out + r * k;
    if (yr != xr) std::copy(xr, xr + k, yr);
    q_win_inplace(yr, full);
    if (full < k) {
      float tail[kActQuantBlock] = {};
      std::copy(yr + full, yr + k, tail);
      q_win_inplace(tail, kActQuantBlock);
      std::copy(tail, tail + (k - full), yr + full);
    }
  }
}

}  // namespace ds41::quant
