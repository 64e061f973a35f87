// ds41 model: one call that turns a ModelConfig into a checkpoint directory — config.json (released
// nested layout), generation_config.json, and the weights of the derived tensor contract, either
// seeded random values in the official formats or, with layout_only, sparse holes (real headers,
// no data blocks). Used by `ds41 make-checkpoint` and by anything that needs a model on the fly
// (e.g. a command that creates the tiny checkpoint when it is absent).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "model/config.h"

namespace ds41::model {

struct MakeCheckpointOptions {
  uint64_t seed = 1;
  int shards = 1;
  bool layout_only = false;
  std::function<void(uint64_t done, uint64_t total)> progress;  // optional
};

struct MadeCheckpoint {
  uint64_t tensor_count = 0;
  uint64_t payload_bytes = 0;
  int shards = 0;
};

// Validates the config (parse round trip, schedule, contract), then writes dir (created if absent).
// Fails without touching dir if it already holds a config.json or safetensors files.
Result<MadeCheckpoint> make_checkpoint(const std::string& dir, const ModelConfig& config,
                                       const MakeCheckpointOptions& options);

}  // namespace ds41::model
