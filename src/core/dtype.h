// ds41 core: element types of checkpoint / activation tensors and their safetensors names.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace ds41 {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kF8E4M3, kF8E8M0, kI8, kU8, kI16, kI32, kI64, kU32, kU64, kBool };

// Size in bytes of one element.
size_t dtype_size(DType t);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", ...).
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

// bfloat16 <-> float32 (round to nearest even; NaN stays NaN).
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace ds41
