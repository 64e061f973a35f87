// ds41 gpu: gpu_dspark_score — the DSpark check behind `ds41 score --device cuda` with a
// {"dspark": ...} input: the arrays of engine/dspark_score.h (golden "DSpark set" names) from the
// GPU engine instead of the CPU reference:
//   seq.target_argmax, context.features, context.main_x, stage{s}.window_kv
//       one prefill of input_ids through CudaEngine::forward in chunks of at most `window` rows
//       (chunked prefill is exact, MODEL_SPEC 4.2), reading after each chunk the captured features
//       (last_features), the main_x rows its commit computed (last_main_x) and the stages' packed
//       window rows of the chunk's positions (draft_window_rows, decoded from Q_win) — a chunk
//       of at most `window` rows has every row committed and still in the rings;
//   draft.* at the anchors
//       CudaEngine::draft with record at each anchor L as that prefill passes position L (chunk
//       boundaries include the anchors), anchor token input_ids[L]; in the input's anchor order;
//   walk.* (walk_steps > 0)
//       the greedy speculative loop through the Engine interface: a second sequence, step() over
//       the first prompt_len tokens, then speculative_step (whole block, no budget) from the
//       target's first generated token; candidates and confidences from SpecStepResult.
// Preconditions: the engine has no live sequence (speculative decoding is enabled here when it is
// not yet) and its limits hold one verification (max_logit_rows, max_step_tokens >= block + 1).
// Both sequences are freed before returning, also on errors.
#pragma once

#include <vector>

#include "core/status.h"
#include "engine/dspark_score.h"
#include "gpu/cuda_engine.h"

namespace ds41::gpu {

Result<std::vector<engine::NamedArray>> gpu_dspark_score(CudaEngine& e, const engine::DsparkScoreInput& in);

}  // namespace ds41::gpu
