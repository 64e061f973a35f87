// ds41 model: Model loading and the entry points (MODEL_SPEC 4.2-4.5).
#include "model/model.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "engram/compressed_vocab.h"
#include "engram/hash_constants.h"
#include "model/decoder_replay_plan.h"
#include "model/forward_pass.h"
#include "model/model_setup.h"
#include "quant/fake_quant.h"

namespace ds41::model {

std::vector<float> rope_inv_freq_main(const ModelConfig& c) {
  const int64_t rd = c.qk_rope_head_dim;
  std::vector<float> inv(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i)
    inv[i] =
        static_cast<float>(std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd)));
  return inv;
}

std::vector<float> rope_inv_freq_yarn(const ModelConfig& c) {
  const int64_t rd = c.qk_rope_head_dim;
  const double base = c.compress_rope_theta;
  const RopeScaling& y = c.rope_scaling;
  auto cd = [&](double r) {
    return static_cast<double>(rd) *
           std::log(static_cast<double>(y.original_max_position_embeddings) / (2 * M_PI * r)) /
           (2 * std::log(base));
  };
  const double lo = std::max(std::floor(cd(y.beta_fast)), 0.0);
  double hi = std::min(std::ceil(cd(y.beta_slow)), static_cast<double>(rd - 1));
  if (lo == hi) hi += 0.001;
  std::vector<float> inv(rd / 2);
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double nu = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
    const double ramp = std::clamp((static_cast<double>(i) - lo) / (hi - lo), 0.0, 1.0);
    inv[i] = static_cast<float>(nu * (1 - ramp) + nu / y.factor * ramp);
  }
  return inv;
}

void SequenceOutput::append(SequenceOutput&& o) {
  positions.insert(positions.end(), o.positions.begin(), o.positions.end());
  logits.insert(logits.end(), o.logits.begin(), o.logits.end());
  ForwardRecord& r = record;
  r.hash_ids.insert(r.hash_ids.end(), o.record.hash_ids.begin(), o.record.hash_ids.end());
  for (auto& [l, v] : o.record.topk) r.topk[l].insert(r.topk[l].end(), v.begin(), v.end());
  for (auto& [l, v] : o.record.cand_blocks)
    r.cand_blocks[l].insert(r.cand_blocks[l].end(), v.begin(), v.end());
  for (auto& [l, v] : o.record.router_experts)
    r.router_experts[l].insert(r.router_experts[l].end(), v.begin(), v.end());
  for (auto& [l, v] : o.record.router_weights)
    r.router_weights[l].insert(r.router_weights[l].end(), v.begin(), v.end());
  if (!o.dspark_features.empty()) {
    if (dspark_features.empty()) dspark_first_pos = o.dspark_first_pos;
    dspark_features.insert(dspark_features.end(), o.dspark_features.begin(), o.dspark_features.end());
  }
}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadOptions& opt,
                                           ops::Backend* backend) {
  if (!backend) return invalid_argument("Model::load: no backend");
  std::unique_ptr<Model> m(new Model());
  m->backend_ = backend;
  DS41_ASSIGN_OR_RETURN(m->cfg_, load_model_config(dir));
  DS41_RETURN_IF_ERROR(validate_model_config(m->cfg_).with_context(dir + "/config.json"));
  const ModelConfig& c = m->cfg_;
  DS41_RETURN_IF_ERROR(check_model_config_supported(c, dir + "/config.json"));
  DS41_ASSIGN_OR_RETURN(m->sched_, derive_layer_schedule(c));
  DS41_ASSIGN_OR_RETURN(m->layout_, make_kv_layout(c, m->sched_));
  DS41_ASSIGN_OR_RETURN(m->ckpt_, Checkpoint::open(dir));
  DS41_ASSIGN_OR_RETURN(m->weights_, bind_model_weights(*m->ckpt_, c, m->sched_));
  if (c.num_nextn_predict_layers > 0) {
    DS41_ASSIGN_OR_RETURN(m->dspark_weights_, bind_dspark_weights(*m->ckpt_, c));
  }
  DS41_ASSIGN_OR_RETURN(m->hasher_, make_engram_hasher(c, dir, opt.tokenizer_dir));
  if (c.has_vision) {
    DS41_ASSIGN_OR_RETURN(m->vision_weights_, bind_vision_weights(*m->ckpt_, c));
  }
  // Let the backend convert / cache every linear weight once, at load.
  const ModelWeights& w = *m->weights_;
  std::vector<const ops::WeightRef*> linear{&w.head};
  if (m->vision_weights_)
    for (const ops::WeightRef* r : m->vision_weights_->linears()) linear.push_back(r);
  for (const LayerWeights& lw : w.layers) {
    for (const ops::WeightRef* r :
         {&lw.wq_a, &lw.wq_b, &lw.wkv, &lw.wo_a, &lw.wo_b, &lw.c_wkv, &lw.c_wgate, &lw.idx_wk, &lw.idx_wq_b,
          &lw.idx_weights_proj, &lw.gate, &lw.shared.w1, &lw.shared.w2, &lw.shared.w3})
      linear.push_back(r);
    for (const ExpertWeights& e : lw.experts)
      for (const ops::WeightRef* r : {&e.w1, &e.w2, &e.w3}) linear.push_back(r);
    if (lw.engram) linear.push_back(&lw.engram->wkv);
  }
  if (const DsparkWeights* d = m->dspark_weights_.get()) {
    for (const LayerWeights& lw : d->stages) {
      for (const ops::WeightRef* r : {&lw.wq_a, &lw.wq_b, &lw.wkv, &lw.wo_a, &lw.wo_b, &lw.gate,
                                      &lw.shared.w1, &lw.shared.w2, &lw.shared.w3})
        linear.push_back(r);
      for (const ExpertWeights& e : lw.experts)
        for (const ops::WeightRef* r : {&e.w1, &e.w2, &e.w3}) linear.push_back(r);
    }
    for (const ops::WeightRef* r : {&d->main_proj, &d->markov_head, &d->confidence_proj}) linear.push_back(r);
  }
  uint64_t total = 0, done = 0;
  for (const ops::WeightRef* r : linear) total += static_cast<uint64_t>(r->bytes());
  for (const ops::WeightRef* r : linear) {
    backend->prepare(*r);
    done += static_cast<uint64_t>(r->bytes());
    if (opt.progress) opt.progress(done, total);
  }
  if (opt.progress) opt.progress(total, total);
  m->inv_freq_main_ = rope_inv_freq_main(c);
  m->inv_freq_yarn_ = rope_inv_freq_yarn(c);
  if (m->vision_weights_)
    m->vision_tower_ = std::make_unique<VisionTower>(m->cfg_, *m->vision_weights_, *backend);
  return m;
}

std::unique_ptr<SequenceState> Model::new_sequence() const {
  return std::make_unique<SequenceState>(layout_);
}

Status Model::forward(std::span<const SequenceInput> batch, const ForwardOptions& opt,
                      std::vector<SequenceOutput>* out) {
  ForwardPass fp(*this, opt);
  DS41_RETURN_IF_ERROR(fp.setup(batch));
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) fp.run_layer(l);
  fp.finish(out);
  return ok_status();
}

Result<SequenceOutput> Model::prefill(SequenceState& st, std::span<const int32_t> tokens, int64_t chunk,
                                      const ForwardOptions& opt) {
  if (tokens.empty()) return invalid_argument("prefill: no tokens");
  if (chunk <= 0) chunk = static_cast<int64_t>(tokens.size());
  SequenceOutput all;
  for (size_t b = 0; b < tokens.size(); b += chunk) {
    const size_t e = std::min(tokens.size(), b + static_cast<size_t>(chunk));
    ForwardOptions o = opt;
    if (opt.logits == LogitsRows::kLast && e < tokens.size()) o.logits = LogitsRows::kNone;
    SequenceInput in{&st, tokens.subspan(b, e - b), {}};
    std::vector<SequenceOutput> out;
    DS41_RETURN_IF_ERROR(forward(std::span<const SequenceInput>(&in, 1), o, &out));
    all.append(std::move(out[0]));
  }
  return all;
}

Result<SequenceOutput> Model::decode_step(SequenceState& st, int32_t token, const ForwardOptions& opt) {
  SequenceInput in{&st, std::span<const int32_t>(&token, 1), {}};
  std::vector<SequenceOutput> out;
  DS41_RETURN_IF_ERROR(forward(std::span<const SequenceInput>(&in, 1), opt, &out));
  return std::move(out[0]);
}

Result<SequenceOutput> Model::prefill_decoder_replay(SequenceState& st, std::span<const int32_t> tokens,
                                                     const ForwardOptions& opt) {
  // The cut, the kept rows and the refusals are shared with the GPU engine (decoder_replay_plan.h).
  DS41_ASSIGN_OR_RETURN(const DecoderReplayPlan dp,
                        plan_decoder_replay(cfg_, sched_, static_cast<int64_t>(tokens.size())));
  const int64_t cut = dp.cut;
  if (st.position() != 0) return failed_precondition("decoder replay: needs a fresh sequence state");
  ForwardOptions o = opt;
  o.record = false;
  ForwardPass fp(*this, o);
  SequenceInput in{&st, tokens, {}};
  DS41_RETURN_IF_ERROR(fp.setup(std::span<const SequenceInput>(&in, 1)));
  for (int64_t l = 0; l <= cut; ++l) fp.run_layer(l);
  fp.keep_tail_rows(dp.keep, cut);
  for (int64_t l = cut + 1; l < cfg_.num_hidden_layers; ++l) fp.run_layer(l);
  std::vector<SequenceOutput> out;
  fp.finish(&out);
  return std::move(out[0]);
}

Result<SequenceOutput> Model::encoder_replay(SequenceState& st, std::span<const int32_t> prefix_tokens,
                                             const ForwardOptions& opt) {
  const int64_t H = static_cast<int64_t>(prefix_tokens.size());
  if (H == 0) return invalid_argument("encoder replay: empty prefix");
  if (st.position() != H)
    return failed_precondition("encoder replay: the state holds " + std::to_string(st.position()) +
                               " positions but the prefix has " + std::to_string(H) + " tokens");
  const int64_t b = std::max<int64_t>(0, H - cfg_.sliding_window);
  // Forget what a prefix cache would not persist: window rings (floored), pending groups, and
  // rebuild the Engram look-back from the tokens before the replay start.
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) st.set_window_floor(l, b);
  for (KvSourceState& s : st.sources()) std::fill(s.pend_filled.begin(), s.pend_filled.end(), 0);
  if (hasher_) {
    engram::EngramHashState hs = hasher_->new_state();
    DS41_RETURN_IF_ERROR(hasher_->append(hs, prefix_tokens.subspan(0, b), {}, {}));
    st.engram_state() = hs;
  }
  st.set_position(b);
  ForwardOptions o = opt;
  o.record = false;
  SequenceInput in{&st, prefix_tokens.subspan(b), {}};
  std::vector<SequenceOutput> out;
  DS41_RETURN_IF_ERROR(forward(std::span<const SequenceInput>(&in, 1), o, &out));
  return std::move(out[0]);
}

Result<TeacherForcedOutput> Model::run_layer_teacher_forced(int64_t l, const TeacherForcedInput& in) {
  if (l < 0 || l >= cfg_.num_hidden_layers) return out_of_range("teacher-forced: layer " + std::to_string(l));
  const LayerPlan& p = sched_.layers[l];
  const int64_t S = static_cast<int64_t>(in.tokens.size());
  auto st = new_sequence();
  if (p.ratio > 0 && p.kv_owner != l) {
    if (!in.owner_kv || !in.owner_keys)
      return invalid_argument("teacher-forced: layer needs its KV owner's cache");
    KvSourceState* src = st->source(p.kv_owner);
    const int64_t hd = cfg_.head_dim, dI = cfg_.index_head_dim;
    const int64_t kb = src->layout.kv_row_bytes, ib = src->layout.key_row_bytes;
    src->kv_rows.resize(in.owner_entries * kb);
    src->key_rows.resize(in.owner_entries * ib);
    for (int64_t k = 0; k < in.owner_entries; ++k) {
      DS41_RETURN_IF_ERROR(quant::q_kv_pack_on_grid(in.owner_kv + k * hd, hd, src->kv_rows.data() + k * kb)
                               .with_context("owner compressed entry " + std::to_string(k)));
      DS41_RETURN_IF_ERROR(
          quant::q_idx_pack_on_grid(in.owner_keys + k * dI, dI, src->key_rows.data() + k * ib)
              .with_context("owner index key " + std::to_string(k)));
    }
    src->count = in.owner_entries;
  }
  ForwardOptions o;
  o.logits = LogitsRows::kNone;
  o.record = true;
  ForwardPass fp(*this, o);
  DS41_RETURN_IF_ERROR(fp.setup_teacher_forced(st.get(), in.tokens, in.streams, in.pi));
  if (p.ratio > 0 && p.idx_owner != l) {
    if (!in.owner_topk) return invalid_argument("teacher-forced: layer needs its index owner's selection");
    auto& P = fp.published()[p.idx_owner];
    P.width = in.owner_topk_width;
    P.sel.assign(in.owner_topk, in.owner_topk + S * in.owner_topk_width);
  }
  if (p.candidate_restricted) {
    if (!in.cand_mask) return invalid_argument("teacher-forced: layer needs the candidate mask");
    auto& P = fp.published()[cfg_.candidate_source_layer_id];
    P.cand = {std::vector<uint8_t>(in.cand_mask, in.cand_mask + S * in.cand_width)};
    P.cand_t = {in.cand_width};
  }
  fp.run_layer(l);
  TeacherForcedOutput out;
  out.streams = fp.streams();
  out.pre = fp.pi();
  out.record = std::move(fp.records()[0]);
  return out;
}

}  // namespace ds41::model
