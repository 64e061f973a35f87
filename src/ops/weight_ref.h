// ds41 ops: WeightRef — a non-owning view of one linear weight in its checkpoint format
// (MODEL_SPEC 2.1). The model passes weights to backends in this form so that a backend may
// keep them quantized and dequantize where it computes (ARCHITECTURE "Quantized weights stay
// quantized"); the CPU reference may cache a float32 copy.
#pragma once

#include <cstdint>
#include <string>

#include "quant/weight_format.h"

namespace ds41::ops {

// The format table is owned by quant (quant/weight_format.h); ops re-exports its names.
using quant::weight_format_name;
using quant::WeightFormat;

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
