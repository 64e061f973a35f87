// ds41 engine: CpuEngine (cpu_engine.h).
#include "engine/cpu_engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/check.h"
#include "model/image_input.h"
#include "engine/state_codec.h"

namespace ds41::engine {

CpuEngine::CpuEngine(model::Model* model, std::string model_name, int64_t max_context) : model_(model) {
  info_.model_name = std::move(model_name);
  info_.device = "cpu";
  info_.vocab_size = model->config().vocab_size;
  info_.max_context = model->config().max_position_embeddings;
  if (max_context > 0) info_.max_context = std::min(max_context, info_.max_context);
  info_.eos_token_id = static_cast<int32_t>(model->config().eos_token_id);
  // model::Model::encoder_replay: the last window by id, the Engram look-back before it.
  info_.replay_lookback =
      model->config().sliding_window +
      (model->hasher() ? std::max<int64_t>(0, model->config().engram_max_ngram_size - 1) : 0);
  bounded_bytes_ = model->new_sequence()->bounded_bytes();
  info_.has_vision = model->vision_tower() != nullptr;
}

Result<model::SequenceState*> CpuEngine::find(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("sequence " + std::to_string(seq) + " does not exist");
  return it->second.get();
}

void CpuEngine::restart_draft(model::SequenceState& s) const {
  if (!spec_) return;
  if (!s.dspark) spec_->dspark().enable(s);
  s.dspark->restart_at(s.position());
}

Result<SeqId> CpuEngine::create_sequence() {
  const SeqId id = next_id_++;
  auto st = model_->new_sequence();
  if (spec_) spec_->dspark().enable(*st);
  seqs_.emplace(id, std::move(st));
  return id;
}

Result<SeqId> CpuEngine::fork_sequence(SeqId src) {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(src));
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::make_unique<model::SequenceState>(*s));
  if (auto it = spec_rng_.find(src); it != spec_rng_.end()) spec_rng_.emplace(id, it->second);
  return id;
}

Status CpuEngine::free_sequence(SeqId seq) {
  if (seqs_.erase(seq) == 0) return not_found("sequence " + std::to_string(seq) + " does not exist");
  spec_rng_.erase(seq);
  return ok_status();
}

Result<int64_t> CpuEngine::sequence_position(SeqId seq) const {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  return s->position();
}

Result<int64_t> CpuEngine::sequence_bytes(SeqId seq) const {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  return s->bounded_bytes() + s->global_kv_bytes();
}

// MODEL_SPEC 5.2-5.4: the bounded part is fixed at creation; each KV source emits one compressed
// entry (Q_kv row + Q_idx key row) per `ratio` tokens, a partial group staying in the bounded
// pending buffers.
int64_t CpuEngine::bytes_for_tokens(int64_t tokens) const {
  int64_t b = bounded_bytes_;
  for (const model::KvSourceLayout& s : model_->kv_layout().sources)
    b += (tokens / s.ratio) * s.entry_bytes();
  return b;
}

Result<std::vector<std::vector<float>>> CpuEngine::encode_images(
    std::span<const image::PreparedImage* const> images) {
  const model::VisionTower* tower = model_->vision_tower();
  if (!tower) return failed_precondition("this model has no vision tower (no vision_config in config.json)");
  DS41_ASSIGN_OR_RETURN(auto enc, model::encode_prepared_images(
                                      model_->config(),
                                      [tower](std::span<const model::VisionImageInput> in, bool keep) {
                                        return tower->encode(in, keep);
                                      },
                                      model::image_span_markers(*model_->vision_weights()), images));
  std::vector<std::vector<float>> out;
  for (auto& e : enc) out.push_back(std::move(e.span_embeds));
  return out;
}

Status CpuEngine::step(std::span<const StepItem> items, StepOutput* out) {
  const int64_t V = info_.vocab_size;
  out->vocab = V;
  out->logits.clear();
  out->token.clear();  // rows for greedy_only items too (engine.h)
  out->row.assign(items.size(), -1);
  if (items.empty()) return ok_status();
  // Validate everything before any state moves: an error leaves every sequence unchanged.
  std::vector<model::SequenceInput> batch(items.size());
  std::unordered_set<SeqId> seen;
  bool any_logits = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    const std::string what = "step item " + std::to_string(i) + " (sequence " + std::to_string(it.seq) + ")";
    auto st = find(it.seq);
    if (!st.ok()) return st.status().with_context("step item " + std::to_string(i));
    if (!seen.insert(it.seq).second) return invalid_argument(what + ": sequence appears twice in one step");
    if (it.tokens.empty()) return invalid_argument(what + ": no tokens");
    for (size_t t = 0; t < it.tokens.size(); ++t)
      if (it.tokens[t] < 0 || it.tokens[t] >= V)
        return invalid_argument(what + ": token " + std::to_string(t) + " has id " +
                                std::to_string(it.tokens[t]) + ", outside the vocabulary [0, " +
                                std::to_string(V) + ")");
    const int64_t end = (*st)->position() + static_cast<int64_t>(it.tokens.size());
    if (end > info_.max_context)
      return out_of_range(what + ": position " + std::to_string(end) + " exceeds the context of " +
                          std::to_string(info_.max_context) + " tokens");
    batch[i] = model::SequenceInput{*st, it.tokens, it.image_span, it.span_embeds};
    any_logits = any_logits || it.want_logits;
  }
  model::ForwardOptions opt;
  opt.logits = any_logits ? model::LogitsRows::kLast : model::LogitsRows::kNone;
  opt.dspark_features = spec_.has_value();  // MODEL_SPEC 3.10.2: during every target forward
  std::vector<model::SequenceOutput> res;
  DS41_RETURN_IF_ERROR(model_->forward(batch, opt, &res));
  if (spec_)
    for (size_t i = 0; i < items.size(); ++i)
      DS41_RETURN_IF_ERROR(spec_->dspark().commit_context(*batch[i].state, res[i].dspark_features.data(),
                                                          static_cast<int64_t>(items[i].tokens.size()),
                                                          res[i].dspark_first_pos));
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].want_logits) out->row[i] = rows++;
  out->logits.resize(rows * V);
  for (size_t i = 0; i < items.size(); ++i) {
    if (out->row[i] < 0) continue;
    DS41_CHECK(static_cast<int64_t>(res[i].logits.size()) == V, "forward returned no last-row logits");
    std::memcpy(out->logits.data() + out->row[i] * V, res[i].logits.data(), V * sizeof(float));
  }
  return ok_status();
}

Result<std::vector<uint8_t>> CpuEngine::export_kv_block(SeqId seq, int64_t index,
                                                        int64_t block_tokens) const {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  return encode_kv_block(*s, index, block_tokens);
}

Result<std::vector<uint8_t>> CpuEngine::export_swa_snapshot(SeqId seq, int64_t block_tokens,
                                                            bool approximate) const {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  return encode_swa_snapshot(*s, block_tokens, approximate ? kSwaFlagApproximate : 0u);
}

Status CpuEngine::import_state(SeqId seq, std::span<const std::span<const uint8_t>> blocks,
                               std::span<const uint8_t> snapshot, int64_t block_tokens) {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  const int64_t end = static_cast<int64_t>(blocks.size()) * block_tokens;
  if (end > info_.max_context)
    return out_of_range("state import of " + std::to_string(end) + " tokens exceeds the context of " +
                        std::to_string(info_.max_context));
  DS41_RETURN_IF_ERROR(decode_state(*s, blocks, snapshot, block_tokens));
  restart_draft(*s);
  return ok_status();
}

Status CpuEngine::replay_window(SeqId seq, std::span<const int32_t> prefix_tokens) {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  // Work on a copy so an error leaves the sequence as it was (Engine contract).
  model::SequenceState tmp(*s);
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kNone;
  DS41_RETURN_IF_ERROR(model_->encoder_replay(tmp, prefix_tokens, opt).status());
  *s = std::move(tmp);
  restart_draft(*s);
  return ok_status();
}

Status CpuEngine::prefill_decoder_replay(SeqId seq, std::span<const int32_t> tokens) {
  DS41_ASSIGN_OR_RETURN(model::SequenceState * s, find(seq));
  if (tokens.empty()) return invalid_argument("decoder replay: no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= info_.vocab_size)
      return invalid_argument("decoder replay: token id " + std::to_string(t) + " outside the vocabulary");
  if (static_cast<int64_t>(tokens.size()) > info_.max_context)
    return out_of_range("decoder replay: " + std::to_string(tokens.size()) + " tokens exceed the context");
  model::SequenceState tmp(*s);
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kNone;
  DS41_RETURN_IF_ERROR(model_->prefill_decoder_replay(tmp, tokens, opt).status());
  *s = std::move(tmp);
  restart_draft(*s);
  return ok_status();
}

Status CpuEngine::enable_speculative() {
  if (spec_) return ok_status();
  if (!seqs_.empty())
    return failed_precondition("speculative decoding must be enabled before any sequence exists");
  DS41_ASSIGN_OR_RETURN(DsparkDecoder d, DsparkDecoder::create(model_));
  spec_.emplace(std::move(d));
  auto probe = model_->new_sequence();
  spec_->dspark().enable(*probe);
  bounded_bytes_ = probe->bounded_bytes();  // admission counts the draft rings too
  return ok_status();
}

int64_t CpuEngine::speculative_block() const { return spec_ ? spec_->dspark().block_size() : 0; }

// Serial over the items: the CPU reference batches nothing across speculative steps (each is a
// draft forward of B rows and one verification forward of up to B + 1 rows). Every item is drafted
// first (no state change), then the verify lengths are chosen under the batch budget
// (MODEL_SPEC 3.10.9, budget_verify_lengths), then each item is verified.
Status CpuEngine::speculative_step(std::span<const SpecStepItem> items, const SpecBatchOptions& batch,
                                   std::vector<SpecStepResult>* out) {
  if (!spec_) return failed_precondition("speculative decoding is off (CpuEngine::enable_speculative)");
  out->assign(items.size(), SpecStepResult{});
  std::unordered_set<SeqId> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const SpecStepItem& it = items[i];
    const std::string what =
        "speculative item " + std::to_string(i) + " (sequence " + std::to_string(it.seq) + ")";
    DS41_ASSIGN_OR_RETURN(model::SequenceState * st, find(it.seq));
    if (!seen.insert(it.seq).second) return invalid_argument(what + ": sequence appears twice in one step");
    if (it.anchor < 0 || it.anchor >= info_.vocab_size)
      return invalid_argument(what + ": anchor token " + std::to_string(it.anchor) +
                              " outside the vocabulary");
    if (it.verify_len > spec_->dspark().block_size())
      return invalid_argument(what + ": verify_len above the block size");
    if (st->position() + spec_->dspark().block_size() + 1 > info_.max_context)
      return out_of_range(what + ": a speculative step would pass the context of " +
                          std::to_string(info_.max_context) + " tokens");
  }
  std::vector<SpecStepOptions> opts(items.size());
  std::vector<SpecDraft> drafts(items.size());
  std::vector<std::vector<float>> conf(items.size());
  std::vector<int64_t> cap(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const SpecStepItem& it = items[i];
    SpecStepOptions& so = opts[i];
    so.verify_len = it.verify_len;
    so.confidence_threshold = it.confidence_threshold;
    so.temperature = it.temperature;
    if (it.temperature > 0) so.rng = &spec_rng_.try_emplace(it.seq, it.seed).first->second;
    DS41_ASSIGN_OR_RETURN(drafts[i], spec_->draft(*seqs_.at(it.seq), it.anchor, so));
    conf[i] = drafts[i].confidence;
    cap[i] = drafts[i].verify_len;
  }
  const std::vector<int64_t> len = budget_verify_lengths(conf, cap, batch.verify_budget);
  for (size_t i = 0; i < items.size(); ++i) {
    DS41_ASSIGN_OR_RETURN(SpecStep s,
                          spec_->verify(*seqs_.at(items[i].seq), std::move(drafts[i]), len[i], opts[i]));
    (*out)[i].tokens = std::move(s.tokens);
    (*out)[i].verified = s.verified;
    (*out)[i].accepted = s.accepted;
    (*out)[i].budget_cut = cap[i] - len[i];
    (*out)[i].candidates = std::move(s.candidates);
    (*out)[i].confidence = std::move(s.confidence);
  }
  return ok_status();
}

}  // namespace ds41::engine
