// ds41 ops: WeightRef — a non-owning view of one linear weight in its checkpoint format
// (MODEL_SPEC 2.1). The model passes weights to backends in this form so that a backend may
// keep them quantized and dequantize where it computes (ARCHITECTURE "Quantized weights stay
// quantized"); the CPU reference may cache a float32 copy.
#pragma once

#include <cstdint>
#include <string>

namespace ds41::ops {

enum class WeightFormat : uint8_t {
  kNone,      // absent
  kF32,       // float32 [out, in]
  kBF16,      // bfloat16 [out, in]
  kFp8Tiles,  // E4M3 [out, in] + E8M0 [ceil(out/32), ceil(in/32)]
  kFp4Rows,   // packed E2M1 [out, in/2] + E8M0 [out, in/32]
};
const char* weight_format_name(WeightFormat f);

struct WeightRef {
  WeightFormat format = WeightFormat::kNone;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;  // FP8 / FP4 only
  int64_t out_dim = 0;
  int64_t in_dim = 0;
  const char* name = "";  // checkpoint tensor base name (points into the weights view)

  bool present() const { return format != WeightFormat::kNone; }
  // Bytes of the weight payload (+ scales).
  int64_t bytes() const;
};

}  // namespace ds41::ops
