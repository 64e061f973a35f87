// ds41 engine: dspark_score (dspark_score.h).
#include "engine/dspark_score.h"

#include <algorithm>
#include <cstring>

#include "engine/dspark_decoder.h"
#include "engine/sampler.h"
#include "engine/speculative.h"

namespace ds41::engine {

Status validate_dspark_input(const DsparkScoreInput& in) {
  const int64_t N = static_cast<int64_t>(in.input_ids.size());
  if (N == 0) return invalid_argument("dspark: input_ids is empty");
  if (in.prompt_len < 1 || in.prompt_len > N)
    return invalid_argument("dspark: prompt_len " + std::to_string(in.prompt_len) + " outside [1, " +
                            std::to_string(N) + "]");
  for (int64_t L : in.anchors)
    if (L < 0 || L >= N)
      return invalid_argument("dspark: anchor " + std::to_string(L) + " outside [0, " + std::to_string(N) +
                              ")");
  return ok_status();
}

NamedArray named_f32(std::string name, std::vector<int64_t> shape, std::vector<float> v) {
  return NamedArray{std::move(name), std::move(shape), std::move(v), {}};
}
NamedArray named_i32(std::string name, std::vector<int64_t> shape, std::vector<int32_t> v) {
  return NamedArray{std::move(name), std::move(shape), {}, std::move(v)};
}

void DsparkWalkArrays::add(int64_t anchor_pos, int32_t anchor, std::span<const int32_t> candidates,
                           std::span<const float> confidence, int64_t accepted, int32_t bonus) {
  apos_.push_back(static_cast<int32_t>(anchor_pos));
  atok_.push_back(anchor);
  cands_.insert(cands_.end(), candidates.begin(), candidates.end());
  conf_.insert(conf_.end(), confidence.begin(), confidence.end());
  for (double v : prefix_survival(confidence)) surv_.push_back(static_cast<float>(v));
  accepted_.push_back(static_cast<int32_t>(accepted));
  bonus_.push_back(bonus);
}

void DsparkWalkArrays::emit(int64_t block, std::vector<NamedArray>* out) const {
  const int64_t steps = static_cast<int64_t>(apos_.size());
  out->push_back(named_i32("walk.anchor_pos", {steps}, apos_));
  out->push_back(named_i32("walk.anchor_token", {steps}, atok_));
  out->push_back(named_i32("walk.candidates", {steps, block}, cands_));
  out->push_back(named_f32("walk.confidence", {steps, block}, conf_));
  out->push_back(named_f32("walk.survival", {steps, block}, surv_));
  out->push_back(named_i32("walk.accepted", {steps}, accepted_));
  out->push_back(named_i32("walk.bonus", {steps}, bonus_));
}

namespace {
constexpr auto* f32 = &named_f32;
constexpr auto* i32 = &named_i32;
}  // namespace

Result<std::vector<NamedArray>> dspark_score(model::Model* m, const DsparkScoreInput& in) {
  const model::ModelConfig& c = m->config();
  DS41_ASSIGN_OR_RETURN(DsparkDecoder dec, DsparkDecoder::create(m));
  const model::Dspark& ds = dec.dspark();
  const int64_t N = static_cast<int64_t>(in.input_ids.size()), V = c.vocab_size, H = c.hidden_size;
  const int64_t B = ds.block_size(), hd = c.head_dim, F = ds.feature_width(), W = c.sliding_window;
  DS41_RETURN_IF_ERROR(validate_dspark_input(in));
  std::vector<NamedArray> out;
  // One exact prefill of the whole sequence with the context features of every row.
  auto st = m->new_sequence();
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kAll;
  opt.dspark_features = true;
  DS41_ASSIGN_OR_RETURN(model::SequenceOutput pre, m->prefill(*st, in.input_ids, 0, opt));
  std::vector<int32_t> amax(N);
  for (int64_t p = 0; p < N; ++p)
    amax[p] = argmax_token(std::span<const float>(pre.logits).subspan(p * V, V));
  out.push_back(i32("seq.target_argmax", {N}, amax));
  model::DsparkContextRows rows = ds.context_rows(pre.dspark_features.data(), N, 0);
  out.push_back(f32("context.features", {N, F}, pre.dspark_features));
  out.push_back(f32("context.main_x", {N, H}, rows.main_x));
  for (int64_t s = 0; s < ds.n_stages(); ++s)
    out.push_back(f32("stage" + std::to_string(s) + ".window_kv", {N, hd}, rows.window_kv[s]));

  // Draft detail at the anchors: a state whose rings hold the prefill's rows before L.
  if (!in.anchors.empty()) {
    const int64_t A = static_cast<int64_t>(in.anchors.size()), wrb = m->kv_layout().window_row_bytes;
    std::vector<int32_t> apos, atok, cands;
    std::vector<float> hidden, base, conf_l, conf;
    std::vector<std::vector<float>> bkv(ds.n_stages());
    std::vector<std::vector<int32_t>> rexp(ds.n_stages());
    for (int64_t L : in.anchors) {
      auto ast = m->new_sequence();
      ds.enable(*ast);
      for (int64_t t = std::max<int64_t>(0, L - W); t < L; ++t)
        for (int64_t s = 0; s < ds.n_stages(); ++s)
          std::memcpy(ast->dspark->row(s, t), &rows.packed[s][t * wrb], wrb);
      ast->dspark->set_next_position(L);
      model::DraftOptions dopt;
      dopt.record = true;
      model::DraftInput di{ast.get(), in.input_ids[L], L};
      std::vector<model::DraftOutput> d;
      DS41_RETURN_IF_ERROR(ds.draft(std::span<const model::DraftInput>(&di, 1), dopt, &d));
      apos.push_back(static_cast<int32_t>(L));
      atok.push_back(in.input_ids[L]);
      cands.insert(cands.end(), d[0].candidates.begin(), d[0].candidates.end());
      hidden.insert(hidden.end(), d[0].hidden.begin(), d[0].hidden.end());
      base.insert(base.end(), d[0].base_logits.begin(), d[0].base_logits.end());
      conf_l.insert(conf_l.end(), d[0].confidence_logits.begin(), d[0].confidence_logits.end());
      conf.insert(conf.end(), d[0].confidence.begin(), d[0].confidence.end());
      for (int64_t s = 0; s < ds.n_stages(); ++s) {
        bkv[s].insert(bkv[s].end(), d[0].block_kv[s].begin(), d[0].block_kv[s].end());
        rexp[s].insert(rexp[s].end(), d[0].router_experts[s].begin(), d[0].router_experts[s].end());
      }
    }
    const int64_t kd = c.dspark_num_experts_per_tok;
    out.push_back(i32("draft.anchor_pos", {A}, apos));
    out.push_back(i32("draft.anchor_token", {A}, atok));
    out.push_back(f32("draft.hidden", {A, B, H}, hidden));
    out.push_back(f32("draft.base_logits", {A, B, V}, base));
    out.push_back(i32("draft.candidates", {A, B}, cands));
    out.push_back(f32("draft.confidence_logits", {A, B}, conf_l));
    out.push_back(f32("draft.confidence", {A, B}, conf));
    for (int64_t s = 0; s < ds.n_stages(); ++s) {
      out.push_back(f32("draft.stage" + std::to_string(s) + ".block_kv", {A, B, hd}, bkv[s]));
      out.push_back(i32("draft.stage" + std::to_string(s) + ".router_experts", {A, B, kd}, rexp[s]));
    }
  }

  // The greedy speculative loop with the real target as verifier.
  if (in.walk_steps > 0) {
    const int64_t S = in.walk_steps;
    auto wst = m->new_sequence();
    DS41_ASSIGN_OR_RETURN(
        std::vector<float> last,
        dec.prefill(*wst, std::span<const int32_t>(in.input_ids).subspan(0, in.prompt_len)));
    int32_t anchor = argmax_token(last);
    DsparkWalkArrays walk;
    for (int64_t i = 0; i < S; ++i) {
      DS41_ASSIGN_OR_RETURN(SpecStep step, dec.step(*wst, anchor, SpecStepOptions{}));
      walk.add(step.anchor_pos, step.anchor, step.candidates, step.confidence, step.accepted, step.tokens.back());
      anchor = step.tokens.back();
    }
    walk.emit(B, &out);
  }
  return out;
}

}  // namespace ds41::engine
