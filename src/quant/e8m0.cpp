// ds41 quant: pow2ceil on the float's bit pattern (MODEL_SPEC 3.9), exactly as the reference
// computes it from the biased exponent and mantissa bits.
#include "quant/e8m0.h"

#include <cstring>

namespace ds41::quant {

int pow2ceil_exponent(float t) {
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  int e = static_cast<int>((bits >> 23) & 0xff) - 127;
  return e + ((bits & 0x7fffff) != 0 ? 1 : 0);
}

}  // namespace ds41::quant
