// ds41 engine: DsparkDecoder (dspark_decoder.h; MODEL_SPEC 3.10.7-3.10.8).
#include "engine/dspark_decoder.h"

#include <algorithm>

#include "model/spec_rollback.h"

namespace ds41::engine {

Result<DsparkDecoder> DsparkDecoder::create(model::Model* m) {
  DS41_ASSIGN_OR_RETURN(model::Dspark d, model::Dspark::create(*m));
  return DsparkDecoder(m, d);
}

Result<std::vector<float>> DsparkDecoder::prefill(model::SequenceState& st, std::span<const int32_t> tokens,
                                                  int64_t chunk) {
  dspark_.enable(st);
  const int64_t first = st.position();
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kLast;
  opt.dspark_features = true;
  DS41_ASSIGN_OR_RETURN(model::SequenceOutput out, m_->prefill(st, tokens, chunk, opt));
  DS41_RETURN_IF_ERROR(
      dspark_.commit_context(st, out.dspark_features.data(), static_cast<int64_t>(tokens.size()), first));
  return std::move(out.logits);
}

Result<SpecStep> DsparkDecoder::step(model::SequenceState& st, int32_t anchor, const SpecStepOptions& opt) {
  DS41_ASSIGN_OR_RETURN(SpecDraft d, draft(st, anchor, opt));
  const int64_t l = d.verify_len;
  return verify(st, std::move(d), l, opt);
}

Result<SpecDraft> DsparkDecoder::draft(model::SequenceState& st, int32_t anchor, const SpecStepOptions& opt) {
  const int64_t B = m_->config().dspark_block_size, L = st.position();
  const bool sampled = opt.temperature > 0;
  if (sampled && !opt.rng) return invalid_argument("speculative step: temperature > 0 needs an rng");
  if (opt.verify_len > B) return invalid_argument("speculative step: verify_len above the block size");
  if (!st.dspark)
    return failed_precondition("speculative step: the sequence has no draft state (prefill first)");
  SpecDraft s;
  s.anchor_pos = L;
  s.anchor = anchor;
  s.verify_len = opt.verify_len < 0 ? B : opt.verify_len;
  if (s.verify_len == 0) return s;
  model::DraftOptions dopt;
  if (sampled) {
    dopt.choose = [&](int64_t, int64_t, std::span<const float> z) {
      s.draft_probs.push_back(tempered_probs(z, opt.temperature));
      return draw_from(s.draft_probs.back(), *opt.rng);
    };
  }
  dopt.record = opt.keep_draft;
  model::DraftInput in{&st, anchor, L};
  std::vector<model::DraftOutput> d;
  DS41_RETURN_IF_ERROR(dspark_.draft(std::span<const model::DraftInput>(&in, 1), dopt, &d));
  s.candidates = d[0].candidates;
  s.confidence = d[0].confidence;
  if (opt.confidence_threshold >= 0)
    s.verify_len = std::min(s.verify_len, verify_length(s.confidence, opt.confidence_threshold));
  if (opt.keep_draft) s.draft = std::move(d[0]);
  return s;
}

Result<SpecStep> DsparkDecoder::verify(model::SequenceState& st, SpecDraft d, int64_t l,
                                       const SpecStepOptions& opt) {
  const int64_t V = m_->config().vocab_size, L = st.position();
  const bool sampled = opt.temperature > 0;
  if (l < 0 || l > d.verify_len)
    return invalid_argument("speculative step: verify length outside [0, the draft's cap]");
  if (L != d.anchor_pos) return failed_precondition("speculative step: the sequence moved since its draft");
  if (sampled && !opt.rng) return invalid_argument("speculative step: temperature > 0 needs an rng");
  SpecStep s;
  s.anchor_pos = L;
  s.anchor = d.anchor;
  s.candidates = std::move(d.candidates);
  s.confidence = std::move(d.confidence);
  s.draft = std::move(d.draft);
  s.verified = l;
  // Verification: one journaled target forward over [x_L, c_0 .. c_{l-1}] at positions L..L+l.
  std::vector<int32_t> vt{s.anchor};
  vt.insert(vt.end(), s.candidates.begin(), s.candidates.begin() + l);
  model::SpecJournal journal;
  model::SpecJournal* jp = &journal;
  model::ForwardOptions fo;
  fo.logits = model::LogitsRows::kAll;
  fo.dspark_features = true;
  fo.journals = std::span<model::SpecJournal* const>(&jp, 1);
  model::SequenceInput si{&st, vt, {}};
  std::vector<model::SequenceOutput> out;
  DS41_RETURN_IF_ERROR(m_->forward(std::span<const model::SequenceInput>(&si, 1), fo, &out));
  const std::span<const float> T(out[0].logits);
  Acceptance acc;
  std::span<const int32_t> cand(s.candidates.data(), static_cast<size_t>(l));
  if (!sampled) {
    acc = accept_greedy(cand, T, V);
  } else {
    std::vector<double> dp(l * V), tp((l + 1) * V);
    for (int64_t k = 0; k < l; ++k)
      std::copy(d.draft_probs[k].begin(), d.draft_probs[k].end(), dp.begin() + k * V);
    for (int64_t k = 0; k <= l; ++k) {
      const std::vector<double> p = tempered_probs(T.subspan(k * V, V), opt.temperature);
      std::copy(p.begin(), p.end(), tp.begin() + k * V);
    }
    acc = accept_sampled(cand, dp, tp, V, *opt.rng);
  }
  s.accepted = acc.accepted;
  s.tokens.assign(s.candidates.begin(), s.candidates.begin() + acc.accepted);
  s.tokens.push_back(acc.bonus);
  // 3.10.8: undo the rejected positions L+a+1..L+l; 3.10.7: context rows for L..L+a only.
  DS41_RETURN_IF_ERROR(model::rollback_spec(st, journal, acc.accepted + 1, vt, m_->hasher()));
  DS41_RETURN_IF_ERROR(dspark_.commit_context(st, out[0].dspark_features.data(), acc.accepted + 1, L));
  return s;
}

}  // namespace ds41::engine
