// ds41 model: ForwardPass rows, embeddings, the per-layer schedule with the mHC lag
// (MODEL_SPEC 3.1, 3.3, 3.6) and the head.
#include "model/forward_pass.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/hc_site.h"
#include "model/spec_rollback.h"

namespace ds41::model {

ForwardPass::ForwardPass(const Model& m, const ForwardOptions& opt)
    : m_(m), c_(m.config()), be_(m.backend()), opt_(opt) {}

Status ForwardPass::setup(std::span<const SequenceInput> batch) {
  const int64_t V = c_.vocab_size, H = c_.hidden_size, C = c_.hc_mult;
  n_ = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    if (!in.state) return invalid_argument("sequence " + std::to_string(i) + ": no state");
    if (in.tokens.empty()) return invalid_argument("sequence " + std::to_string(i) + ": no tokens");
    if (!in.image_span.empty() && in.image_span.size() != in.tokens.size())
      return invalid_argument("sequence " + std::to_string(i) + ": image_span has " +
                              std::to_string(in.image_span.size()) + " flags for " +
                              std::to_string(in.tokens.size()) + " tokens");
    if (!in.span_embeds.empty()) {
      int64_t flagged = 0;
      for (uint8_t f : in.image_span) flagged += f != 0;
      if (static_cast<int64_t>(in.span_embeds.size()) != flagged * H)
        return invalid_argument(
            "sequence " + std::to_string(i) + ": span_embeds has " + std::to_string(in.span_embeds.size()) +
            " values for " + std::to_string(flagged) + " image-span positions of width " + std::to_string(H));
    }
    for (size_t t = 0; t < in.tokens.size(); ++t)
      if (in.tokens[t] < 0 || in.tokens[t] >= V)
        return invalid_argument("sequence " + std::to_string(i) + ": token " + std::to_string(t) +
                                " has id " + std::to_string(in.tokens[t]) + ", outside the vocabulary [0, " +
                                std::to_string(V) + ")");
    for (size_t j = 0; j < i; ++j)
      if (batch[j].state == in.state)
        return invalid_argument("sequence " + std::to_string(i) + ": state used twice in one batch");
    const int64_t end_pos = in.state->position() + static_cast<int64_t>(in.tokens.size());
    if (end_pos > c_.max_position_embeddings)
      return out_of_range("sequence " + std::to_string(i) + ": position " + std::to_string(end_pos) +
                          " exceeds max_position_embeddings " + std::to_string(c_.max_position_embeddings));
    n_ += static_cast<int64_t>(in.tokens.size());
  }
  if (!opt_.journals.empty() && opt_.journals.size() != batch.size())
    return invalid_argument("forward: " + std::to_string(opt_.journals.size()) + " journals for " +
                            std::to_string(batch.size()) + " sequences");
  for (size_t i = 0; i < opt_.journals.size(); ++i)
    if (opt_.journals[i] && static_cast<int64_t>(batch[i].tokens.size()) > c_.sliding_window)
      return invalid_argument("sequence " + std::to_string(i) +
                              ": a journaled (verification) call may hold at most " +
                              std::to_string(c_.sliding_window) + " tokens (the window)");
  if (opt_.dspark_features && !m_.dspark_weights())
    return failed_precondition("forward: DSpark features requested but the checkpoint has no DSpark stages");
  // Engram hash ids first: the only step that can still fail, and it must not half-advance.
  const engram::EngramHasher* hasher = m_.hasher();
  const int64_t nel = static_cast<int64_t>(c_.engram_layer_ids.size());
  const int64_t per_tok = hasher ? hasher->ids_per_token() : 0;
  hash_ids_.assign(n_ * per_tok, 0);
  std::vector<engram::EngramHashState> new_hash_states(batch.size());
  {
    int64_t row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const SequenceInput& in = batch[i];
      const int64_t len = static_cast<int64_t>(in.tokens.size());
      if (hasher && nel > 0) {
        new_hash_states[i] = in.state->engram_state();
        Status s = hasher->append(new_hash_states[i], in.tokens, in.image_span,
                                  std::span<int32_t>(hash_ids_.data() + row * per_tok, len * per_tok));
        if (!s.ok()) return s.with_context("sequence " + std::to_string(i) + ": engram hashing");
      }
      row += len;
    }
  }
  pos_.resize(n_);
  vl_.assign(n_, 0);
  dead_.assign(n_, 0);
  seqs_.clear();
  records_.assign(batch.size(), ForwardRecord{});
  streams_.resize(n_ * C * H);
  pi_.assign(n_ * C, 0.0f);
  std::vector<int32_t> ids(n_);
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    SeqRows s;
    s.st = in.state;
    s.begin = row;
    s.start_pos = in.state->position();
    if (!opt_.journals.empty() && opt_.journals[i]) {
      s.journal = opt_.journals[i];
      // The Engram look-back is the one thing setup() has already advanced.
      engram::EngramHashState before = in.state->engram_state();
      s.journal->begin(*in.state, static_cast<int64_t>(in.tokens.size()));
      s.journal->engram_before = before;
    }
    for (size_t t = 0; t < in.tokens.size(); ++t, ++row) {
      pos_[row] = s.start_pos + static_cast<int64_t>(t);
      ids[row] = in.tokens[t];
      if (!in.image_span.empty() && in.image_span[t]) {
        vl_[row] = dead_[row] = 1;
        any_vl_ = any_dead_ = true;
      }
    }
    s.end = row;
    if (hasher && nel > 0) in.state->engram_state() = new_hash_states[i];
    seqs_.push_back(s);
    if (opt_.record)
      records_[i].hash_ids.assign(hash_ids_.begin() + s.begin * per_tok, hash_ids_.begin() + s.end * per_tok);
  }
  // MODEL_SPEC 3.1: embed, copy into every stream, pi = one-hot(0).
  if (opt_.dspark_features)
    dspark_feat_.assign(n_ * static_cast<int64_t>(c_.dspark_target_layer_ids.size()) * H, 0.0f);
  std::vector<float> e(n_ * H);
  be_.embed_bf16(m_.weights().embed, c_.vocab_size, H, ids.data(), n_, e.data());
  // MODEL_SPEC 3.11: image-span positions take the span rows instead of the token embedding.
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceInput& in = batch[i];
    if (in.span_embeds.empty()) continue;
    const float* src = in.span_embeds.data();
    for (size_t t = 0; t < in.tokens.size(); ++t)
      if (in.image_span[t]) {
        std::memcpy(&e[(seqs_[i].begin + static_cast<int64_t>(t)) * H], src, H * sizeof(float));
        src += H;
      }
  }
  for (int64_t r = 0; r < n_; ++r) {
    for (int64_t c = 0; c < C; ++c) std::memcpy(&streams_[(r * C + c) * H], &e[r * H], H * sizeof(float));
    pi_[r * C] = 1.0f;
  }
  return ok_status();
}

Status ForwardPass::setup_teacher_forced(SequenceState* st, std::span<const int32_t> tokens,
                                         const float* streams, const float* pi) {
  SequenceInput in{st, tokens, {}};
  DS41_RETURN_IF_ERROR(setup(std::span<const SequenceInput>(&in, 1)));
  std::memcpy(streams_.data(), streams, streams_.size() * sizeof(float));
  std::memcpy(pi_.data(), pi, pi_.size() * sizeof(float));
  return ok_status();
}

void ForwardPass::dump(const std::string& name, std::vector<int64_t> shape, const float* data) const {
  if (opt_.dump && *opt_.dump) (*opt_.dump)(name, shape, data);
}

void ForwardPass::run_layer(int64_t l) {
  const LayerWeights& w = m_.weights().layers[l];
  const int64_t H = c_.hidden_size, C = c_.hc_mult, n = n_;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const std::string L = "layer" + std::to_string(l) + ".";
  if (c_.is_engram_layer(l)) engram_stage(l);
  if (opt_.dspark_features) capture_dspark_features(l);  // the streams entering block l (3.10.2)

  auto site_map = [&](const HcSiteWeights& hw, std::vector<float>& pre, std::vector<float>& post,
                      std::vector<float>& comb) { hc_site_map(be_, c_, hw, streams_.data(), n, &pre, &post, &comb); };
  std::vector<float> pre_a, post_a, comb_a, pre_f, post_f, comb_f, x(n * H), y(n * H);
  // Attention site: collapse with the previous site's pre (MODEL_SPEC 3.3, the lag).
  site_map(w.hc_attn, pre_a, post_a, comb_a);
  be_.hc_collapse(streams_.data(), pi_.data(), n, C, H, x.data());
  be_.rms_norm(x.data(), n, H, w.attn_norm.data(), eps, x.data());
  dump(L + "attn_in", {n, H}, x.data());
  attention(l, x.data(), y.data());
  dump(L + "attn_out", {n, H}, y.data());
  be_.hc_expand(streams_.data(), y.data(), post_a.data(), comb_a.data(), n, C, H);
  dump(L + "hc_attn_pre", {n, C}, pre_a.data());
  dump(L + "hc_attn_post", {n, C}, post_a.data());
  dump(L + "hc_attn_comb", {n, C, C}, comb_a.data());
  dump(L + "streams_after_attn", {n, C, H}, streams_.data());
  // FFN site.
  site_map(w.hc_ffn, pre_f, post_f, comb_f);
  be_.hc_collapse(streams_.data(), pre_a.data(), n, C, H, x.data());
  be_.rms_norm(x.data(), n, H, w.ffn_norm.data(), eps, x.data());
  dump(L + "ffn_in", {n, H}, x.data());
  moe(l, x.data(), y.data());
  dump(L + "ffn_out", {n, H}, y.data());
  be_.hc_expand(streams_.data(), y.data(), post_f.data(), comb_f.data(), n, C, H);
  dump(L + "hc_ffn_pre", {n, C}, pre_f.data());
  dump(L + "hc_ffn_post", {n, C}, post_f.data());
  dump(L + "hc_ffn_comb", {n, C, C}, comb_f.data());
  dump(L + "streams_after_ffn", {n, C, H}, streams_.data());
  pi_ = std::move(pre_f);
}

void ForwardPass::keep_tail_rows(int64_t keep, int64_t after_layer) {
  const int64_t H = c_.hidden_size, C = c_.hc_mult;
  std::vector<int64_t> kept;
  std::vector<SeqRows> ns;
  for (const SeqRows& s : seqs_) {
    SeqRows t = s;
    const int64_t b = std::max(s.begin, s.end - keep);
    t.begin = static_cast<int64_t>(kept.size());
    t.start_pos = s.start_pos + (b - s.begin);
    for (int64_t r = b; r < s.end; ++r) kept.push_back(r);
    t.end = static_cast<int64_t>(kept.size());
    for (int64_t l = after_layer + 1; l < c_.num_hidden_layers; ++l)
      t.st->set_window_floor(l, std::max(t.st->window_floor(l), t.start_pos));
    ns.push_back(t);
  }
  const int64_t nn = static_cast<int64_t>(kept.size());
  auto take = [&](auto& v, int64_t width) {
    std::remove_reference_t<decltype(v)> out(nn * width);
    for (int64_t i = 0; i < nn; ++i)
      std::copy(v.begin() + kept[i] * width, v.begin() + (kept[i] + 1) * width, out.begin() + i * width);
    v.swap(out);
  };
  take(streams_, C * H);
  take(pi_, C);
  take(pos_, 1);
  take(vl_, 1);
  take(dead_, 1);
  if (!dspark_feat_.empty()) take(dspark_feat_, static_cast<int64_t>(c_.dspark_target_layer_ids.size()) * H);
  for (auto& [l, p] : pub_) {
    if (p.width > 0 && !p.sel.empty()) take(p.sel, p.width);
    for (size_t s = 0; s < p.cand.size(); ++s) {
      if (p.cand[s].empty()) continue;
      const int64_t T = p.cand_t[s];
      std::vector<uint8_t> m((ns[s].end - ns[s].begin) * T);
      const int64_t off = (seqs_[s].end - seqs_[s].begin) - (ns[s].end - ns[s].begin);
      std::copy(p.cand[s].begin() + off * T, p.cand[s].end(), m.begin());
      p.cand[s].swap(m);
    }
  }
  seqs_ = ns;
  n_ = nn;
}

void ForwardPass::finish(std::vector<SequenceOutput>* out) {
  const int64_t H = c_.hidden_size, C = c_.hc_mult, V = c_.vocab_size;
  out->clear();
  out->resize(seqs_.size());
  std::vector<int64_t> rows;
  for (const SeqRows& s : seqs_) {
    if (opt_.logits == LogitsRows::kAll)
      for (int64_t r = s.begin; r < s.end; ++r) rows.push_back(r);
    else if (opt_.logits == LogitsRows::kLast && s.end > s.begin)
      rows.push_back(s.end - 1);
  }
  const int64_t m = static_cast<int64_t>(rows.size());
  std::vector<float> ss(m * C * H), pp(m * C), h(m * H), logits(m * V);
  for (int64_t i = 0; i < m; ++i) {
    std::copy(streams_.begin() + rows[i] * C * H, streams_.begin() + (rows[i] + 1) * C * H,
              ss.begin() + i * C * H);
    std::copy(pi_.begin() + rows[i] * C, pi_.begin() + (rows[i] + 1) * C, pp.begin() + i * C);
  }
  // MODEL_SPEC 3.6: collapse with the last FFN pre, final norm, head.
  be_.hc_collapse(ss.data(), pp.data(), m, C, H, h.data());
  be_.rms_norm(h.data(), m, H, m_.weights().norm.data(), static_cast<float>(c_.rms_norm_eps), h.data());
  dump("final_hidden", {m, H}, h.data());
  if (m > 0) be_.linear(m_.weights().head, h.data(), m, logits.data());
  int64_t i = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    SequenceOutput& o = (*out)[s];
    while (i < m && rows[i] < seqs_[s].end) {
      o.positions.push_back(pos_[rows[i]]);
      o.logits.insert(o.logits.end(), logits.begin() + i * V, logits.begin() + (i + 1) * V);
      ++i;
    }
    o.record = std::move(records_[s]);
    if (!dspark_feat_.empty()) {
      const int64_t F = static_cast<int64_t>(c_.dspark_target_layer_ids.size()) * H;
      o.dspark_first_pos = seqs_[s].start_pos;
      o.dspark_features.assign(dspark_feat_.begin() + seqs_[s].begin * F,
                               dspark_feat_.begin() + seqs_[s].end * F);
    }
    seqs_[s].st->set_position(seqs_[s].start_pos + (seqs_[s].end - seqs_[s].begin));
  }
}

}  // namespace ds41::model
