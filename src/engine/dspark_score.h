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
#include <span>
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

// The input's own checks, shared by the CPU and GPU scores: input_ids non-empty, prompt_len in
// [1, N], every anchor in [0, N).
Status validate_dspark_input(const DsparkScoreInput& in);

NamedArray named_f32(std::string name, std::vector<int64_t> shape, std::vector<float> v);
NamedArray named_i32(std::string name, std::vector<int64_t> shape, std::vector<int32_t> v);

// The walk.* arrays of the golden DSpark set, one verified step appended at a time (the CPU
// reference's walk here and the GPU engine's in gpu/gpu_dspark_score.cpp write the same names).
class DsparkWalkArrays {
 public:
  void add(int64_t anchor_pos, int32_t anchor, std::span<const int32_t> candidates,
           std::span<const float> confidence, int64_t accepted, int32_t bonus);
  // walk.anchor_pos, anchor_token, candidates [steps, block], confidence, survival, accepted, bonus.
  void emit(int64_t block, std::vector<NamedArray>* out) const;

 private:
  std::vector<int32_t> apos_, atok_, cands_, accepted_, bonus_;
  std::vector<float> conf_, surv_;
};

Result<std::vector<NamedArray>> dspark_score(model::Model* m, const DsparkScoreInput& in);

}  // namespace ds41::engine
