// The bits of a float, for bit-for-bit comparisons in tests (one definition for every test folder:
// a unity translation unit may hold several test files, CMakeLists.txt "Unity builds").
#pragma once

#include <bit>
#include <cstdint>

namespace ds41::testing {

inline uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace ds41::testing
