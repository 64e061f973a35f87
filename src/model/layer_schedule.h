// ds41 model: the CSA2 layer schedule derived from config.json (MODEL_SPEC 1.5). Never
// hard-code layer numbers: a KV source owns a compressor and serves every following layer up
// to the next KV source; an index source publishes top-k for every following layer up to the
// next index source; index sources that are not KV sources score against the keys of the most
// recent KV source; index sources after the candidate source are restricted to its mask.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"

namespace ds41::model {

enum class AttnMode {
  kWindowOnly,  // ratio 0: sliding window only
  kFull,        // KV source + index source: own compressor, own indexer
  kReindex,     // index source only: own indexer query, keys of the KV owner
  kReuse,       // reuses owner's compressed KV and owner's top-k selection
};
const char* attn_mode_name(AttnMode m);

struct LayerPlan {
  int64_t layer = 0;
  int64_t ratio = 0;
  AttnMode mode = AttnMode::kWindowOnly;
  bool kv_source = false;         // owns a compressor (+ indexer keys)
  bool index_source = false;      // computes its own top-k
  bool candidate_source = false;  // computes the candidate pool
  bool candidate_restricted = false;  // index source after the candidate source
  bool has_gate = false;          // compressor wgate (ratio > 1)
  bool engram = false;
  bool yarn_rope = false;         // ratio > 0: base compress_rope_theta + YaRN (MODEL_SPEC 3.4.1)
  int64_t kv_owner = -1;          // layer whose compressed KV / index keys this layer reads
  int64_t idx_owner = -1;         // layer whose top-k this layer uses
};

struct LayerSchedule {
  std::vector<LayerPlan> layers;  // backbone layers only
  std::vector<int64_t> kv_sources;
  // Human-readable table (used by `ds41 inspect`).
  std::string describe() const;
};

// Errors (with the layer named) when the config's lists contradict the rules, e.g. an index
// source before any KV source, a KV source with ratio 0, a candidate source that is not an
// index source, or a ratio-0 layer between a KV source and its users.
Result<LayerSchedule> derive_layer_schedule(const ModelConfig& c);

}  // namespace ds41::model
