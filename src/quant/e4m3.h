// ds41 quant: OCP FP8 E4M3 "FN" (MODEL_SPEC 2.1): 1 sign, 4 exponent (bias 7), 3 mantissa bits,
// max finite 448, no infinities; 0x7f / 0xff are NaN. Encoding rounds to nearest, ties to even.
#pragma once

#include <cstdint>

namespace ds41::quant {

inline constexpr float kE4M3Max = 448.0f;

// Decoded value of every byte (NaN for 0x7f, 0xff).
const float* e4m3_table();
inline float e4m3_to_float(uint8_t b) { return e4m3_table()[b]; }

// Round-to-nearest-even encoding of a float. |x| > 448 (and +-inf) saturates to +-448 — callers
// of the model's fake-quant clamp first anyway (MODEL_SPEC 3.9). NaN encodes as 0x7f. The sign
// of zero is kept (-0.0 -> 0x80).
uint8_t e4m3_from_float(float x);

// e4m3_to_float(e4m3_from_float(x)).
inline float e4m3_round(float x) { return e4m3_to_float(e4m3_from_float(x)); }

}  // namespace ds41::quant
