// ds41 gpu: gpu_dspark_score (gpu_dspark_score.h).
#include "gpu/gpu_dspark_score.h"

#include <algorithm>
#include <map>
#include <set>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "quant/fake_quant.h"

namespace ds41::gpu {
namespace {

constexpr auto* f32 = &engine::named_f32;
constexpr auto* i32 = &engine::named_i32;

// Frees the sequence on every path out.
struct SeqGuard {
  CudaEngine& e;
  engine::SeqId id = -1;
  ~SeqGuard() {
    if (id >= 0) (void)e.free_sequence(id);
  }
};

}  // namespace

Result<std::vector<engine::NamedArray>> gpu_dspark_score(CudaEngine& e, const engine::DsparkScoreInput& in) {
  const model::ModelConfig& c = e.device_model().config();
  const int64_t N = static_cast<int64_t>(in.input_ids.size()), V = c.vocab_size, H = c.hidden_size;
  const int64_t hd = c.head_dim, W = c.sliding_window;
  DS41_RETURN_IF_ERROR(engine::validate_dspark_input(in));
  if (c.num_nextn_predict_layers <= 0 || !e.device_model().weights().dspark)
    return failed_precondition("dspark: the model has no DSpark stages (num_nextn_predict_layers 0)");
  if (e.speculative_block() == 0) DS41_RETURN_IF_ERROR(e.enable_speculative().with_context("dspark"));
  const int64_t B = e.speculative_block();
  const int64_t S = static_cast<int64_t>(e.device_model().weights().dspark->stages.size());
  const int64_t F = static_cast<int64_t>(c.dspark_target_layer_ids.size()) * H;
  const GpuLimits& lim = e.executor().limits();
  // A chunk of at most W rows: every row is committed (only the last W rows of an item are) and
  // still in the rings afterwards; one forward (within the step and logits-row limits).
  const int64_t chunk = std::min({W, lim.max_step_tokens, lim.max_logit_rows});
  if (chunk < 1) return failed_precondition("dspark: the engine's limits hold no logits row");
  std::vector<engine::NamedArray> out;

  // The prefill, the context path and the drafts at the anchors.
  SeqGuard seq{e};
  DS41_ASSIGN_OR_RETURN(seq.id, e.create_sequence());
  std::vector<int32_t> amax(N);
  std::vector<float> feats(N * F), main_x(N * H);
  std::vector<std::vector<float>> window(S, std::vector<float>(N * hd));
  const std::set<int64_t> stops(in.anchors.begin(), in.anchors.end());
  std::map<int64_t, model::DraftOutput> drafts;
  int64_t at = 0;
  while (at < N || (stops.count(at) && !drafts.count(at))) {
    if (stops.count(at) && !drafts.count(at)) {  // the draft at anchor L = at (rows of 0..L-1 committed)
      DS41_ASSIGN_OR_RETURN(model::DraftOutput d, e.draft(seq.id, in.input_ids[at], true));
      drafts.emplace(at, std::move(d));
      continue;
    }
    int64_t n = std::min(chunk, N - at);
    const auto next_stop = stops.upper_bound(at);
    if (next_stop != stops.end()) n = std::min(n, *next_stop - at);
    const engine::StepItem it{seq.id, std::span<const int32_t>(in.input_ids).subspan(at, n), true};
    std::vector<model::SequenceOutput> fo;
    DS41_RETURN_IF_ERROR(
        e.forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kAll, false, &fo)
            .with_context("dspark prefill"));
    if (static_cast<int64_t>(fo[0].logits.size()) != n * V)
      return internal_error("dspark: the prefill returned " + std::to_string(fo[0].logits.size() / V) +
                            " logits rows for " + std::to_string(n) + " tokens");
    for (int64_t r = 0; r < n; ++r)
      amax[at + r] = engine::argmax_token(std::span<const float>(fo[0].logits).subspan(r * V, V));
    std::vector<float> f, mx;
    DS41_RETURN_IF_ERROR(e.last_features(0, n, &f));
    DS41_RETURN_IF_ERROR(e.last_main_x(n, &mx));
    std::copy(f.begin(), f.end(), feats.begin() + at * F);
    std::copy(mx.begin(), mx.end(), main_x.begin() + at * H);
    for (int64_t s = 0; s < S; ++s) {
      std::vector<uint8_t> packed;
      DS41_RETURN_IF_ERROR(e.draft_window_rows(seq.id, s, at, n, &packed));
      const size_t rb = packed.size() / static_cast<size_t>(n);
      for (int64_t r = 0; r < n; ++r) quant::q_win_decode(&packed[r * rb], hd, &window[s][(at + r) * hd]);
    }
    at += n;
  }
  out.push_back(i32("seq.target_argmax", {N}, amax));
  out.push_back(f32("context.features", {N, F}, std::move(feats)));
  out.push_back(f32("context.main_x", {N, H}, std::move(main_x)));
  for (int64_t s = 0; s < S; ++s)
    out.push_back(f32("stage" + std::to_string(s) + ".window_kv", {N, hd}, std::move(window[s])));
  if (!in.anchors.empty()) {
    const int64_t A = static_cast<int64_t>(in.anchors.size()), kd = c.dspark_num_experts_per_tok;
    std::vector<int32_t> apos, atok, cands;
    std::vector<float> hidden, base, conf_l, conf;
    std::vector<std::vector<float>> bkv(S);
    std::vector<std::vector<int32_t>> rexp(S);
    for (int64_t L : in.anchors) {
      const model::DraftOutput& d = drafts.at(L);
      if (static_cast<int64_t>(d.block_kv.size()) != S || static_cast<int64_t>(d.router_experts.size()) != S)
        return internal_error("dspark: the recorded draft lacks the stages' block rows or routing");
      apos.push_back(static_cast<int32_t>(L));
      atok.push_back(in.input_ids[L]);
      cands.insert(cands.end(), d.candidates.begin(), d.candidates.end());
      hidden.insert(hidden.end(), d.hidden.begin(), d.hidden.end());
      base.insert(base.end(), d.base_logits.begin(), d.base_logits.end());
      conf_l.insert(conf_l.end(), d.confidence_logits.begin(), d.confidence_logits.end());
      conf.insert(conf.end(), d.confidence.begin(), d.confidence.end());
      for (int64_t s = 0; s < S; ++s) {
        bkv[s].insert(bkv[s].end(), d.block_kv[s].begin(), d.block_kv[s].end());
        rexp[s].insert(rexp[s].end(), d.router_experts[s].begin(), d.router_experts[s].end());
      }
    }
    out.push_back(i32("draft.anchor_pos", {A}, apos));
    out.push_back(i32("draft.anchor_token", {A}, atok));
    out.push_back(f32("draft.hidden", {A, B, H}, hidden));
    out.push_back(f32("draft.base_logits", {A, B, V}, base));
    out.push_back(i32("draft.candidates", {A, B}, cands));
    out.push_back(f32("draft.confidence_logits", {A, B}, conf_l));
    out.push_back(f32("draft.confidence", {A, B}, conf));
    for (int64_t s = 0; s < S; ++s) {
      out.push_back(f32("draft.stage" + std::to_string(s) + ".block_kv", {A, B, hd}, bkv[s]));
      out.push_back(i32("draft.stage" + std::to_string(s) + ".router_experts", {A, B, kd}, rexp[s]));
    }
  }
  DS41_RETURN_IF_ERROR(e.free_sequence(seq.id));
  seq.id = -1;

  // The greedy speculative loop with the real target as verifier (Engine interface).
  if (in.walk_steps > 0) {
    const int64_t steps = in.walk_steps;
    SeqGuard wseq{e};
    DS41_ASSIGN_OR_RETURN(wseq.id, e.create_sequence());
    const engine::StepItem it{wseq.id, std::span<const int32_t>(in.input_ids).subspan(0, in.prompt_len),
                              true};
    engine::StepOutput so;
    DS41_RETURN_IF_ERROR(
        e.step(std::span<const engine::StepItem>(&it, 1), &so).with_context("dspark walk prefill"));
    int32_t anchor = engine::argmax_token(std::span<const float>(so.logits).subspan(so.row[0] * V, V));
    engine::DsparkWalkArrays walk;
    for (int64_t i = 0; i < steps; ++i) {
      DS41_ASSIGN_OR_RETURN(int64_t L, e.sequence_position(wseq.id));
      engine::SpecStepItem si;
      si.seq = wseq.id;
      si.anchor = anchor;
      std::vector<engine::SpecStepResult> res;
      DS41_RETURN_IF_ERROR(
          e.speculative_step(std::span<const engine::SpecStepItem>(&si, 1), engine::SpecBatchOptions{}, &res)
              .with_context("dspark walk step " + std::to_string(i)));
      const engine::SpecStepResult& r = res[0];
      if (static_cast<int64_t>(r.candidates.size()) != B || static_cast<int64_t>(r.confidence.size()) != B)
        return internal_error("dspark: a whole-block speculative step reported no draft");
      walk.add(L, anchor, r.candidates, r.confidence, r.accepted, r.tokens.back());
      anchor = r.tokens.back();
    }
    walk.emit(B, &out);
  }
  return out;
}

}  // namespace ds41::gpu
