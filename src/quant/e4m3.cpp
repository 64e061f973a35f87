// ds41 quant: E4M3 table and RNE encoder.
#include "quant/e4m3.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace ds41::quant {
namespace {
struct E4M3Table {
  float v[256];
  E4M3Table() {
    for (int c = 0; c < 256; ++c) {
      int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
      float x;
      if (e == 15 && m == 7)
        x = std::numeric_limits<float>::quiet_NaN();
      else if (e == 0)
        x = std::ldexp(static_cast<float>(m), -9);  // m/8 * 2^-6
      else
        x = std::ldexp(1.0f + m / 8.0f, e - 7);
      v[c] = s ? -x : x;
    }
  }
};
}  // namespace

const float* e4m3_table() {
  static const E4M3Table t;
  return t.v;
}

uint8_t e4m3_from_float(float x) {
  if (std::isnan(x)) return 0x7f;
  uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (a >= kE4M3Max) return sign | 0x7e;
  int code;
  if (a < 0x1p-6f) {
    // Subnormal range: units of 2^-9, round half to even (nearbyint in the default mode).
    // m == 8 rolls over into the first normal (code 8), which is what the formula gives.
    code = static_cast<int>(std::nearbyint(a * 512.0f));
  } else {
    int e;
    float fr = std::frexp(a, &e);          // a = fr * 2^e, fr in [0.5, 1)
    int exp_field = e - 1 + 7;             // a = (2 fr) * 2^(e-1)
    float mant = (2.0f * fr - 1.0f) * 8.0f;  // exact: 2fr has 24 significant bits
    int m = static_cast<int>(std::nearbyint(mant));
    code = (exp_field << 3) + m;           // m == 8 carries into the exponent
    if (code > 0x7e) code = 0x7e;          // [448, 480) rounds to 448 (no 0x7f: NaN)
  }
  return sign | static_cast<uint8_t>(code);
}

}  // namespace ds41::quant
