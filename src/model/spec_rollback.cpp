// ds41 model: SpecJournal and rollback_spec (MODEL_SPEC 3.10.8).
#include "model/spec_rollback.h"

#include <cstring>

#include "core/check.h"

namespace ds41::model {

void SpecJournal::begin(const SequenceState& st, int64_t n_rows) {
  start_pos = st.position();
  rows = n_rows;
  last_published_before = st.last_published_source;
  const int64_t nl = st.layout().n_layers;
  ring_first.assign(nl, -1);
  ring_old.assign(nl, {});
  sources.clear();
  for (const KvSourceLayout& s : st.layout().sources) {
    Source js;
    js.layer = s.layer;
    js.count_before = st.source(s.layer)->count;
    sources.push_back(std::move(js));
  }
}

void SpecJournal::save_ring_row(int64_t layer, int64_t pos, const uint8_t* old_row, int64_t row_bytes) {
  if (ring_first[layer] < 0) ring_first[layer] = pos;
  DS41_CHECK_EQ(pos, ring_first[layer] + static_cast<int64_t>(ring_old[layer].size()) / row_bytes,
                "window rows must be journaled in position order");
  ring_old[layer].insert(ring_old[layer].end(), old_row, old_row + row_bytes);
}

void SpecJournal::note_source_row(int64_t layer, int64_t pos, const KvSourceState& src, bool emitted) {
  for (Source& s : sources) {
    if (s.layer != layer) continue;
    if (emitted) s.emit_pos.push_back(pos);
    if (src.layout.ratio > 1) {
      DS41_CHECK_EQ(pos - start_pos, static_cast<int64_t>(s.pend_a.size()), "source rows out of order");
      s.pend_a.push_back(src.pend_a);
      s.pend_b.push_back(src.pend_b);
      s.pend_filled.push_back(src.pend_filled);
    }
    return;
  }
  DS41_CHECK(false, "journal: unknown KV source layer");
}

Status rollback_spec(SequenceState& st, const SpecJournal& j, int64_t keep, std::span<const int32_t> tokens,
                     const engram::EngramHasher* hasher) {
  if (j.start_pos < 0) return failed_precondition("rollback: the journal is empty");
  if (keep < 1 || keep > j.rows)
    return invalid_argument("rollback: keep " + std::to_string(keep) + " outside [1, " +
                            std::to_string(j.rows) + "]");
  if (static_cast<int64_t>(tokens.size()) != j.rows)
    return invalid_argument("rollback: " + std::to_string(tokens.size()) + " tokens for a call of " +
                            std::to_string(j.rows) + " rows");
  if (st.position() != j.start_pos + j.rows)
    return failed_precondition("rollback: the state moved since the journaled call (position " +
                               std::to_string(st.position()) + ", expected " +
                               std::to_string(j.start_pos + j.rows) + ")");
  const int64_t end_keep = j.start_pos + keep;  // first rejected position
  // Window rings: put back the rows the rejected positions overwrote.
  const int64_t wrb = st.layout().window_row_bytes;
  for (int64_t l = 0; l < static_cast<int64_t>(j.ring_old.size()); ++l) {
    const int64_t n = static_cast<int64_t>(j.ring_old[l].size()) / wrb;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = j.ring_first[l] + i;
      if (pos < end_keep) continue;
      std::memcpy(st.window_row(l, pos), j.ring_old[l].data() + i * wrb, wrb);
    }
  }
  // Compressed and indexer rows: drop every entry emitted by a rejected row; the half-pair
  // buffer as it was after the last kept row. The most recent publisher (MODEL_SPEC 7.21).
  int64_t last_pos = -1, last_layer = j.last_published_before;
  for (const SpecJournal::Source& js : j.sources) {
    KvSourceState* src = st.source(js.layer);
    int64_t count = js.count_before;
    for (int64_t p : js.emit_pos) {
      if (p >= end_keep) continue;
      ++count;
      if (p > last_pos || (p == last_pos && js.layer > last_layer)) {
        last_pos = p;
        last_layer = js.layer;
      }
    }
    src->count = count;
    src->kv_rows.resize(count * src->layout.kv_row_bytes);
    src->key_rows.resize(count * src->layout.key_row_bytes);
    if (src->layout.ratio > 1) {
      DS41_CHECK_EQ(static_cast<int64_t>(js.pend_a.size()), j.rows, "journal without the half-pair buffers");
      src->pend_a = js.pend_a[keep - 1];
      src->pend_b = js.pend_b[keep - 1];
      src->pend_filled = js.pend_filled[keep - 1];
    }
  }
  st.last_published_source = last_layer;
  // Engram look-back: the state before the call, advanced by the kept tokens.
  if (hasher) {
    engram::EngramHashState hs = j.engram_before;
    DS41_RETURN_IF_ERROR(hasher->append(hs, tokens.subspan(0, keep), {}, {}));
    st.engram_state() = hs;
  }
  st.set_position(end_keep);
  return ok_status();
}

}  // namespace ds41::model
