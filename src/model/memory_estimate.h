// ds41 model: how much memory a checkpoint needs before it is loaded — weights (the safetensors
// files' sizes, sparse layout-only files included at their full length), KV for the requested
// context (KvLayout: global bytes per token x tokens + the window rings, per sequence) and a
// rough workspace allowance — and the check that refuses a model that cannot fit.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ds41::model {

struct MemoryEstimate {
  uint64_t weights_bytes = 0;
  uint64_t kv_bytes = 0;
  uint64_t workspace_bytes = 0;
  int64_t context_tokens = 0;
  uint64_t total() const { return weights_bytes + kv_bytes + workspace_bytes; }
};

// Reads DIR/config.json and the sizes of DIR/*.safetensors.
Result<MemoryEstimate> estimate_model_memory(const std::string& dir, int64_t context_tokens,
                                             int64_t sequences = 1);

// "12.3 GB", or "268.4 MB" below 1 GB (decimal units, as disks and `free --si` count).
std::string format_gb(uint64_t bytes);

// ResourceExhausted naming every number when `e.total()` exceeds `available_bytes`
// ("model needs 512.1 GB (weights 510.3 GB, KV for 4096 tokens 0.1 GB, workspaces 1.7 GB) but
// only 23.0 GB is available on this machine"), else ok.
Status check_memory_fits(const MemoryEstimate& e, uint64_t available_bytes, const std::string& where);

}  // namespace ds41::model
