// ds41 quant: FP4 E2M1 codes (MODEL_SPEC 2.1, 3.9). Bit 3 = sign, bits 0..2 index the magnitudes
// {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Packed two per byte: byte j holds element 2j in its LOW nibble and
// element 2j+1 in its high nibble (MODEL_SPEC 7.17).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace ds41::quant {

inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

inline float e2m1_to_float(uint8_t code) {
  float m = kE2M1Magnitudes[code & 7];
  return (code & 8) ? -m : m;
}

// Round to nearest; exact midpoints go to the neighbour with the even code index
// (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). |x| > 6 and inf saturate to 6.
// NaN encodes as +0 (code 0): E2M1 has no NaN; callers never produce one from finite input.
inline uint8_t e2m1_from_float(float x) {
  if (std::isnan(x)) return 0;
  uint8_t sign = std::signbit(x) ? 8 : 0;
  float a = std::fabs(x);
  uint8_t c = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
            : a <= 2.5f  ? 4 : a < 3.5f  ? 5 : a <= 5.0f  ? 6 : 7;
  return sign | c;
}
inline float e2m1_round(float x) { return e2m1_to_float(e2m1_from_float(x)); }

// Pack n codes (n even) into n/2 bytes, low nibble = even element.
inline void e2m1_pack(const uint8_t* codes, size_t n, uint8_t* out) {
  for (size_t j = 0; j < n / 2; ++j) out[j] = static_cast<uint8_t>((codes[2 * j] & 15) | ((codes[2 * j + 1] & 15) << 4));
}
inline uint8_t e2m1_unpack_at(const uint8_t* packed, size_t i) {
  uint8_t b = packed[i >> 1];
  return (i & 1) ? (b >> 4) : (b & 15);
}

}  // namespace ds41::quant
