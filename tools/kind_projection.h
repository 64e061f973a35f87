// ds41 tools: measured per layer kind on a layer slice, projected to a whole model's schedule (issue
// 11, "Report": reported per layer kind, so it projects to the 40-layer model). The GPU benchmarks
// measure each layer kind of the slice; this file sums those measurements over a target schedule
// (the released 40 layers):
//   prefill (`ds41 bench prefill`): the seconds of each kind over the prompt (the exact prefill,
//     every row through every layer) and over one window of rows at the prompt's end (the rows the
//     decoder layers of MODEL_SPEC 4.4's decoder bounded replay run on):
//       exact          = sum over every layer of its kind's prompt time + the head;
//       decoder replay = sum over layers 0..cut of the prompt time + sum over layers > cut of the
//                        window time + the head, where cut is plan_decoder_replay's (the last KV
//                        source: layer 20 in the release), the plan both engines execute;
//   decode (`ds41 bench decode`): each kind's median layer time and roofline bytes.
// A target kind the slice does not have is estimated from its nearest measured kind and named in
// `approximated` (the release's Full ratio-2 layers without Engram: the slice's Full ratio-2 layer
// carries Engram, so its value less the Engram delta measured between the two window-only layers).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/status.h"
#include "model/config.h"
#include "model/layer_schedule.h"

namespace ds41::cli {

// "window-only", "full/r2+engram", "reuse/r1", "full/r1+cand", "reindex/r1", ... (the key of every
// per-kind map of the GPU benchmarks).
std::string layer_kind(const model::LayerPlan& p);

// Seconds of ONE layer of each kind: over the whole prompt, and over one window of rows at its end.
struct KindSeconds {
  std::map<std::string, double> prompt;
  std::map<std::string, double> window;
};

struct PrefillProjection {
  int64_t tokens = 0;
  int64_t layers = 0;
  int64_t cut = -1;  // decoder replay's last layer on every row (-1: the target cannot replay)
  std::string replay_refused;  // why, when cut == -1
  double exact_s = 0, exact_tokens_per_s = 0;
  double replay_s = 0, replay_tokens_per_s = 0;
  std::map<std::string, int64_t> layers_per_kind;
  std::map<std::string, std::string> approximated;  // target kind -> how its seconds were estimated
};

// `head_s`: the head's seconds for the prompt (added to both). Errors name a target kind with no
// measurement and no estimate, and a negative or non-finite time.
Result<PrefillProjection> project_prefill(const model::ModelConfig& target, const model::LayerSchedule& schedule,
                                          int64_t tokens, const KindSeconds& measured, double head_s);

// A decode step projected the same way (`ds41 bench decode`): per layer of each kind its median
// milliseconds and the bytes it must read (the roofline terms); the step adds the head's and the
// rest of the step's measured milliseconds. roofline = the layers' bytes / bandwidth.
struct DecodeProjection {
  int64_t layers = 0;
  double layers_ms = 0, step_ms = 0, layers_bytes = 0, layers_roofline_ms = 0, layers_roofline_ratio = 0;
  std::map<std::string, int64_t> layers_per_kind;
  std::map<std::string, std::string> approximated;
};
Result<DecodeProjection> project_decode(const model::LayerSchedule& schedule,
                                        const std::map<std::string, double>& ms_per_layer,
                                        const std::map<std::string, double>& bytes_per_layer, double head_ms,
                                        double outside_ms, double bandwidth_bytes_per_s);

}  // namespace ds41::cli
