// ds41 gpu: the speculative journal and rollback on the device (MODEL_SPEC 3.10.8) — the twin of
// src/model/spec_rollback.cpp for GpuForward's state. A verification forward over [x_L, c_0 ..
// c_{l-1}] writes, for each of its rows, a window ring row in every layer (slot p % W), pending-group
// rows of ratio > 1 sources (the trailing partial group), compressed / indexer entries (into pages,
// beyond the kept count once rolled back), the Engram look-back and the position. The journal keeps,
// BEFORE the call's kernels: the host mirror of each sequence, the ring rows of positions L..L+l of
// every layer (one strided copy per contiguous slot run), and the pending rows the call overwrites;
// DURING the call: the compressor rows (a, b) of every row of each ratio > 1 source. rollback_spec
// then gives the state of a plain decode of the kept rows, bit for bit:
//   - rings: rejected positions' slots get their saved rows back;
//   - entries: count, pending flags and pages replayed from the mirror before the call over the
//     kept positions (the step plan's rule); pages the call allocated beyond them are released;
//   - pending rows: slot i holds the (a, b) row of the latest kept position p with p % R == i and
//     p % R != R - 1 (a one-token decode writes exactly those), else its value before the call;
//   - Engram: the look-back before the call advanced by the kept tokens; the most recent publisher
//     as spec_rollback.cpp (7.21); the position.
// Draft rings need no rollback: context rows are committed only after acceptance (cuda_engine.cpp).
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "gpu/gpu_forward.h"

namespace ds41::gpu {

namespace {

// Contiguous runs of ring slots for positions [first, first + n): (first position, length).
std::vector<std::pair<int64_t, int64_t>> slot_runs(int64_t first, int64_t n, int64_t W) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t p = first;
  const int64_t end = first + n;
  while (p < end) {
    const int64_t len = std::min(end - p, W - p % W);
    runs.emplace_back(p, len);
    p += len;
  }
  return runs;
}

}  // namespace

Status GpuForward::journal_plan(const GpuForwardOptions& opt) {
  if (!ds_.on) return failed_precondition("a journaled forward needs DSpark enabled (enable_dspark)");
  GpuSpecJournal& j = *opt.journal;
  j.seqs.clear();
  if (static_cast<int64_t>(seqs_.size()) > lim_.max_step_seqs)
    return invalid_argument("journaled forward: too many sequences");
  for (const PlanSeq& q : seqs_) {
    if (q.end - q.begin > ds_.J)
      return invalid_argument("journaled forward: " + std::to_string(q.end - q.begin) +
                              " rows for one sequence, at most " + std::to_string(ds_.J));
    if (q.end - q.begin > c_->sliding_window)
      return invalid_argument("journaled forward: more rows than the window");
    GpuSpecJournal::Seq s;
    s.seq = q.seq;
    s.before = *q.seq;
    s.row_begin = q.begin;
    s.rows = q.end - q.begin;
    j.seqs.push_back(std::move(s));
  }
  std::vector<int64_t> rows;
  for (const auto& [qi, row] : jpend_) {
    j.seqs[qi].pend_saved.emplace_back(row, static_cast<int64_t>(rows.size()));
    rows.push_back(row);
  }
  if (static_cast<int64_t>(rows.size()) > ds_.jrows * 2 * std::max<int64_t>(ds_.n_pend, 1))
    return internal_error("journaled forward: more pending rows than the journal holds");
  jpend_rows_ = rows.empty() ? nullptr : put(rows);
  if (meta_overflow_) return resource_exhausted("journaled forward: metadata arena full");
  return ok_status();
}

Status GpuForward::journal_save() {
  const GpuSpecJournal& j = *journal_;
  const int64_t W = c_->sliding_window, rb = slots_->row_bytes(), nl = slots_->n_layers();
  const int64_t J = ds_.J;
  for (size_t i = 0; i < j.seqs.size(); ++i) {
    const GpuSpecJournal::Seq& s = j.seqs[i];
    uint8_t* save = ds_.ring_save + static_cast<int64_t>(i) * nl * J * rb;
    const int64_t L = s.before.position;
    for (const auto& [p, len] : slot_runs(L, s.rows, W))
      DS41_RETURN_IF_ERROR(cuda::cuda_status(
          cudaMemcpy2DAsync(save + (p - L) * rb, J * rb, slots_->ring_layer_base(0) + slots_->ring_row_offset(s.seq->slot, p),
                            slots_->ring_layer_stride(), len * rb, nl, cudaMemcpyDeviceToDevice, stream_),
          "journal the window rings"));
  }
  if (jpend_rows_)
    DS41_RETURN_IF_ERROR(cuda::run_gather_rows(slots_->pending_base(), jpend_rows_,
                                               static_cast<int64_t>(jpend_.size()), slots_->kv_dim(),
                                               ds_.pend_save, stream_));
  return ok_status();
}

Status GpuForward::rollback_spec(const GpuSpecJournal& j, std::span<const int64_t> keep,
                                 std::span<const std::span<const int32_t>> tokens) {
  if (keep.size() != j.seqs.size() || tokens.size() != j.seqs.size())
    return invalid_argument("rollback: one keep count and token list per journaled sequence");
  const model::KvLayout& layout = m_->kv_layout();
  const int64_t W = c_->sliding_window, rb = slots_->row_bytes(), nl = slots_->n_layers(), J = ds_.J;
  const int64_t hd = slots_->kv_dim(), E = pool_->geometry().entries_per_page;
  // Row copies for the pending groups: sources (device pointers) and destinations (pending rows).
  std::vector<const float*> src_ptrs;
  std::vector<int64_t> dst_rows;
  for (size_t i = 0; i < j.seqs.size(); ++i) {
    const GpuSpecJournal::Seq& js = j.seqs[i];
    const int64_t k = keep[i];
    if (k < 1 || k > js.rows)
      return invalid_argument("rollback: keep " + std::to_string(k) + " of " + std::to_string(js.rows) + " rows");
    if (static_cast<int64_t>(tokens[i].size()) != js.rows)
      return invalid_argument("rollback: the call's tokens do not match its rows");
    GpuSequence& s = *js.seq;
    const GpuSequence& before = js.before;
    const int64_t L = before.position, end_keep = L + k;
    // Window rings: the rejected positions' slots get their rows from before the call.
    const uint8_t* save = ds_.ring_save + static_cast<int64_t>(i) * nl * J * rb;
    if (k < js.rows)
      for (const auto& [p, len] : slot_runs(end_keep, js.rows - k, W))
        DS41_RETURN_IF_ERROR(cuda::cuda_status(
            cudaMemcpy2DAsync(slots_->ring_layer_base(0) + slots_->ring_row_offset(s.slot, p), slots_->ring_layer_stride(),
                              save + (p - L) * rb, J * rb, len * rb, nl, cudaMemcpyDeviceToDevice, stream_),
            "restore the window rings"));
    // Entries, pending flags and pages: the step plan's rule over the kept positions.
    int64_t last_pos = -1, last_layer = before.last_published_source;
    std::vector<GpuSourceMirror> next = before.sources;
    for (size_t jj = 0; jj < layout.sources.size(); ++jj) {
      const int64_t R = layout.sources[jj].ratio, layer = layout.sources[jj].layer;
      GpuSourceMirror& m = next[jj];
      for (int64_t p = L; p < end_keep; ++p) {
        const int64_t kk = p / R, sg = p % R;
        if (R > 1) {
          m.pend_filled[sg] = 1;
          if (sg != R - 1) continue;
          std::fill(m.pend_filled.begin(), m.pend_filled.end(), 0);
        }
        if (kk < m.count) continue;
        ++m.count;
        if (p > last_pos || (p == last_pos && layer > last_layer)) {
          last_pos = p;
          last_layer = layer;
        }
      }
      // Pages: the kept ones (those before the call, and any the kept entries need); the call's others go.
      const std::vector<int32_t>& after = s.sources[jj].pages;
      const size_t need = std::max(before.sources[jj].pages.size(), static_cast<size_t>((m.count + E - 1) / E));
      m.pages.assign(after.begin(), after.begin() + std::min(need, after.size()));
      for (size_t pg = m.pages.size(); pg < after.size(); ++pg) pool_->pages().release(after[pg]);
      // Pending rows (ratio > 1).
      const int64_t pj = slots_->pending_index(static_cast<int64_t>(jj));
      if (pj < 0) continue;
      for (int64_t slot_i = 0; slot_i < R - 1; ++slot_i) {
        int64_t latest = -1;
        for (int64_t p = L; p < end_keep; ++p)
          if (p % R == slot_i) latest = p;
        for (int64_t ab = 0; ab < 2; ++ab) {
          const int64_t dst = slots_->pending_row(s.slot, pj, ab, slot_i);
          if (latest >= 0) {
            const float* jbuf = ab == 0 ? ds_.jca : ds_.jcb;
            src_ptrs.push_back(jbuf + (pj * ds_.jrows + js.row_begin + (latest - L)) * hd);
            dst_rows.push_back(dst);
            continue;
          }
          for (const auto& [row, at] : js.pend_saved)
            if (row == dst) {
              src_ptrs.push_back(ds_.pend_save + at * hd);
              dst_rows.push_back(dst);
            }
        }
      }
    }
    // Engram look-back: before the call, advanced by the kept tokens.
    engram::EngramHashState eng = before.engram;
    if (m_->hasher())
      DS41_RETURN_IF_ERROR(m_->hasher()->append(eng, tokens[i].subspan(0, static_cast<size_t>(k)), {}, {}));
    s.sources = std::move(next);
    s.engram = eng;
    s.last_published_source = last_layer;
    s.position = end_keep;
  }
  if (!src_ptrs.empty()) {
    const int64_t m = static_cast<int64_t>(src_ptrs.size());
    if (m > ds_.jrows * 2 * std::max<int64_t>(ds_.n_pend, 1))
      return internal_error("rollback: more pending rows than the journal's scratch");
    meta_off_ = 0;
    meta_overflow_ = false;
    const float* const* d_src = put(src_ptrs);
    const int64_t* d_dst = put(dst_rows);
    if (meta_overflow_) return resource_exhausted("rollback: metadata arena full");
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(ws_.meta_dev, ws_.meta_host, meta_off_, cudaMemcpyHostToDevice, stream_), "upload rollback"));
    DS41_RETURN_IF_ERROR(cuda::run_gather_row_ptrs(d_src, m, hd, ds_.rscratch, stream_));
    DS41_RETURN_IF_ERROR(cuda::run_scatter_rows(ds_.rscratch, d_dst, m, hd, slots_->pending_base(), stream_));
  }
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "speculative rollback");
}

}  // namespace ds41::gpu
