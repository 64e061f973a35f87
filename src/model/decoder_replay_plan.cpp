// ds41 model: DecoderReplayPlan (decoder_replay_plan.h), MODEL_SPEC 4.4.
#include "model/decoder_replay_plan.h"

#include <algorithm>
#include <string>

namespace ds41::model {

Result<DecoderReplayPlan> plan_decoder_replay(const ModelConfig& c, const LayerSchedule& s, int64_t tokens) {
  if (s.kv_sources.empty()) return failed_precondition("decoder replay: the model has no KV source");
  const int64_t cut = s.kv_sources.back();
  for (int64_t l : c.engram_layer_ids)
    if (l > cut)
      return failed_precondition("decoder replay: Engram layer " + std::to_string(l) +
                                 " lies after the cut at layer " + std::to_string(cut) + " (MODEL_SPEC 4.4)");
  DecoderReplayPlan p;
  p.cut = cut;
  p.tokens = tokens;
  p.keep = std::clamp<int64_t>(tokens, 0, c.sliding_window);
  p.first_kept = tokens - p.keep;
  return p;
}

}  // namespace ds41::model
