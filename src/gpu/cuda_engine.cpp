// ds41 gpu: CudaEngine (cuda_engine.h).
#include "gpu/cuda_engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/cuda_status.h"
#include "engine/speculative.h"
#include "engine/state_codec.h"
#include "model/dspark.h"
#include "model/decoder_replay_plan.h"
#include "model/image_input.h"

namespace ds41::gpu {

Result<std::unique_ptr<CudaEngine>> CudaEngine::create(const DeviceModel* model,
                                                       const CudaEngineOptions& opt) {
  if (!model) return invalid_argument("CUDA engine: no model");
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  e->model_ = model;
  const model::ModelConfig& c = model->config();
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaSetDevice(model->device()), "select the model's device"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&e->stream_, cudaStreamNonBlocking),
                                         "create the engine stream"));
  const GpuLimits lim = resolve_limits(c, model->schedule(), opt.limits);
  e->info_.model_name = opt.model_name;
  e->info_.device = "cuda:" + std::to_string(model->device());
  e->info_.vocab_size = c.vocab_size;
  e->info_.max_context = lim.max_context;
  e->info_.eos_token_id = static_cast<int32_t>(c.eos_token_id);
  // replay_window (as model::Model::encoder_replay): the last window by id, the Engram look-back.
  e->info_.replay_lookback =
      c.sliding_window + (model->hasher() ? std::max<int64_t>(0, c.engram_max_ngram_size - 1) : 0);
  const model::KvLayout& layout = model->kv_layout();
  if (opt.entries_per_page <= 0) return invalid_argument("CUDA engine: entries_per_page must be > 0");
  int64_t page_bytes = 0;
  for (const model::KvSourceLayout& s : layout.sources) page_bytes = opt.entries_per_page * s.entry_bytes();
  const int64_t pages = page_bytes > 0 ? std::max<int64_t>(opt.kv_bytes / page_bytes, 1) : 0;
  DS41_ASSIGN_OR_RETURN(e->pool_, KvBlockPool::create(layout, pages, opt.entries_per_page));
  DS41_ASSIGN_OR_RETURN(e->slots_, SequenceSlots::create(layout, opt.max_sequences));
  DS41_ASSIGN_OR_RETURN(e->fwd_, GpuForward::create(*model, lim, &e->pool_, &e->slots_, e->stream_));
  // The vision tower computes with exact activations only: under --numerics fp8-act the engine has no
  // tower, and an image is refused by name (encode_images) rather than encoded with other numerics than
  // the CPU reference's.
  if (opt.vision && c.has_vision && lim.numerics == quant::ActNumerics::kExact) {
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&e->vision_stream_, cudaStreamNonBlocking),
                                           "create the vision encoder stream"));
    DS41_ASSIGN_OR_RETURN(e->vision_, GpuVisionTower::create(*model, opt.vision_limits, e->vision_stream_));
    e->info_.has_vision = true;
  }
  e->bounded_bytes_ = e->slots_.slot_bytes() + static_cast<int64_t>(sizeof(engram::EngramHashState));
  return e;
}

CudaEngine::~CudaEngine() {
  seqs_.clear();
  fwd_.reset();
  vision_.reset();  // its cuBLAS handle is bound to its stream
  if (vision_stream_) cudaStreamDestroy(vision_stream_);
  if (stream_) cudaStreamDestroy(stream_);
}

Result<GpuSequence*> CudaEngine::find(engine::SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("sequence " + std::to_string(seq) + " does not exist");
  return it->second.get();
}

Result<engine::SeqId> CudaEngine::create_sequence() {
  DS41_ASSIGN_OR_RETURN(int32_t slot, slots_.allocate());
  Status cl = slots_.clear_pending(slot, stream_);
  if (cl.ok()) cl = cuda::cuda_status(cudaStreamSynchronize(stream_), "create sequence");
  if (!cl.ok()) {
    slots_.release(slot);
    return cl;
  }
  auto s = std::make_unique<GpuSequence>();
  s->slot = slot;
  for (const model::KvSourceLayout& src : model_->kv_layout().sources) {
    GpuSourceMirror m;
    if (src.ratio > 1) m.pend_filled.assign(src.ratio, 0);
    s->sources.push_back(std::move(m));
  }
  if (model_->hasher()) s->engram = model_->hasher()->new_state();
  s->window_floor.assign(static_cast<size_t>(model_->config().num_hidden_layers), 0);
  const engine::SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

void CudaEngine::release(GpuSequence& s) {
  for (GpuSourceMirror& m : s.sources)
    for (int32_t p : m.pages) pool_.pages().release(p);
  for (GpuSourceMirror& m : s.sources) m.pages.clear();
  if (s.slot >= 0) slots_.release(s.slot);
  s.slot = -1;
}

Result<engine::SeqId> CudaEngine::fork_sequence(engine::SeqId src) {
  DS41_ASSIGN_OR_RETURN(GpuSequence * from, find(src));
  DS41_ASSIGN_OR_RETURN(int32_t slot, slots_.allocate());
  auto s = std::make_unique<GpuSequence>(*from);
  s->slot = slot;
  // Full pages are shared (never written again); the partial last page is copied because both
  // sequences will append to it.
  const int64_t E = pool_.geometry().entries_per_page, pb = pool_.geometry().page_bytes();
  Status st = slots_.copy(from->slot, slot, stream_);
  std::vector<int32_t> taken;
  for (GpuSourceMirror& m : s->sources) {
    for (size_t i = 0; i < m.pages.size() && st.ok(); ++i) {
      const bool partial = i + 1 == m.pages.size() && m.count % E != 0;
      if (!partial) {
        pool_.pages().retain(m.pages[i]);
        taken.push_back(m.pages[i]);
        continue;
      }
      auto page = pool_.pages().allocate();
      if (!page.ok()) {
        st = page.status();
        break;
      }
      taken.push_back(*page);
      st = cuda::cuda_status(cudaMemcpyAsync(pool_.base() + *page * pb, pool_.base() + m.pages[i] * pb,
                                             static_cast<size_t>(pb), cudaMemcpyDeviceToDevice, stream_),
                             "copy a partial KV page");
      m.pages[i] = *page;
    }
  }
  if (st.ok()) st = fwd_->copy_draft_rings(from->slot, slot);
  if (st.ok()) st = cuda::cuda_status(cudaStreamSynchronize(stream_), "fork sequence");
  if (!st.ok()) {
    for (int32_t p : taken) pool_.pages().release(p);
    slots_.release(slot);
    return st.with_context("fork of sequence " + std::to_string(src));
  }
  const engine::SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  if (auto it = spec_rng_.find(src); it != spec_rng_.end()) spec_rng_.emplace(id, it->second);
  return id;
}

Status CudaEngine::free_sequence(engine::SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("sequence " + std::to_string(seq) + " does not exist");
  release(*it->second);
  seqs_.erase(it);
  spec_rng_.erase(seq);
  return ok_status();
}

Result<int64_t> CudaEngine::sequence_position(engine::SeqId seq) const {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  return s->position;
}

// As CpuEngine: bounded state (rings, pending groups, Engram look-back) + the emitted entries.
Result<int64_t> CudaEngine::sequence_bytes(engine::SeqId seq) const {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  int64_t b = bounded_bytes_;
  const auto& srcs = model_->kv_layout().sources;
  for (size_t j = 0; j < srcs.size(); ++j) b += s->sources[j].count * srcs[j].entry_bytes();
  return b;
}

int64_t CudaEngine::bytes_for_tokens(int64_t tokens) const {
  int64_t b = bounded_bytes_;
  for (const model::KvSourceLayout& s : model_->kv_layout().sources)
    b += (tokens / s.ratio) * s.entry_bytes();
  return b;
}

Status CudaEngine::validate(std::span<const engine::StepItem> items) const {
  const int64_t V = info_.vocab_size;
  std::unordered_set<engine::SeqId> seen;
  int64_t pages = 0;
  const int64_t E = pool_.geometry().entries_per_page;
  for (size_t i = 0; i < items.size(); ++i) {
    const engine::StepItem& it = items[i];
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
    if (!it.image_span.empty() && it.image_span.size() != it.tokens.size())
      return invalid_argument(what + ": image_span has " + std::to_string(it.image_span.size()) +
                              " flags for " + std::to_string(it.tokens.size()) + " tokens");
    if (!it.span_embeds.empty()) {
      int64_t flagged = 0;
      for (uint8_t f : it.image_span) flagged += f != 0;
      if (static_cast<int64_t>(it.span_embeds.size()) != flagged * model_->config().hidden_size)
        return invalid_argument(what + ": span_embeds has " + std::to_string(it.span_embeds.size()) +
                                " values for " + std::to_string(flagged) + " image-span positions of width " +
                                std::to_string(model_->config().hidden_size));
    }
    const int64_t pos = (*st)->position, end = pos + static_cast<int64_t>(it.tokens.size());
    if (end > info_.max_context)
      return out_of_range(what + ": position " + std::to_string(end) + " exceeds the context of " +
                          std::to_string(info_.max_context) + " tokens");
    const auto& srcs = model_->kv_layout().sources;
    for (size_t j = 0; j < srcs.size(); ++j) {
      const int64_t have = static_cast<int64_t>((*st)->sources[j].pages.size());
      pages += std::max<int64_t>(0, (end / srcs[j].ratio + E - 1) / E - have);
    }
  }
  if (pages > pool_.pages().free_pages())
    return resource_exhausted("CUDA engine: the step needs " + std::to_string(pages) + " new KV pages, " +
                              std::to_string(pool_.pages().free_pages()) + " are free");
  return ok_status();
}

Status CudaEngine::forward(std::span<const engine::StepItem> items, model::LogitsRows rows, bool record,
                           std::vector<model::SequenceOutput>* out, std::vector<float>* layer_ms,
                           std::vector<int64_t>* layer_launches, const LogitsSink& logits_to) {
  GpuForwardOptions fo;
  fo.record = record;
  fo.layer_ms = layer_ms;
  fo.layer_launches = layer_launches;
  return forward_rounds(items, rows, fo, out, logits_to);
}

Status CudaEngine::forward_rounds(std::span<const engine::StepItem> items, model::LogitsRows rows,
                                  const GpuForwardOptions& fo_in, std::vector<model::SequenceOutput>* out,
                                  const LogitsSink& logits_to, std::vector<int32_t>* item_argmax) {
  out->assign(items.size(), model::SequenceOutput{});
  if (item_argmax) {
    if (rows != model::LogitsRows::kLast || logits_to)
      return internal_error("CUDA engine: per-item argmax needs last-row logits and no logits sink");
    item_argmax->assign(items.size(), -1);
  }
  if (items.empty()) return ok_status();
  DS41_RETURN_IF_ERROR(validate(items));
  const GpuLimits& lim = fwd_->limits();
  // Rounds: each takes the next chunk of every unfinished item, within the forward's limits; a
  // chunk carries its image flags and the span rows of its flagged positions.
  std::vector<size_t> done(items.size(), 0), rows_done(items.size(), 0);
  const size_t H = static_cast<size_t>(model_->config().hidden_size);
  for (;;) {
    std::vector<GpuSeqInput> batch;
    std::vector<size_t> which;
    int64_t tokens = 0, logit_rows = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const size_t left = items[i].tokens.size() - done[i];
      if (left == 0) continue;
      if (static_cast<int64_t>(batch.size()) >= lim.max_step_seqs || tokens >= lim.max_step_tokens) break;
      int64_t take = std::min<int64_t>(static_cast<int64_t>(left), lim.max_step_tokens - tokens);
      model::LogitsRows lr = model::LogitsRows::kNone;
      if (rows == model::LogitsRows::kAll) {
        take = std::min<int64_t>(take, lim.max_logit_rows - logit_rows);
        if (take <= 0) break;
        lr = rows;
      } else if (rows == model::LogitsRows::kLast && take == static_cast<int64_t>(left)) {
        if (logit_rows >= lim.max_logit_rows) break;
        lr = rows;
      }
      GpuSeqInput in;
      in.seq = *find(items[i].seq);
      in.tokens = items[i].tokens.subspan(done[i], static_cast<size_t>(take));
      in.logits = lr;
      if (!items[i].image_span.empty()) {
        in.image_span = items[i].image_span.subspan(done[i], static_cast<size_t>(take));
        size_t flagged = 0;
        for (uint8_t f : in.image_span) flagged += f != 0;
        if (!items[i].span_embeds.empty())
          in.span_embeds = items[i].span_embeds.subspan(rows_done[i] * H, flagged * H);
      }
      logit_rows +=
          in.logits == model::LogitsRows::kAll ? take : (in.logits == model::LogitsRows::kLast ? 1 : 0);
      tokens += take;
      batch.push_back(in);
      which.push_back(i);
    }
    if (batch.empty()) break;
    std::vector<model::SequenceOutput> res;
    std::vector<int64_t> first(batch.size());
    for (size_t b = 0; b < batch.size(); ++b) first[b] = batch[b].seq->position;
    GpuForwardOptions fo = fo_in;
    if (logits_to)  // batch index -> item
      fo.logits_to = [&](size_t b, const float* r, int64_t n) { logits_to(which[b], r, n); };
    std::vector<int32_t> amax;
    if (item_argmax) {
      fo.argmax = &amax;
      fo.argmax_checked = true;
    }
    DS41_RETURN_IF_ERROR(fwd_->run(batch, fo, &res));
    if (item_argmax) {  // one token per logits row, the rows in batch order (kLast: one per finishing item)
      size_t k = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        if (batch[b].logits == model::LogitsRows::kNone) continue;
        if (k >= amax.size()) return internal_error("CUDA engine: the forward returned fewer argmax tokens than rows");
        (*item_argmax)[which[b]] = amax[k++];
      }
      if (k != amax.size()) return internal_error("CUDA engine: the forward returned more argmax tokens than rows");
    }
    if (fwd_->dspark_enabled() && fo.last_layer < 0) {  // MODEL_SPEC 3.10.3: every row is committed
      std::vector<GpuContextRows> cr;
      int64_t row = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        const int64_t nb = static_cast<int64_t>(batch[b].tokens.size());
        cr.push_back(GpuContextRows{batch[b].seq, row, first[b], nb});
        row += nb;
      }
      DS41_RETURN_IF_ERROR(fwd_->dspark_commit(cr).with_context("DSpark context rows"));
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t i = which[b];
      done[i] += batch[b].tokens.size();
      for (uint8_t f : batch[b].image_span) rows_done[i] += f != 0;
      (*out)[i].append(std::move(res[b]));
    }
  }
  return ok_status();
}

Status CudaEngine::step(std::span<const engine::StepItem> items, engine::StepOutput* out) {
  const int64_t V = info_.vocab_size;
  out->vocab = V;
  out->logits.clear();
  out->token.clear();
  out->row.assign(items.size(), -1);
  if (items.empty()) return ok_status();
  // Every logits item drawn greedily (StepItem::greedy_only): the checked argmax on the device, one
  // token per item crosses to the host (engine.h).
  bool any_logits = false, all_greedy = true;
  for (const engine::StepItem& it : items) {
    any_logits = any_logits || it.want_logits;
    all_greedy = all_greedy && (!it.want_logits || it.greedy_only);
  }
  if (any_logits && all_greedy) {
    std::vector<model::SequenceOutput> res;
    std::vector<int32_t> amax;
    DS41_RETURN_IF_ERROR(forward_rounds(items, model::LogitsRows::kLast, GpuForwardOptions{}, &res, {}, &amax));
    out->token.assign(items.size(), -1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].want_logits) continue;
      if (amax[i] == cuda::kArgmaxInvalidRow) {
        out->token[i] = engine::StepOutput::kInvalidRow;
      } else if (amax[i] < 0 || amax[i] >= V) {
        return internal_error("GPU forward returned no greedy token for item " + std::to_string(i));
      } else {
        out->token[i] = amax[i];
      }
    }
    return ok_status();
  }
  // Items without want_logits are run in the same forwards; their logits are not computed.
  // The rows go from the pinned arena straight into out->logits (a caller that keeps its StepOutput
  // across steps reuses its pages: no fresh vector per sequence and step).
  std::vector<engine::StepItem> with(items.begin(), items.end());
  std::vector<model::SequenceOutput> res;
  bool any = false;
  for (const engine::StepItem& it : items) any = any || it.want_logits;
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].want_logits) out->row[i] = rows++;
  out->logits.resize(rows * V);
  std::vector<uint8_t> got(items.size(), 0);
  const LogitsSink sink = [&](size_t i, const float* r, int64_t n) {
    if (out->row[i] < 0 || n < 1) return;
    std::memcpy(out->logits.data() + out->row[i] * V, r + (n - 1) * V, V * sizeof(float));
    got[i] = 1;
  };
  DS41_RETURN_IF_ERROR(
      forward(with, any ? model::LogitsRows::kLast : model::LogitsRows::kNone, false, &res, nullptr, nullptr, sink));
  for (size_t i = 0; i < items.size(); ++i)
    if (out->row[i] >= 0 && !got[i]) return internal_error("GPU forward returned no last-row logits");
  return ok_status();
}

Result<std::vector<std::vector<float>>> CudaEngine::encode_images(
    std::span<const image::PreparedImage* const> images) {
  if (!vision_)
    return failed_precondition(
        !model_->config().has_vision ? "this model has no vision tower (no vision_config in config.json)"
        : fwd_->limits().numerics != quant::ActNumerics::kExact
            ? "images need --numerics exact on the cuda engine (its vision tower has no fp8-act form yet; "
              "--device cpu encodes them with FP8 activations)"
            : "the GPU engine was created without its vision tower (CudaEngineOptions::vision)");
  // The caller may be the loop's encoder thread: the tower's device is current on it, and it runs
  // alone on its stream (Engine contract: encode_images concurrently with step()).
  std::lock_guard<std::mutex> lk(encode_mu_);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaSetDevice(model_->device()), "select the model's device"));
  GpuVisionTower* tower = vision_.get();
  DS41_ASSIGN_OR_RETURN(auto enc, model::encode_prepared_images(
                                      model_->config(),
                                      [tower](std::span<const model::VisionImageInput> in, bool keep) {
                                        return tower->encode(in, keep);
                                      },
                                      tower->markers(), images));
  std::vector<std::vector<float>> out;
  for (auto& e : enc) out.push_back(std::move(e.span_embeds));
  return out;
}

// ---- State export / import (engine.h; payloads of engine/state_codec.h) ----

engine::StateView CudaEngine::meta_view(const GpuSequence& s) const {
  const model::KvLayout& L = model_->kv_layout();
  engine::StateView v;
  v.layout = &L;
  v.position = s.position;
  v.last_published_source = s.last_published_source;
  v.engram = s.engram;
  v.window_floors = s.window_floor;
  v.window_floors.resize(static_cast<size_t>(L.n_layers), 0);
  for (size_t j = 0; j < L.sources.size(); ++j) {
    engine::SourceStateView sv;
    sv.count = s.sources[j].count;
    v.sources.push_back(sv);
  }
  return v;
}

Status CudaEngine::view_rows(const GpuSequence& s, std::span<const int64_t> first, std::span<const int64_t> rows,
                             bool bounded, HostRows* h, engine::StateView* v) const {
  const model::KvLayout& L = model_->kv_layout();
  *v = meta_view(s);
  const size_t ns = L.sources.size();
  h->kv.resize(ns);
  h->key.resize(ns);
  h->pend_a.resize(ns);
  h->pend_b.resize(ns);
  for (size_t j = 0; j < ns; ++j) {
    const model::KvSourceLayout& sl = L.sources[j];
    engine::SourceStateView& sv = v->sources[j];
    h->kv[j].resize(static_cast<size_t>(rows[j] * sl.kv_row_bytes));
    h->key[j].resize(static_cast<size_t>(rows[j] * sl.key_row_bytes));
    if (rows[j] > 0)
      DS41_RETURN_IF_ERROR(
          pool_.download_entries(s.sources[j].pages, first[j], rows[j], h->kv[j].data(), h->key[j].data(), stream_));
    sv.first = first[j];
    sv.rows = rows[j];
    sv.kv = h->kv[j].data();
    sv.key = h->key[j].data();
    if (bounded && sl.ratio > 1) {
      h->pend_a[j].resize(static_cast<size_t>(sl.ratio * sl.kv_dim));
      h->pend_b[j].resize(static_cast<size_t>(sl.ratio * sl.kv_dim));
      DS41_RETURN_IF_ERROR(slots_.download_pending(s.slot, slots_.pending_index(static_cast<int64_t>(j)), sl.ratio,
                                                   h->pend_a[j].data(), h->pend_b[j].data(), stream_));
      sv.pend_filled = s.sources[j].pend_filled.data();
      sv.pend_a = h->pend_a[j].data();
      sv.pend_b = h->pend_b[j].data();
    }
  }
  if (bounded) {
    h->rings.resize(static_cast<size_t>(slots_.ring_slot_bytes()));
    DS41_RETURN_IF_ERROR(slots_.download_rings(s.slot, h->rings.data(), stream_));
    v->rings.resize(static_cast<size_t>(L.n_layers));
    for (int64_t l = 0; l < L.n_layers; ++l) v->rings[l] = h->rings.data() + l * L.window * L.window_row_bytes;
  }
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "state export");
}

Result<std::vector<uint8_t>> CudaEngine::export_kv_block(engine::SeqId seq, int64_t index, int64_t B) const {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  const model::KvLayout& L = model_->kv_layout();
  // Argument errors come from the codec itself (the same messages as the CPU engine), before any
  // row is read.
  if (!engine::check_block_tokens(L, B).ok() || index < 0 || (index + 1) * B > s->position)
    return engine::encode_kv_block(meta_view(*s), index, B);
  std::vector<int64_t> first, rows;
  for (const model::KvSourceLayout& sl : L.sources) {
    first.push_back(index * (B / sl.ratio));
    rows.push_back(B / sl.ratio);
  }
  HostRows h;
  engine::StateView v;
  DS41_RETURN_IF_ERROR(view_rows(*s, first, rows, false, &h, &v).with_context("export of a global-KV block"));
  return engine::encode_kv_block(v, index, B);
}

Result<std::vector<uint8_t>> CudaEngine::export_swa_snapshot(engine::SeqId seq, int64_t B, bool approximate) const {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  const model::KvLayout& L = model_->kv_layout();
  DS41_RETURN_IF_ERROR(engine::check_block_tokens(L, B));
  const int64_t full = s->position / B;
  std::vector<int64_t> first, rows;
  for (size_t j = 0; j < L.sources.size(); ++j) {
    first.push_back(full * (B / L.sources[j].ratio));
    rows.push_back(std::max<int64_t>(0, s->sources[j].count - first.back()));
  }
  HostRows h;
  engine::StateView v;
  DS41_RETURN_IF_ERROR(view_rows(*s, first, rows, true, &h, &v).with_context("export of an SWA snapshot"));
  return engine::encode_swa_snapshot(v, B, approximate ? engine::kSwaFlagApproximate : 0u);
}

Status CudaEngine::import_state(engine::SeqId seq, std::span<const std::span<const uint8_t>> blocks,
                                std::span<const uint8_t> snapshot, int64_t B) {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  const int64_t end = static_cast<int64_t>(blocks.size()) * B;
  if (end > info_.max_context)
    return out_of_range("state import of " + std::to_string(end) + " tokens exceeds the context of " +
                        std::to_string(info_.max_context));
  const model::KvLayout& L = model_->kv_layout();
  DS41_ASSIGN_OR_RETURN(engine::ParsedState ps, engine::parse_state(L, s->position, blocks, snapshot, B));
  if (ps.position > info_.max_context)
    return out_of_range("state import at position " + std::to_string(ps.position) + " exceeds the context of " +
                        std::to_string(info_.max_context));
  // Pages for every entry, all taken before any upload (none is taken when they do not all fit).
  const int64_t E = pool_.geometry().entries_per_page;
  int64_t need = 0;
  for (const engine::ParsedSource& src : ps.sources) need += (src.count + E - 1) / E;
  if (need > pool_.pages().free_pages())
    return resource_exhausted("CUDA engine: the state import needs " + std::to_string(need) + " KV pages, " +
                              std::to_string(pool_.pages().free_pages()) + " are free");
  std::vector<GpuSourceMirror> next = s->sources;
  std::vector<int32_t> taken;
  for (size_t j = 0; j < L.sources.size(); ++j) {
    GpuSourceMirror& m = next[j];
    while (static_cast<int64_t>(m.pages.size()) * E < ps.sources[j].count) {
      auto page = pool_.pages().allocate();
      if (!page.ok()) {  // not reached: the free count was checked
        for (int32_t p : taken) pool_.pages().release(p);
        return page.status();
      }
      taken.push_back(*page);
      m.pages.push_back(*page);
    }
    m.count = ps.sources[j].count;
  }
  Status st = ok_status();
  std::vector<uint8_t> rings;
  for (size_t j = 0; j < L.sources.size() && st.ok(); ++j) {
    const model::KvSourceLayout& sl = L.sources[j];
    const engine::ParsedSource& src = ps.sources[j];
    const int64_t per = B / sl.ratio;
    for (int64_t b = 0; b < ps.n_blocks() && st.ok(); ++b) {
      const uint8_t* p = ps.blocks[b].data() + src.block_offset;
      st = pool_.upload_entries(next[j].pages, b * per, per, p, p + per * sl.kv_row_bytes, stream_);
    }
    if (st.ok() && src.tail > 0)
      st = pool_.upload_entries(next[j].pages, ps.n_blocks() * per, src.tail, src.tail_kv, src.tail_key, stream_);
    if (st.ok() && sl.ratio > 1 && src.pend_filled) {
      st = slots_.upload_pending(s->slot, slots_.pending_index(static_cast<int64_t>(j)), sl.ratio, src.pend_a,
                                 src.pend_b, stream_);
      next[j].pend_filled.assign(src.pend_filled, src.pend_filled + sl.ratio);
    }
  }
  if (st.ok() && ps.has_snapshot) {
    // The rings as the slot holds them: position p at row p % window of each layer.
    const int64_t W = L.window, rb = L.window_row_bytes, r0 = std::max<int64_t>(0, ps.position - W);
    rings.assign(static_cast<size_t>(slots_.ring_slot_bytes()), 0);
    for (int64_t l = 0; l < L.n_layers; ++l)
      for (int64_t p = r0; p < ps.position; ++p)
        std::memcpy(rings.data() + (l * W + p % W) * rb, ps.rings[l] + (p - r0) * rb, static_cast<size_t>(rb));
    st = slots_.upload_rings(s->slot, rings.data(), stream_);
  }
  // Host payloads (pageable) must stay alive until the copies finish: wait here in every case.
  Status sync = cuda::cuda_status(cudaStreamSynchronize(stream_), "state import");
  if (st.ok()) st = sync;
  if (!st.ok()) {
    for (int32_t p : taken) pool_.pages().release(p);
    return st.with_context("state import");
  }
  s->sources = std::move(next);
  s->position = ps.position;
  if (ps.has_snapshot) {
    s->engram = ps.engram;
    s->last_published_source = ps.last_published_source;
    s->window_floor = ps.window_floors;
  }
  s->draft_next = s->draft_first = s->position;  // no draft rows travel with the state
  return ok_status();
}

Status CudaEngine::replay_window(engine::SeqId seq, std::span<const int32_t> prefix_tokens) {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  // MODEL_SPEC 4.5, as model::Model::encoder_replay (the same checks and messages).
  const int64_t H = static_cast<int64_t>(prefix_tokens.size());
  if (H == 0) return invalid_argument("encoder replay: empty prefix");
  if (s->position != H)
    return failed_precondition("encoder replay: the state holds " + std::to_string(s->position) +
                               " positions but the prefix has " + std::to_string(H) + " tokens");
  const int64_t b = std::max<int64_t>(0, H - model_->config().sliding_window);
  const GpuSequence saved = *s;
  // Forget what a prefix cache would not persist: window rings (floored at b), pending groups, and
  // rebuild the Engram look-back from the tokens before the replay start.
  s->window_floor.assign(static_cast<size_t>(model_->config().num_hidden_layers), b);
  for (GpuSourceMirror& m : s->sources) std::fill(m.pend_filled.begin(), m.pend_filled.end(), 0);
  if (const engram::EngramHasher* hasher = model_->hasher()) {
    engram::EngramHashState hs = hasher->new_state();
    Status st = hasher->append(hs, prefix_tokens.subspan(0, static_cast<size_t>(b)), {}, {});
    if (!st.ok()) {
      *s = saved;
      return st;
    }
    s->engram = hs;
  }
  s->position = b;
  // The replayed rows re-emit no compressed entry (those below the sequence's count are kept) and
  // take no new page; their window rows and the last partial group land in the slot.
  engine::StepItem it{seq, prefix_tokens.subspan(static_cast<size_t>(b)), false};
  std::vector<model::SequenceOutput> out;
  Status st = forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kNone, false, &out);
  if (!st.ok()) {
    *s = saved;
    return st.with_context("encoder replay");
  }
  return ok_status();
}

// MODEL_SPEC 4.4 with the CPU reference's semantics (model::Model::prefill_decoder_replay: one
// forward over every row, ForwardPass::keep_tail_rows after the cut), as two exact forwards:
//   (a) rows [0, first_kept) through layers 0..cut only (GpuForwardOptions::last_layer), in chunks
//       of max_step_tokens (chunked prefill is exact: absolute-position visibility, the pending
//       group and the Engram look-back carried across, MODEL_SPEC 3.4.5 / 4.2);
//   (b) the windows of layers > cut floored at first_kept (they never read a position below it,
//       so the ring rows (a) did not write for them are never read; the floors stay for the
//       decode steps that follow, as the CPU's);
//   (c) rows [first_kept, L) through every layer (the logits rows asked for: none for the
//       Engine entry point).
// (c)'s rows see in layers 0..cut exactly what the one-shot pass gives them (their window rows
// below first_kept are in the rings (a) wrote; the compressors' pending groups, the candidate
// source's pool over all L entries and the Reindex / Reuse selections are computed for these
// rows over the complete caches), and in layers > cut only keys >= first_kept, as keep_tail_rows
// leaves them. Layers 0..cut run (c)'s rows once more than the one-shot pass needs to; their
// outputs for those rows are the same computation. An error leaves the sequence fresh: pages
// taken by committed rounds are released and the host mirror restored (the slot's device rows
// are beyond the fresh position, never read).
Status CudaEngine::prefill_decoder_replay(engine::SeqId seq, std::span<const int32_t> tokens) {
  model::SequenceOutput out;
  return decoder_replay(seq, tokens, model::LogitsRows::kNone, &out);
}

Status CudaEngine::decoder_replay(engine::SeqId seq, std::span<const int32_t> tokens, model::LogitsRows rows,
                                  model::SequenceOutput* result) {
  *result = model::SequenceOutput{};
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  // The CPU engine's checks and messages, in its order (CpuEngine, then Model).
  if (tokens.empty()) return invalid_argument("decoder replay: no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= info_.vocab_size)
      return invalid_argument("decoder replay: token id " + std::to_string(t) + " outside the vocabulary");
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (L > info_.max_context)
    return out_of_range("decoder replay: " + std::to_string(L) + " tokens exceed the context");
  DS41_ASSIGN_OR_RETURN(const model::DecoderReplayPlan dp,
                        model::plan_decoder_replay(model_->config(), model_->schedule(), L));
  if (s->position != 0) return failed_precondition("decoder replay: needs a fresh sequence state");
  // Pages for the whole prompt before any row runs (resource_exhausted leaves it fresh).
  const engine::StepItem all{seq, tokens, false};
  DS41_RETURN_IF_ERROR(validate(std::span<const engine::StepItem>(&all, 1)).with_context("decoder replay"));

  const GpuSequence saved = *s;
  std::vector<model::SequenceOutput> out;
  Status st = ok_status();
  if (dp.first_kept > 0) {  // (a)
    GpuForwardOptions fo;
    fo.last_layer = dp.cut;
    const engine::StepItem head{seq, tokens.first(static_cast<size_t>(dp.first_kept)), false};
    st = forward_rounds(std::span<const engine::StepItem>(&head, 1), model::LogitsRows::kNone, fo, &out);
  }
  if (st.ok()) {  // (b)
    const int64_t nl = model_->config().num_hidden_layers;
    s->window_floor.resize(static_cast<size_t>(nl), 0);
    for (int64_t l = 0; l < nl; ++l) s->window_floor[l] = dp.floor_after(l, s->window_floor[l]);
    // (c)
    const engine::StepItem tail{seq, tokens.subspan(static_cast<size_t>(dp.first_kept)), false};
    st = forward_rounds(std::span<const engine::StepItem>(&tail, 1), rows, GpuForwardOptions{}, &out);
  }
  if (!st.ok()) {
    for (size_t j = 0; j < s->sources.size(); ++j)  // rounds only append pages
      for (size_t i = saved.sources[j].pages.size(); i < s->sources[j].pages.size(); ++i)
        pool_.pages().release(s->sources[j].pages[i]);
    *s = saved;
    return st.with_context("decoder replay");
  }
  *result = std::move(out[0]);
  return ok_status();
}

// ---- DSpark speculative decoding (MODEL_SPEC 3.10.7-3.10.9) ----

Status CudaEngine::enable_speculative() {
  if (spec_) return ok_status();
  if (!seqs_.empty())
    return failed_precondition("speculative decoding must be enabled before any sequence exists");
  const int64_t B = model_->config().dspark_block_size;
  const GpuLimits& lim = fwd_->limits();
  if (model_->weights().dspark && (lim.max_logit_rows < B + 1 || lim.max_step_tokens < B + 1))
    return failed_precondition("speculative decoding needs max_logit_rows and max_step_tokens >= " +
                               std::to_string(B + 1) + " (the block + the anchor)");
  DS41_RETURN_IF_ERROR(fwd_->enable_dspark());
  spec_ = true;
  // Admission counts the draft rings too (as CpuEngine).
  bounded_bytes_ += static_cast<int64_t>(model_->weights().dspark->stages.size()) * model_->config().sliding_window *
                    model_->kv_layout().window_row_bytes;
  return ok_status();
}

int64_t CudaEngine::speculative_block() const { return spec_ ? model_->config().dspark_block_size : 0; }

Status CudaEngine::speculative_step(std::span<const engine::SpecStepItem> items,
                                    const engine::SpecBatchOptions& batch,
                                    std::vector<engine::SpecStepResult>* out) {
  if (!spec_) return failed_precondition("speculative decoding is off (CudaEngine::enable_speculative)");
  out->assign(items.size(), engine::SpecStepResult{});
  const int64_t B = model_->config().dspark_block_size;
  std::unordered_set<engine::SeqId> seen;
  std::vector<engine::StepItem> as_steps(items.size());
  std::vector<std::vector<int32_t>> probe(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const engine::SpecStepItem& it = items[i];
    const std::string what = "speculative item " + std::to_string(i) + " (sequence " + std::to_string(it.seq) + ")";
    DS41_ASSIGN_OR_RETURN(GpuSequence * st, find(it.seq));
    if (!seen.insert(it.seq).second) return invalid_argument(what + ": sequence appears twice in one step");
    if (it.anchor < 0 || it.anchor >= info_.vocab_size)
      return invalid_argument(what + ": anchor token " + std::to_string(it.anchor) + " outside the vocabulary");
    if (it.verify_len > B) return invalid_argument(what + ": verify_len above the block size");
    if (st->position + B + 1 > info_.max_context)
      return out_of_range(what + ": a speculative step would pass the context of " +
                          std::to_string(info_.max_context) + " tokens");
    probe[i].assign(static_cast<size_t>(B + 1), it.anchor);
    as_steps[i] = engine::StepItem{it.seq, probe[i], true};
  }
  DS41_RETURN_IF_ERROR(validate(as_steps));  // pages for a full verification of every item
  if (spec_prof_) {
    *spec_prof_ = SpecProfile{};
    spec_lap(nullptr);
  }
  // Groups within one forward's limits (every item may verify B + 1 rows).
  const GpuLimits& lim = fwd_->limits();
  const int64_t per_group =
      std::max<int64_t>(1, std::min({lim.max_step_seqs, lim.max_logit_rows / (B + 1), lim.max_step_tokens / (B + 1),
                                     std::max<int64_t>(1, lim.max_step_tokens / B)}));
  // 1. Every group's drafts (they read the state only), 2. the verify lengths of the whole call
  // under the budget (MODEL_SPEC 3.10.9), 3. each group's verification.
  std::vector<SpecDrafts> drafts;
  std::vector<std::vector<float>> conf(items.size());
  std::vector<int64_t> cap(items.size());
  for (size_t g = 0; g < items.size(); g += static_cast<size_t>(per_group)) {
    const size_t n = std::min(items.size() - g, static_cast<size_t>(per_group));
    drafts.emplace_back();
    DS41_RETURN_IF_ERROR(speculative_draft(items.subspan(g, n), &drafts.back()));
    spec_lap(&SpecProfile::draft_ms);
    for (size_t i = 0; i < n; ++i) {
      cap[g + i] = drafts.back().cap[i];
      if (drafts.back().draft_of[i] >= 0) conf[g + i] = drafts.back().d[drafts.back().draft_of[i]].confidence;
    }
  }
  const std::vector<int64_t> len = engine::budget_verify_lengths(conf, cap, batch.verify_budget);
  for (size_t g = 0, k = 0; g < items.size(); g += static_cast<size_t>(per_group), ++k) {
    const size_t n = std::min(items.size() - g, static_cast<size_t>(per_group));
    DS41_RETURN_IF_ERROR(speculative_verify(items.subspan(g, n), drafts[k], std::span(len).subspan(g, n),
                                            std::span(*out).subspan(g, n)));
    for (size_t i = g; i < g + n; ++i) (*out)[i].budget_cut = cap[i] - len[i];
  }
  return ok_status();
}

Status CudaEngine::speculative_draft(std::span<const engine::SpecStepItem> items, SpecDrafts* dr) {
  const int64_t B = model_->config().dspark_block_size;
  const size_t ni = items.size();
  std::vector<std::mt19937_64*> rng(ni, nullptr);
  for (size_t i = 0; i < ni; ++i)
    if (items[i].temperature > 0) rng[i] = &spec_rng_.try_emplace(items[i].seq, items[i].seed).first->second;
  // The drafts (3.10.4-3.10.6) of the items that verify candidates, in one batch.
  dr->cap.assign(ni, 0);
  dr->draft_of.assign(ni, -1);
  std::vector<GpuDraftInput> din;
  for (size_t i = 0; i < ni; ++i) {
    dr->cap[i] = items[i].verify_len < 0 ? B : items[i].verify_len;
    if (dr->cap[i] > 0) {
      dr->draft_of[i] = static_cast<int64_t>(din.size());
      din.push_back(GpuDraftInput{*find(items[i].seq), items[i].anchor});
    }
  }
  dr->draft_p.assign(din.size(), {});
  std::vector<size_t> item_of(din.size());
  for (size_t i = 0; i < ni; ++i)
    if (dr->draft_of[i] >= 0) item_of[dr->draft_of[i]] = i;
  if (!din.empty()) {
    GpuDraftOptions dopt;
    bool any_sampled = false;
    for (size_t i = 0; i < ni; ++i)
      any_sampled = any_sampled || (dr->draft_of[i] >= 0 && items[i].temperature > 0);
    if (any_sampled)
      dopt.choose = [&](int64_t b, int64_t, std::span<const float> z) -> int32_t {
        const size_t i = item_of[b];
        if (items[i].temperature <= 0) return model::argmax_lowest(z);
        dr->draft_p[b].push_back(engine::tempered_probs(z, items[i].temperature));
        return engine::draw_from(dr->draft_p[b].back(), *rng[i]);
      };
    DS41_RETURN_IF_ERROR(fwd_->draft(din, dopt, &dr->d).with_context("DSpark draft"));
  }
  // The items' own caps: the 3.10.9 single-sequence threshold.
  for (size_t i = 0; i < ni; ++i)
    if (dr->draft_of[i] >= 0 && items[i].confidence_threshold >= 0)
      dr->cap[i] = std::min(dr->cap[i], engine::verify_length(dr->d[dr->draft_of[i]].confidence,
                                                              items[i].confidence_threshold));
  return ok_status();
}

Status CudaEngine::speculative_verify(std::span<const engine::SpecStepItem> items, const SpecDrafts& dr,
                                      std::span<const int64_t> len, std::span<engine::SpecStepResult> out) {
  const int64_t V = info_.vocab_size;
  const size_t ni = items.size();
  std::vector<GpuSequence*> seq(ni);
  std::vector<std::mt19937_64*> rng(ni, nullptr);
  for (size_t i = 0; i < ni; ++i) {
    seq[i] = *find(items[i].seq);
    if (items[i].temperature > 0) rng[i] = &spec_rng_.try_emplace(items[i].seq, items[i].seed).first->second;
  }
  std::vector<int64_t> l(len.begin(), len.end());
  std::vector<std::vector<int32_t>> vt(ni);
  std::vector<GpuSeqInput> batch(ni);
  for (size_t i = 0; i < ni; ++i) {
    if (l[i] < 0 || l[i] > dr.cap[i]) return internal_error("DSpark: verify length outside the item's cap");
    vt[i].push_back(items[i].anchor);
    if (dr.draft_of[i] >= 0) {
      const auto& c = dr.d[dr.draft_of[i]].candidates;
      vt[i].insert(vt[i].end(), c.begin(), c.begin() + l[i]);
    }
    out[i].verified = l[i];
    if (dr.draft_of[i] >= 0) {
      out[i].candidates = dr.d[dr.draft_of[i]].candidates;
      out[i].confidence = dr.d[dr.draft_of[i]].confidence;
    }
    batch[i].seq = seq[i];
    batch[i].tokens = vt[i];
    batch[i].logits = model::LogitsRows::kAll;
  }
  // ONE journaled target forward over [x_L, c_0 .. c_{l-1}] of every item (3.10.7).
  GpuSpecJournal journal;
  GpuForwardOptions fo;
  fo.journal = &journal;
  // All greedy: the rows' argmax on the device (l + 1 tokens per item instead of (l + 1) x V logits).
  bool all_greedy = true;
  for (size_t i = 0; i < ni; ++i) all_greedy = all_greedy && items[i].temperature <= 0;
  std::vector<int32_t> amax;
  if (all_greedy) fo.argmax = &amax;
  std::vector<model::SequenceOutput> res;
  if (spec_prof_) {
    fo.layer_ms = &spec_prof_->verify_layer_ms;
    fo.layer_launches = &spec_prof_->verify_layer_launches;
    ++spec_prof_->groups;
    for (const auto& r : vt) spec_prof_->verify_rows += static_cast<int64_t>(r.size());
  }
  DS41_RETURN_IF_ERROR(fwd_->run(batch, fo, &res).with_context("DSpark verification"));
  spec_lap(&SpecProfile::verify_forward_ms);
  // Acceptance on the host (engine/speculative.h).
  std::vector<int64_t> keep(ni);
  std::vector<std::span<const int32_t>> toks(ni);
  std::vector<GpuContextRows> cr(ni);
  size_t row = 0;
  for (size_t i = 0; i < ni; ++i) {
    const std::span<const float> T(res[i].logits);
    const size_t rows = res[i].positions.size();
    if (static_cast<int64_t>(rows) != l[i] + 1 || (!all_greedy && static_cast<int64_t>(T.size()) != (l[i] + 1) * V) ||
        (all_greedy && amax.size() < row + rows))
      return internal_error("verification returned too few logits rows");
    std::span<const int32_t> cand(vt[i].data() + 1, static_cast<size_t>(l[i]));
    engine::Acceptance acc;
    if (all_greedy) {
      acc = engine::accept_greedy_argmax(cand, std::span<const int32_t>(amax).subspan(row, rows));
    } else if (items[i].temperature <= 0) {
      acc = engine::accept_greedy(cand, T, V);
    } else {
      std::vector<double> dp(l[i] * V), tp((l[i] + 1) * V);
      for (int64_t k = 0; k < l[i]; ++k) {
        const std::vector<double>& p =
            dr.draft_p[static_cast<size_t>(dr.draft_of[i])][static_cast<size_t>(k)];
        std::copy(p.begin(), p.end(), dp.begin() + k * V);
      }
      for (int64_t k = 0; k <= l[i]; ++k) {
        const std::vector<double> q = engine::tempered_probs(T.subspan(k * V, V), items[i].temperature);
        std::copy(q.begin(), q.end(), tp.begin() + k * V);
      }
      acc = engine::accept_sampled(cand, dp, tp, V, *rng[i]);
    }
    out[i].accepted = acc.accepted;
    out[i].tokens.assign(cand.begin(), cand.begin() + acc.accepted);
    out[i].tokens.push_back(acc.bonus);
    keep[i] = acc.accepted + 1;
    row += rows;
    toks[i] = vt[i];
    cr[i] = GpuContextRows{seq[i], journal.seqs[i].row_begin, journal.seqs[i].before.position, keep[i]};
  }
  // Roll back the rejected rows (3.10.8), then the context rows of L..L+a (3.10.3).
  spec_lap(&SpecProfile::accept_ms);
  DS41_RETURN_IF_ERROR(fwd_->rollback_spec(journal, keep, toks).with_context("DSpark rollback"));
  spec_lap(&SpecProfile::rollback_ms);
  DS41_RETURN_IF_ERROR(fwd_->dspark_commit(cr).with_context("DSpark context rows"));
  spec_lap(&SpecProfile::commit_ms);
  return ok_status();
}

void CudaEngine::spec_lap(double SpecProfile::*field) {
  if (!spec_prof_) return;
  cudaStreamSynchronize(stream_);  // a failed stream surfaces at the phase's own next check
  const auto now = std::chrono::steady_clock::now();
  if (field) spec_prof_->*field += std::chrono::duration<double, std::milli>(now - spec_t_).count();
  spec_t_ = now;
}

Result<model::DraftOutput> CudaEngine::draft(engine::SeqId seq, int32_t anchor, bool record) {
  if (!spec_) return failed_precondition("speculative decoding is off (CudaEngine::enable_speculative)");
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  GpuDraftInput in{s, anchor};
  GpuDraftOptions o;
  o.record = record;
  std::vector<model::DraftOutput> d;
  DS41_RETURN_IF_ERROR(fwd_->draft(std::span<const GpuDraftInput>(&in, 1), o, &d));
  return std::move(d[0]);
}

Status CudaEngine::draft_window_rows(engine::SeqId seq, int64_t stage, int64_t first, int64_t n,
                                     std::vector<uint8_t>* out) {
  DS41_ASSIGN_OR_RETURN(GpuSequence * s, find(seq));
  return fwd_->download_draft_rows(*s, stage, first, n, out);
}

}  // namespace ds41::gpu
