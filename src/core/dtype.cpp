// ds41 core: dtype tables.
#include "core/dtype.h"

namespace ds41 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kBF16: case DType::kF16: case DType::kI16: return 2;
    case DType::kF8E4M3: case DType::kF8E8M0: case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI16: return "I16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU32: return "U32";
    case DType::kU64: return "U64";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  static const DType all[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kF8E4M3,
                              DType::kF8E8M0, DType::kI8, DType::kU8, DType::kI16, DType::kI32,
                              DType::kI64, DType::kU32, DType::kU64, DType::kBool};
  for (DType t : all)
    if (n == dtype_name(t)) return t;
  return std::nullopt;
}

}  // namespace ds41
