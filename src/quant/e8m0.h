// ds41 quant: E8M0 (UE8M0) scale bytes (MODEL_SPEC 2.1): byte b encodes 2^(b-127); 0xff is NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace ds41::quant {

inline float e8m0_to_float(uint8_t b) {
  if (b == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(b) - 127);  // 2^-127 is a float subnormal: exact
}
inline int e8m0_exponent(uint8_t b) { return static_cast<int>(b) - 127; }
// Exponent k in [-127, 127] -> byte k + 127.
inline uint8_t e8m0_from_exponent(int k) { return static_cast<uint8_t>(k + 127); }

// pow2ceil(t) of MODEL_SPEC 3.9 for a normal positive float t: 2^k with k = (biased exponent
// - 127) + (mantissa != 0). Returns the exponent k.
int pow2ceil_exponent(float t);
inline float pow2ceil(float t) { return std::ldexp(1.0f, pow2ceil_exponent(t)); }

}  // namespace ds41::quant
