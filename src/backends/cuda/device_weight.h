// ds41 backends/cuda: DeviceWeight — one linear weight on the device in its checkpoint format
// (MODEL_SPEC 2.1). Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the
// stream last, errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op
// in src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "quant/weight_format.h"

namespace ds41::cuda {

// POD: may be copied into device arrays (grouped expert launches).
struct DeviceWeight {
  quant::WeightFormat format = quant::WeightFormat::kNone;  // kF32, kBF16, kFp8Tiles, kFp4Rows
  int64_t out_dim = 0, in_dim = 0;
  const uint8_t* data = nullptr;   // payload in the checkpoint format
  const uint8_t* scale = nullptr;  // E8M0 scales (FP8 tiles / FP4 rows), else null
  bool present() const { return format != quant::WeightFormat::kNone; }
};

}  // namespace ds41::cuda
