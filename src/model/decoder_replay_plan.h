// ds41 model: DecoderReplayPlan — the shape of MODEL_SPEC 4.4 decoder SWA bounded replay of a
// fresh sequence, derived from the config and the layer schedule alone. One definition for both
// engines (model::Model::prefill_decoder_replay, the CPU reference, and
// gpu::CudaEngine::prefill_decoder_replay), so they cut at the same layer, keep the same rows,
// floor the same windows and refuse the same configs with the same messages:
//   cut        = the last KV source: layers 0..cut run on every prompt row (its compressor
//                publishes the complete global KV; its own attention / MoE run on every row too,
//                vLLM's and fastllm's cut, MODEL_SPEC Q4);
//   keep       = min(sliding_window, tokens): the last rows, the only ones layers > cut run on;
//   first_kept = tokens - keep: the window floor of every layer > cut (max with an existing
//                floor; it stays in the sequence state for the steps that follow).
// Refused (FailedPrecondition) when the model has no KV source, or an Engram layer lies after the
// cut (its look-back would need the rows that are dropped: MODEL_SPEC 4.4).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/status.h"
#include "model/config.h"
#include "model/layer_schedule.h"

namespace ds41::model {

struct DecoderReplayPlan {
  int64_t cut = 0;         // last layer run on every row
  int64_t keep = 0;        // rows the layers after the cut run on (the last ones)
  int64_t first_kept = 0;  // position of the first kept row = the floor of layers > cut
  int64_t tokens = 0;

  // The window floor of layer l after the replay, given the floor it had before.
  int64_t floor_after(int64_t l, int64_t floor_before) const {
    return l > cut ? std::max(floor_before, first_kept) : floor_before;
  }
};

// `tokens`: the prompt length (an empty prompt is the caller's error to report).
Result<DecoderReplayPlan> plan_decoder_replay(const ModelConfig& c, const LayerSchedule& s, int64_t tokens);

}  // namespace ds41::model
