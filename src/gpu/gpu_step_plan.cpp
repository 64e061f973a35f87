// ds41 gpu: the step plan of GpuForward (gpu_forward.h) — everything the reference computes in
// host loops between ops, derived on the host from positions alone and uploaded once: rows and
// positions, the window entry lists (MODEL_SPEC 3.4.7: positions max(0, p - W + 1) .. p, this
// call's rows or the ring), the compressor's emit schedule with the pending group across calls
// (3.4.4), pages for the new entries and the batch's page tables, index visibility (3.4.6), the
// Engram hash ids (3.2.4; the hasher runs on the host, image-span positions DEAD) and the image-span
// rows (3.11).
#include <algorithm>
#include <cstring>
#include <string>

#include "gpu/gpu_forward.h"

namespace ds41::gpu {

namespace {
// Calls of up to this many rows are checked for ring slots both read and written (ring_disjoint_);
// run_window_kv_step takes fewer than 256 rows in one launch.
constexpr int64_t kRingFusedRows = 255;
}  // namespace

template <class T>
const T* GpuForward::put(const std::vector<T>& v) {
  // Every list takes whole 256-byte granules, an empty one too: lists whose length changes a
  // little from one decode step to the next (this step's compressed groups, page tables) keep the
  // addresses of the lists after them, so consecutive steps make the same launches
  // (gpu/step_graphs.h replays them).
  meta_off_ = (meta_off_ + 255) / 256 * 256;
  const size_t bytes = v.size() * sizeof(T);
  const size_t reserved = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  if (meta_off_ + reserved > ws_.meta_bytes) {
    meta_overflow_ = true;
    return nullptr;
  }
  if (bytes > 0) std::memcpy(ws_.meta_host + meta_off_, v.data(), bytes);
  const T* d = reinterpret_cast<const T*>(ws_.meta_dev + meta_off_);
  meta_off_ += reserved;
  return d;
}

Status GpuForward::validate(std::span<const GpuSeqInput> batch, const GpuForwardOptions& opt) const {
  const int64_t V = c_->vocab_size;
  if (opt.last_layer >= 0) {  // a partial forward (gpu_forward.h, MODEL_SPEC 4.4)
    if (opt.last_layer >= c_->num_hidden_layers)
      return invalid_argument("GPU forward: last_layer " + std::to_string(opt.last_layer) + " of a " +
                              std::to_string(c_->num_hidden_layers) + "-layer model");
    for (const model::KvSourceLayout& sl : m_->kv_layout().sources)
      if (sl.layer > opt.last_layer)
        return invalid_argument("GPU forward: last_layer " + std::to_string(opt.last_layer) +
                                " would skip the KV source at layer " + std::to_string(sl.layer));
    for (size_t i = 0; i < batch.size(); ++i)
      if (batch[i].logits != model::LogitsRows::kNone)
        return invalid_argument("GPU forward: sequence " + std::to_string(i) +
                                " asks for logits from a forward that stops at layer " +
                                std::to_string(opt.last_layer));
  }
  if (static_cast<int64_t>(batch.size()) > lim_.max_step_seqs)
    return invalid_argument("GPU forward: " + std::to_string(batch.size()) +
                            " sequences in one step, the engine takes " + std::to_string(lim_.max_step_seqs) +
                            " (max_step_seqs)");
  int64_t n = 0, logit_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const GpuSeqInput& in = batch[i];
    const std::string who = "sequence " + std::to_string(i);
    if (!in.seq) return invalid_argument(who + ": no state");
    if (in.tokens.empty()) return invalid_argument(who + ": no tokens");
    for (size_t t = 0; t < in.tokens.size(); ++t)
      if (in.tokens[t] < 0 || in.tokens[t] >= V)
        return invalid_argument(who + ": token " + std::to_string(t) + " has id " +
                                std::to_string(in.tokens[t]) + ", outside the vocabulary [0, " +
                                std::to_string(V) + ")");
    for (size_t j = 0; j < i; ++j)
      if (batch[j].seq == in.seq) return invalid_argument(who + ": state used twice in one batch");
    if (!in.image_span.empty() && in.image_span.size() != in.tokens.size())
      return invalid_argument(who + ": image_span has " + std::to_string(in.image_span.size()) +
                              " flags for " + std::to_string(in.tokens.size()) + " tokens");
    if (!in.span_embeds.empty()) {
      int64_t flagged = 0;
      for (uint8_t f : in.image_span) flagged += f != 0;
      if (static_cast<int64_t>(in.span_embeds.size()) != flagged * c_->hidden_size)
        return invalid_argument(who + ": span_embeds has " + std::to_string(in.span_embeds.size()) +
                                " values for " + std::to_string(flagged) + " image-span positions of width " +
                                std::to_string(c_->hidden_size));
    }
    const int64_t end_pos = in.seq->position + static_cast<int64_t>(in.tokens.size());
    if (end_pos > c_->max_position_embeddings)
      return out_of_range(who + ": position " + std::to_string(end_pos) +
                          " exceeds max_position_embeddings " + std::to_string(c_->max_position_embeddings));
    if (end_pos > lim_.max_context)
      return out_of_range(who + ": position " + std::to_string(end_pos) +
                          " exceeds the GPU engine's context of " + std::to_string(lim_.max_context) +
                          " tokens (max_context)");
    n += static_cast<int64_t>(in.tokens.size());
    if (in.logits == model::LogitsRows::kAll) logit_rows += static_cast<int64_t>(in.tokens.size());
    if (in.logits == model::LogitsRows::kLast) logit_rows += 1;
  }
  if (n > lim_.max_step_tokens)
    return invalid_argument("GPU forward: " + std::to_string(n) + " tokens in one step, the engine takes " +
                            std::to_string(lim_.max_step_tokens) + " (max_step_tokens; prefill in chunks)");
  if (logit_rows > lim_.max_logit_rows)
    return invalid_argument("GPU forward: " + std::to_string(logit_rows) +
                            " logits rows asked, the engine returns " + std::to_string(lim_.max_logit_rows) +
                            " per step (max_logit_rows)");
  return ok_status();
}

void GpuForward::rollback_pages() {
  for (int32_t p : new_pages_) pool_->pages().release(p);
  new_pages_.clear();
}

Status GpuForward::plan(std::span<const GpuSeqInput> batch) {
  const model::KvLayout& layout = m_->kv_layout();
  const model::LayerSchedule& sched = m_->schedule();
  const int64_t hd = c_->head_dim, W = c_->sliding_window;
  n_ = 0;
  seqs_.clear();
  meta_off_ = 0;
  meta_overflow_ = false;
  new_pages_.clear();
  carry_ = Carry{};
  // Rows.
  for (const GpuSeqInput& in : batch) {
    PlanSeq ps;
    ps.seq = in.seq;
    ps.begin = n_;
    ps.start_pos = in.seq->position;
    n_ += static_cast<int64_t>(in.tokens.size());
    ps.end = n_;
    ps.logits = in.logits;
    ps.next_sources = in.seq->sources;
    ps.next_engram = in.seq->engram;
    seqs_.push_back(std::move(ps));
  }
  const int64_t n = n_;
  std::vector<int32_t> ids(n), row_seq(n);
  pos_host_.resize(n);
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const PlanSeq& ps = seqs_[s];
    for (int64_t r = ps.begin; r < ps.end; ++r) {
      pos_host_[r] = ps.start_pos + (r - ps.begin);
      ids[r] = batch[s].tokens[r - ps.begin];
      row_seq[r] = static_cast<int32_t>(s);
    }
  }
  ids_ = put(ids);
  pos_ = put(pos_host_);
  row_seq_ = put(row_seq);
  // Image spans (MODEL_SPEC 3.11): per-row flags, and the rows whose embedding the span rows replace.
  {
    std::vector<uint8_t> vl(n, 0);
    std::vector<int64_t> dst;
    bool any = false;
    span_src_.clear();
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const GpuSeqInput& in = batch[s];
      if (in.image_span.empty()) continue;
      for (int64_t r = seqs_[s].begin; r < seqs_[s].end; ++r)
        if (in.image_span[r - seqs_[s].begin]) {
          vl[r] = 1;
          any = true;
          if (!in.span_embeds.empty()) dst.push_back(r);
        }
      if (!in.span_embeds.empty()) span_src_.push_back(in.span_embeds);
    }
    vl_ = any ? put(vl) : nullptr;
    span_rows_ = static_cast<int64_t>(dst.size());
    span_dst_ = span_rows_ > 0 ? put(dst) : nullptr;
  }
  // Engram hash ids (MODEL_SPEC 3.2.4), the only host computation that can fail on input.
  const engram::EngramHasher* hasher = m_->hasher();
  const int64_t nel = static_cast<int64_t>(c_->engram_layer_ids.size());
  engram_ids_.assign(nel, nullptr);
  if (hasher && nel > 0) {
    const int64_t per_tok = hasher->ids_per_token(), cols = hasher->n_cols();
    hash_ids_.assign(n * per_tok, 0);
    for (size_t s = 0; s < seqs_.size(); ++s) {
      PlanSeq& ps = seqs_[s];
      Status st = hasher->append(
          ps.next_engram, batch[s].tokens, batch[s].image_span,
          std::span<int32_t>(hash_ids_.data() + ps.begin * per_tok, (ps.end - ps.begin) * per_tok));
      if (!st.ok()) return st.with_context("sequence " + std::to_string(s) + ": engram hashing");
    }
    for (int64_t li = 0; li < nel; ++li) {
      const int64_t l = c_->engram_layer_ids[li];
      const auto& eng = m_->weights().layers[l].engram;
      if (!eng) return internal_error("engram layer " + std::to_string(l) + " without device weights");
      std::vector<int64_t> v(n * cols);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t id = hash_ids_[(r * nel + li) * cols + j];
          if (id < 0 || id >= eng->rows)
            return internal_error("engram row id " + std::to_string(id) + " outside the table of " +
                                  std::to_string(eng->rows) + " rows (layer " + std::to_string(l) + ")");
          v[r * cols + j] = id;
        }
      engram_ids_[li] = put(v);
    }
  }
  // Window entry lists (MODEL_SPEC 3.4.7) and ring traffic. A window floor (MODEL_SPEC 4.4 / 4.5,
  // GpuSequence::window_floor) drops ring positions below it; it cuts something only while it is
  // above the first row's window start, so normally every layer shares one list (one per distinct
  // set of effective floors otherwise). Ring reads start at the lowest floor over the layers.
  const int64_t nl = c_->num_hidden_layers;
  auto eff_floor = [&](const PlanSeq& ps, int64_t l) -> int64_t {
    const std::vector<int64_t>& f = ps.seq->window_floor;
    if (f.empty()) return 0;
    return f[l] > std::max<int64_t>(ps.start_pos - W + 1, 0) ? f[l] : 0;
  };
  std::vector<std::vector<int64_t>> floor_sets;
  win_list_of_layer_.assign(nl, 0);
  bool any_floor = false;
  for (const PlanSeq& ps : seqs_)
    for (int64_t l = 0; l < nl && !any_floor; ++l) any_floor = eff_floor(ps, l) != 0;
  for (int64_t l = 0; l < nl && any_floor; ++l) {
    std::vector<int64_t> key(seqs_.size());
    for (size_t s = 0; s < seqs_.size(); ++s) key[s] = eff_floor(seqs_[s], l);
    auto it = std::find(floor_sets.begin(), floor_sets.end(), key);
    win_list_of_layer_[l] = static_cast<int32_t>(it - floor_sets.begin());
    if (it == floor_sets.end()) floor_sets.push_back(std::move(key));
  }
  if (floor_sets.empty()) floor_sets.emplace_back(seqs_.size(), 0);
  std::vector<int64_t> ring_lo(seqs_.size()), ring_begin(seqs_.size());
  std::vector<int64_t> ring_read, ring_write(n, -1);
  ring_rows_ = 0;
  for (size_t s = 0; s < seqs_.size(); ++s) {
    const PlanSeq& ps = seqs_[s];
    const int32_t slot = ps.seq->slot;
    const int64_t P = ps.start_pos, end_pos = P + (ps.end - ps.begin);
    int64_t lowest = floor_sets[0][s];
    for (const auto& fs : floor_sets) lowest = std::min(lowest, fs[s]);
    const int64_t lo = std::max<int64_t>({P - W + 1, 0, lowest});
    ring_lo[s] = lo;
    ring_begin[s] = ring_rows_;
    for (int64_t t = lo; t < P; ++t) ring_read.push_back(slots_->ring_row_offset(slot, t));
    ring_rows_ += std::max<int64_t>(0, P - lo);
    for (int64_t r = ps.begin; r < ps.end; ++r)
      if (pos_host_[r] >= end_pos - W) ring_write[r] = slots_->ring_row_offset(slot, pos_host_[r]);
  }
  win_offsets_list_.clear();
  win_index_list_.clear();
  for (const auto& fs : floor_sets) {
    std::vector<int64_t> win_off(n + 1, 0);
    std::vector<int32_t> win_index;
    win_index.reserve(n * W);
    for (size_t s = 0; s < seqs_.size(); ++s) {
      const PlanSeq& ps = seqs_[s];
      const int64_t P = ps.start_pos;
      for (int64_t r = ps.begin; r < ps.end; ++r) {
        const int64_t pr = pos_host_[r];
        for (int64_t t = std::max<int64_t>({pr - W + 1, 0, fs[s]}); t <= pr; ++t)
          win_index.push_back(
              static_cast<int32_t>(t >= P ? ps.begin + t - P : n + ring_begin[s] + (t - ring_lo[s])));
        win_off[r + 1] = static_cast<int64_t>(win_index.size());
      }
    }
    win_offsets_list_.push_back(put(win_off));
    win_index_list_.push_back(put(win_index));
  }
  win_offsets_ = win_offsets_list_[0];
  win_index_ = win_index_list_[0];
  // Decode-shaped calls: whether a written slot is among those read (then the ring's decode must finish
  // before the rows are packed: two launches). Prefill chunks keep the two launches.
  ring_disjoint_ = false;
  if (n <= kRingFusedRows) {
    std::vector<int64_t> read_sorted = ring_read;
    std::sort(read_sorted.begin(), read_sorted.end());
    ring_disjoint_ = std::none_of(ring_write.begin(), ring_write.end(), [&](int64_t o) {
      return o >= 0 && std::binary_search(read_sorted.begin(), read_sorted.end(), o);
    });
  }
  ring_read_ = put(ring_read);
  ring_write_ = put(ring_write);
  // Compressor emit schedule and page tables per KV source (MODEL_SPEC 3.4.4).
  const int64_t E = pool_->geometry().entries_per_page;
  // A decode step (one row per sequence) pads its key and score counts to buckets: the padded keys
  // decode as zeros and score -inf, which no top-k, candidate pool or restriction selects, so the
  // selections are those of the exact counts while consecutive steps launch the same grids
  // (gpu/step_graphs.h).
  bool decode_shape = true;
  for (const PlanSeq& q : seqs_) decode_shape = decode_shape && q.end - q.begin == 1;
  auto bucket = [&](int64_t v, int64_t cap) {
    if (!decode_shape || v <= 0) return v;
    int64_t g = kDecodeBucket;  // 128, or the power of two in (v / 128, v / 64]: under 1.6 % padding
    while (g * 64 <= v) g *= 2;
    return std::min(cap, (v + g - 1) / g * g);
  };
  sources_.assign(layout.sources.size(), PlanSource{});
  source_of_layer_.assign(c_->num_hidden_layers, -1);
  for (size_t j = 0; j < layout.sources.size(); ++j) {
    const model::KvSourceLayout& sl = layout.sources[j];
    PlanSource& ps = sources_[j];
    source_of_layer_[sl.layer] = static_cast<int64_t>(j);
    ps.layer = sl.layer;
    ps.ratio = sl.ratio;
    ps.pend_j = slots_->pending_index(static_cast<int64_t>(j));
    const int64_t R = sl.ratio;
    std::vector<const float*> ga, gb;
    std::vector<int64_t> kpos, kv_enc, key_enc, pend_a(n, -1), pend_b(n, -1), page_begin, key_begin;
    std::vector<int32_t> pages;
    bool any_pending = false;
    for (PlanSeq& q : seqs_) {
      GpuSourceMirror& m = q.next_sources[j];
      const int32_t slot = q.seq->slot;
      const int64_t P = q.start_pos, end_pos = P + (q.end - q.begin);
      int64_t next = m.count;
      for (int64_t r = q.begin; r < q.end; ++r) {
        const int64_t pr = pos_host_[r], k = pr / R, slot_in_group = pr % R;
        if (R == 1) {
          if (k < next) continue;
          ga.push_back(ws_.ca + r * hd);
        } else {
          m.pend_filled[slot_in_group] = 1;
          if (slot_in_group != R - 1) continue;
          const bool full =
              std::all_of(m.pend_filled.begin(), m.pend_filled.end(), [](uint8_t f) { return f != 0; });
          std::fill(m.pend_filled.begin(), m.pend_filled.end(), 0);
          if (k < next) continue;
          if (!full) return internal_error("compressor group completed without all of its rows");
          for (int64_t i = 0; i < R; ++i) {
            const int64_t qp = k * R + i;
            if (qp >= P) {
              ga.push_back(ws_.ca + (q.begin + qp - P) * hd);
              gb.push_back(ws_.cb + (q.begin + qp - P) * hd);
            } else {
              ga.push_back(slots_->pending_base() + slots_->pending_row(slot, ps.pend_j, 0, i) * hd);
              gb.push_back(slots_->pending_base() + slots_->pending_row(slot, ps.pend_j, 1, i) * hd);
            }
          }
        }
        if (k != next) return internal_error("compressed entries must be emitted in order");
        while (static_cast<int64_t>(m.pages.size()) * E < k + 1) {
          auto page = pool_->pages().allocate();
          if (!page.ok()) return page.status();
          new_pages_.push_back(*page);
          m.pages.push_back(*page);
        }
        kpos.push_back(k * R);
        kv_enc.push_back(pool_->kv_row_offset(m.pages, k));
        key_enc.push_back(pool_->key_row_offset(m.pages, k));
        ++next;
      }
      m.count = next;
      if (R > 1)
        for (int64_t r = q.begin; r < q.end; ++r)
          if (pos_host_[r] >= end_pos / R * R) {
            pend_a[r] = slots_->pending_row(slot, ps.pend_j, 0, pos_host_[r] % R);
            pend_b[r] = slots_->pending_row(slot, ps.pend_j, 1, pos_host_[r] % R);
            any_pending = true;
            if (journal_) {  // MODEL_SPEC 3.10.8: rows a speculative rollback may put back
              const int64_t qi = &q - seqs_.data();
              jpend_.emplace_back(qi, pend_a[r]);
              jpend_.emplace_back(qi, pend_b[r]);
            }
          }
      page_begin.push_back(static_cast<int64_t>(pages.size()));
      pages.insert(pages.end(), m.pages.begin(), m.pages.end());
      key_begin.push_back(ps.total_keys);
      ps.total_keys += m.count;
      ps.max_keys = std::max(ps.max_keys, m.count);
    }
    key_begin.push_back(ps.total_keys);
    ps.groups = static_cast<int64_t>(kpos.size());
    ps.ga_ptrs = put(ga);
    ps.gb_ptrs = R > 1 ? put(gb) : nullptr;
    ps.kpos = put(kpos);
    ps.kv_enc = put(kv_enc);
    ps.key_enc = put(key_enc);
    ps.pend_a = any_pending ? put(pend_a) : nullptr;
    ps.pend_b = any_pending ? put(pend_b) : nullptr;
    ps.pages = put(pages);
    ps.seq_page_begin = put(page_begin);
    ps.key_row_begin = put(key_begin);
    if (ps.total_keys > lim_.max_step_key_rows)
      return resource_exhausted("GPU forward: the step needs " + std::to_string(ps.total_keys) +
                                " decoded index keys of layer " + std::to_string(sl.layer) +
                                ", the workspace holds " + std::to_string(lim_.max_step_key_rows) +
                                " (max_step_key_rows)");
    if (ps.max_keys > ws_.ts_max)
      return internal_error("GPU forward: a sequence holds more compressed entries than max_context allows");
    ps.decode_keys = bucket(ps.total_keys, lim_.max_step_key_rows);
  }
  // Index visibility per index source (MODEL_SPEC 3.4.6): keys of the KV owner after this step.
  index_.assign(c_->num_hidden_layers, PlanIndex{});
  for (const model::LayerPlan& p : sched.layers) {
    if (!p.index_source) continue;
    const int64_t j = source_of_layer_[p.kv_owner];
    if (j < 0) return internal_error("index source " + std::to_string(p.layer) + " without a KV owner");
    PlanIndex& pi = index_[p.layer];
    std::vector<int64_t> kb(n), vis(n), tm;
    if (p.candidate_source) tm.resize(n);
    for (const PlanSeq& q : seqs_) {
      const int64_t si = &q - seqs_.data();
      const int64_t T = q.next_sources[j].count;
      int64_t begin = 0;
      for (int64_t s2 = 0; s2 < si; ++s2) begin += seqs_[s2].next_sources[j].count;
      pi.ts = std::max(pi.ts, T);
      for (int64_t r = q.begin; r < q.end; ++r) {
        kb[r] = begin;
        vis[r] = std::min(T, (pos_host_[r] + 1) / p.ratio);
        if (p.candidate_source) tm[r] = T;
      }
    }
    pi.ts = bucket(pi.ts, ws_.ts_max);
    pi.key_begin = put(kb);
    pi.visible = put(vis);
    if (p.candidate_source) pi.t_mask = put(tm);
  }
  // Logits rows.
  logit_rows_host_.clear();
  for (const PlanSeq& q : seqs_) {
    if (q.logits == model::LogitsRows::kAll)
      for (int64_t r = q.begin; r < q.end; ++r) logit_rows_host_.push_back(r);
    else if (q.logits == model::LogitsRows::kLast)
      logit_rows_host_.push_back(q.end - 1);
  }
  logit_rows_ = put(logit_rows_host_);
  if (meta_overflow_)
    return resource_exhausted("GPU forward: the step's metadata exceeds its " +
                              std::to_string(ws_.meta_bytes) + "-byte arena (a smaller batch or chunk)");
  return ok_status();
}

// The element types other files of the executor put (gpu_dspark.cpp, gpu_spec_rollback.cpp).
template const int64_t* GpuForward::put<int64_t>(const std::vector<int64_t>&);
template const int32_t* GpuForward::put<int32_t>(const std::vector<int32_t>&);
template const float* const* GpuForward::put<const float*>(const std::vector<const float*>&);

}  // namespace ds41::gpu
