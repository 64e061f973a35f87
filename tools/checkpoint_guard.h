// ds41 CLI: the one guard against writing a huge random checkpoint by accident, used by every
// command that can generate one (`ds41 make-checkpoint`, `ds41 bench forward --preset`). The size
// comes from the tensor contract of the config (MODEL_SPEC 2), never typed in: the v41-flash
// preset is 510,286,023,000 bytes of random data, hours of writing.
// Header-only (tools/ compiles only main.cpp and cmd_*.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/tensor_contract.h"

namespace ds41::cli {

// Random checkpoints above this need --force (the small preset is 836 MB).
constexpr uint64_t kRandomCheckpointLimitBytes = 16'000'000'000ULL;

// Payload bytes of a checkpoint of `c` (the tensor contract's data, headers not counted).
inline Result<uint64_t> checkpoint_payload_bytes(const model::ModelConfig& c) {
  DS41_ASSIGN_OR_RETURN(model::LayerSchedule s, model::derive_layer_schedule(c));
  DS41_ASSIGN_OR_RETURN(model::TensorContract k, model::derive_tensor_contract(c, s));
  return k.payload_bytes();
}

// Ok when random weights for `c` stay under kRandomCheckpointLimitBytes or `force` is set, else
// InvalidArgument saying how much `preset` would write, ending with `way_out` (the flags that
// avoid it, e.g. "pass --layout-only ... or --force").
inline Status guard_random_checkpoint(const std::string& preset, const model::ModelConfig& c, bool force,
                                      const std::string& way_out) {
  if (force) return ok_status();
  DS41_ASSIGN_OR_RETURN(uint64_t bytes, checkpoint_payload_bytes(c));
  if (bytes <= kRandomCheckpointLimitBytes) return ok_status();
  std::string digits = std::to_string(bytes), grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return invalid_argument("preset " + preset + " with random data would write " + grouped + " bytes (" +
                          std::to_string(std::llround(static_cast<double>(bytes) / 1e9)) +
                          " GB) and take hours; " + way_out);
}

}  // namespace ds41::cli
