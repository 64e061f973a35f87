// ds41 engine: the DSpark check run behind `ds41 score` with a {"dspark": ...} input — produces
// the arrays of the golden DSpark set under their golden names (../shared/golden/README.md,
// "DSpark set"), from the CPU reference:
//   seq.target_argmax [N]              one exact prefill of input_ids (argmax of every row)
//   context.features [N, F], context.main_x [N, H], stage{s}.window_kv [N, head_dim]
//                                      captured in that prefill (MODEL_SPEC 3.10.2-3.10.3)
//   draft.* for the anchors            the draft step at each anchor L with anchor token
//                                      input_ids[L], over the context rows of that prefill
//   walk.* (walk_steps > 0)            the real speculative loop (greedy): prefill of the first
//                                      prompt_len tokens, first anchor = the target's first
//                                      generated token, every step verified by the target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace ds41::engine {

struct DsparkScoreInput {
  std::vector<int32_t> input_ids;
  int64_t prompt_len = 0;
  std::vector<int64_t> anchors;
  int64_t walk_steps = 0;
};

struct NamedArray {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> f32;  // one of f32 / i32 is filled
  std::vector<int32_t> i32;
};

Result<std::vector<NamedArray>> dspark_score(model::Model* m, const DsparkScoreInput& in);

}  // namespace ds41::engine
