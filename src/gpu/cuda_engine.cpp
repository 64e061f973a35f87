// ds41 gpu: CudaEngine (cuda_engine.h).
#include "gpu/cuda_engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "backends/cuda/cuda_status.h"

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
  const model::KvLayout& layout = model->kv_layout();
  if (opt.entries_per_page <= 0) return invalid_argument("CUDA engine: entries_per_page must be > 0");
  int64_t page_bytes = 0;
  for (const model::KvSourceLayout& s : layout.sources) page_bytes = opt.entries_per_page * s.entry_bytes();
  const int64_t pages = page_bytes > 0 ? std::max<int64_t>(opt.kv_bytes / page_bytes, 1) : 0;
  DS41_ASSIGN_OR_RETURN(e->pool_, KvBlockPool::create(layout, pages, opt.entries_per_page));
  DS41_ASSIGN_OR_RETURN(e->slots_, SequenceSlots::create(layout, opt.max_sequences));
  DS41_ASSIGN_OR_RETURN(e->fwd_, GpuForward::create(*model, lim, &e->pool_, &e->slots_, e->stream_));
  e->bounded_bytes_ = e->slots_.slot_bytes() + static_cast<int64_t>(sizeof(engram::EngramHashState));
  return e;
}

CudaEngine::~CudaEngine() {
  seqs_.clear();
  fwd_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

Result<GpuSequence*> CudaEngine::find(engine::SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("sequence " + std::to_string(seq) + " does not exist");
  return it->second.get();
}

Result<engine::SeqId> CudaEngine::create_sequence() {
  DS41_ASSIGN_OR_RETURN(int32_t slot, slots_.allocate());
  auto s = std::make_unique<GpuSequence>();
  s->slot = slot;
  for (const model::KvSourceLayout& src : model_->kv_layout().sources) {
    GpuSourceMirror m;
    if (src.ratio > 1) m.pend_filled.assign(src.ratio, 0);
    s->sources.push_back(std::move(m));
  }
  if (model_->hasher()) s->engram = model_->hasher()->new_state();
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
  if (st.ok()) st = cuda::cuda_status(cudaStreamSynchronize(stream_), "fork sequence");
  if (!st.ok()) {
    for (int32_t p : taken) pool_.pages().release(p);
    slots_.release(slot);
    return st.with_context("fork of sequence " + std::to_string(src));
  }
  const engine::SeqId id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

Status CudaEngine::free_sequence(engine::SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return not_found("sequence " + std::to_string(seq) + " does not exist");
  release(*it->second);
  seqs_.erase(it);
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
                           std::vector<model::SequenceOutput>* out, std::vector<float>* layer_ms) {
  out->assign(items.size(), model::SequenceOutput{});
  if (items.empty()) return ok_status();
  DS41_RETURN_IF_ERROR(validate(items));
  const GpuLimits& lim = fwd_->limits();
  // Rounds: each takes the next chunk of every unfinished item, within the forward's limits.
  std::vector<size_t> done(items.size(), 0);
  GpuForwardOptions fo;
  fo.record = record;
  fo.layer_ms = layer_ms;
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
      logit_rows +=
          in.logits == model::LogitsRows::kAll ? take : (in.logits == model::LogitsRows::kLast ? 1 : 0);
      tokens += take;
      batch.push_back(in);
      which.push_back(i);
    }
    if (batch.empty()) break;
    std::vector<model::SequenceOutput> res;
    DS41_RETURN_IF_ERROR(fwd_->run(batch, fo, &res));
    for (size_t b = 0; b < batch.size(); ++b) {
      const size_t i = which[b];
      done[i] += batch[b].tokens.size();
      (*out)[i].append(std::move(res[b]));
    }
  }
  return ok_status();
}

Status CudaEngine::step(std::span<const engine::StepItem> items, engine::StepOutput* out) {
  const int64_t V = info_.vocab_size;
  out->vocab = V;
  out->logits.clear();
  out->row.assign(items.size(), -1);
  if (items.empty()) return ok_status();
  // Items without want_logits are run in the same forwards; their logits are not computed.
  std::vector<engine::StepItem> with(items.begin(), items.end());
  std::vector<model::SequenceOutput> res;
  bool any = false;
  for (const engine::StepItem& it : items) any = any || it.want_logits;
  DS41_RETURN_IF_ERROR(forward(with, any ? model::LogitsRows::kLast : model::LogitsRows::kNone, false, &res));
  int64_t rows = 0;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].want_logits) out->row[i] = rows++;
  out->logits.resize(rows * V);
  for (size_t i = 0; i < items.size(); ++i) {
    if (out->row[i] < 0) continue;
    if (static_cast<int64_t>(res[i].logits.size()) < V)
      return internal_error("GPU forward returned no last-row logits");
    std::memcpy(out->logits.data() + out->row[i] * V, res[i].logits.data() + res[i].logits.size() - V,
                V * sizeof(float));
  }
  return ok_status();
}

}  // namespace ds41::gpu
