// ds41 engine: state payload encoding (state_codec.h). Little-endian throughout (the hosts we
// build for are little-endian; memcpy of the integers is the layout).
#include "engine/state_codec.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "core/check.h"
#include "engine/engine.h"
#include "engram/engram_config.h"

namespace ds41::engine {

namespace {

constexpr uint32_t kSnapshotVersion = 1;
constexpr int kEngramSlots = engram::EngramConfig::kMaxNgram;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void put(T v) {
    const size_t o = out_->size();
    out_->resize(o + sizeof(T));
    std::memcpy(out_->data() + o, &v, sizeof(T));
  }
  void bytes(const void* p, size_t n) {
    const size_t o = out_->size();
    out_->resize(o + n);
    if (n) std::memcpy(out_->data() + o, p, n);
  }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool get(T* v) {
    if (pos_ + sizeof(T) > in_.size()) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  const uint8_t* take(size_t n) {
    if (pos_ + n > in_.size()) return nullptr;
    const uint8_t* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

Status truncated(const std::string& what) {
  return data_loss("SWA snapshot payload is truncated at " + what);
}

}  // namespace

Status check_block_tokens(const model::KvLayout& layout, int64_t block_tokens) {
  if (block_tokens <= 0)
    return invalid_argument("block size must be > 0 tokens, got " + std::to_string(block_tokens));
  for (const model::KvSourceLayout& s : layout.sources)
    if (block_tokens % s.ratio != 0)
      return invalid_argument("block size " + std::to_string(block_tokens) +
                              " is not a multiple of KV source " + std::to_string(s.layer) +
                              "'s compression ratio " + std::to_string(s.ratio));
  return ok_status();
}

int64_t kv_block_payload_bytes(const model::KvLayout& layout, int64_t block_tokens) {
  int64_t b = 0;
  for (const model::KvSourceLayout& s : layout.sources) b += (block_tokens / s.ratio) * s.entry_bytes();
  return b;
}

StateView view_of(const model::SequenceState& st0) {
  // The accessors the forward pass uses are non-const; nothing through the view writes.
  model::SequenceState& st = const_cast<model::SequenceState&>(st0);
  const model::KvLayout& L = st.layout();
  StateView v;
  v.layout = &st.layout();
  v.position = st.position();
  v.last_published_source = st.last_published_source;
  v.engram = st.engram_state();
  v.window_floors.resize(L.n_layers);
  v.rings.resize(L.n_layers);
  for (int64_t l = 0; l < L.n_layers; ++l) {
    v.window_floors[l] = st.window_floor(l);
    v.rings[l] = L.window > 0 ? st.window_row(l, 0) : nullptr;
  }
  for (const model::KvSourceLayout& sl : L.sources) {
    const model::KvSourceState& s = *st.source(sl.layer);
    SourceStateView sv;
    sv.count = s.count;
    sv.first = 0;
    sv.rows = s.count;
    sv.kv = s.kv_rows.data();
    sv.key = s.key_rows.data();
    if (sl.ratio > 1) {
      sv.pend_filled = s.pend_filled.data();
      sv.pend_a = s.pend_a.data();
      sv.pend_b = s.pend_b.data();
    }
    v.sources.push_back(sv);
  }
  return v;
}

namespace {

// Rows [first, first + n) of a source view (checked: an engine must have copied them).
const uint8_t* kv_rows(const SourceStateView& s, const model::KvSourceLayout& sl, int64_t first, int64_t n) {
  DS41_CHECK(first >= s.first && first + n <= s.first + s.rows, "state view lacks the KV rows asked for");
  return s.kv + (first - s.first) * sl.kv_row_bytes;
}
const uint8_t* key_rows(const SourceStateView& s, const model::KvSourceLayout& sl, int64_t first, int64_t n) {
  DS41_CHECK(first >= s.first && first + n <= s.first + s.rows, "state view lacks the key rows asked for");
  return s.key + (first - s.first) * sl.key_row_bytes;
}

}  // namespace

// Global-KV block: for each KV source in layer order, its B / ratio compressed rows (Q_kv packed,
// MODEL_SPEC 5.2) then its B / ratio indexer key rows (Q_idx packed).
Result<std::vector<uint8_t>> encode_kv_block(const StateView& v, int64_t index, int64_t B) {
  const model::KvLayout& L = *v.layout;
  DS41_RETURN_IF_ERROR(check_block_tokens(L, B));
  if (index < 0 || (index + 1) * B > v.position)
    return out_of_range("global-KV block " + std::to_string(index) + " (tokens up to " +
                        std::to_string((index + 1) * B) + ") is past the sequence's position " +
                        std::to_string(v.position));
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(kv_block_payload_bytes(L, B)));
  Writer w(&out);
  for (size_t j = 0; j < L.sources.size(); ++j) {
    const model::KvSourceLayout& sl = L.sources[j];
    const SourceStateView& s = v.sources[j];
    const int64_t n = B / sl.ratio, first = index * n;
    DS41_CHECK(first + n <= s.count, "KV source has fewer entries than its position implies");
    w.bytes(kv_rows(s, sl, first, n), static_cast<size_t>(n * sl.kv_row_bytes));
    w.bytes(key_rows(s, sl, first, n), static_cast<size_t>(n * sl.key_row_bytes));
  }
  return out;
}

Result<std::vector<uint8_t>> encode_kv_block(const model::SequenceState& st, int64_t index, int64_t B) {
  return encode_kv_block(view_of(st), index, B);
}

Result<std::vector<uint8_t>> encode_swa_snapshot(const StateView& v, int64_t B, uint32_t flags) {
  const model::KvLayout& L = *v.layout;
  DS41_RETURN_IF_ERROR(check_block_tokens(L, B));
  const int64_t pos = v.position, full = pos / B;
  std::vector<uint8_t> out;
  Writer w(&out);
  w.put<uint32_t>(kSnapshotVersion);
  w.put<uint32_t>(flags);
  w.put<uint64_t>(static_cast<uint64_t>(pos));
  w.put<uint32_t>(static_cast<uint32_t>(B));
  w.put<uint32_t>(static_cast<uint32_t>(L.n_layers));
  w.put<uint32_t>(static_cast<uint32_t>(L.window));
  w.put<uint32_t>(static_cast<uint32_t>(L.window_row_bytes));
  w.put<uint32_t>(static_cast<uint32_t>(L.sources.size()));
  w.put<uint32_t>(static_cast<uint32_t>(kEngramSlots));
  w.put<int64_t>(v.last_published_source);
  w.put<int64_t>(v.engram.length);
  for (int i = 0; i < kEngramSlots; ++i) w.put<int32_t>(v.engram.recent[i]);
  for (int64_t l = 0; l < L.n_layers; ++l) w.put<int64_t>(v.window_floors[l]);
  for (size_t j = 0; j < L.sources.size(); ++j) {
    const model::KvSourceLayout& sl = L.sources[j];
    w.put<uint32_t>(static_cast<uint32_t>(sl.layer));
    w.put<uint32_t>(static_cast<uint32_t>(sl.ratio));
    w.put<uint32_t>(static_cast<uint32_t>(sl.kv_dim));
    w.put<uint32_t>(static_cast<uint32_t>(sl.kv_row_bytes));
    w.put<uint32_t>(static_cast<uint32_t>(sl.key_row_bytes));
    w.put<uint32_t>(static_cast<uint32_t>(v.sources[j].count - full * (B / sl.ratio)));
  }
  // Window rings in position order (engine-neutral; a ring's slot is position % window).
  const int64_t r0 = std::max<int64_t>(0, pos - L.window);
  for (int64_t l = 0; l < L.n_layers; ++l)
    for (int64_t p = r0; p < pos; ++p)
      w.bytes(v.rings[l] + (p % L.window) * L.window_row_bytes, static_cast<size_t>(L.window_row_bytes));
  for (size_t j = 0; j < L.sources.size(); ++j) {
    const model::KvSourceLayout& sl = L.sources[j];
    const SourceStateView& s = v.sources[j];
    const int64_t first = full * (B / sl.ratio), tail = s.count - first;
    if (tail > 0) {
      w.bytes(kv_rows(s, sl, first, tail), static_cast<size_t>(tail * sl.kv_row_bytes));
      w.bytes(key_rows(s, sl, first, tail), static_cast<size_t>(tail * sl.key_row_bytes));
    }
    if (sl.ratio > 1) {
      const size_t g = static_cast<size_t>(sl.ratio * sl.kv_dim);
      w.bytes(s.pend_filled, static_cast<size_t>(sl.ratio));
      w.bytes(s.pend_a, g * sizeof(float));
      w.bytes(s.pend_b, g * sizeof(float));
    }
  }
  return out;
}

Result<std::vector<uint8_t>> encode_swa_snapshot(const model::SequenceState& st, int64_t B, uint32_t flags) {
  return encode_swa_snapshot(view_of(st), B, flags);
}

Result<SwaSnapshotInfo> peek_swa_snapshot(std::span<const uint8_t> payload) {
  Reader r(payload);
  uint32_t version = 0, flags = 0, bt = 0;
  uint64_t pos = 0;
  if (!r.get(&version) || !r.get(&flags) || !r.get(&pos) || !r.get(&bt)) return truncated("its header");
  if (version != kSnapshotVersion)
    return unimplemented("SWA snapshot payload version " + std::to_string(version) + " (this build reads " +
                         std::to_string(kSnapshotVersion) + ")");
  return SwaSnapshotInfo{flags, static_cast<int64_t>(pos), static_cast<int64_t>(bt)};
}

Result<ParsedState> parse_state(const model::KvLayout& L, int64_t position,
                                std::span<const std::span<const uint8_t>> blocks,
                                std::span<const uint8_t> snapshot, int64_t B) {
  DS41_RETURN_IF_ERROR(check_block_tokens(L, B));
  if (position != 0)
    return failed_precondition("state import needs a fresh sequence (it is at position " +
                               std::to_string(position) + ")");
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int64_t want = kv_block_payload_bytes(L, B);
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(blocks[i].size()) != want)
      return data_loss("global-KV block " + std::to_string(i) + " has " + std::to_string(blocks[i].size()) +
                       " payload bytes; this model's layout needs " + std::to_string(want));

  ParsedState ps;
  ps.block_tokens = B;
  ps.blocks = blocks;
  ps.position = n * B;
  ps.sources.resize(L.sources.size());
  ps.window_floors.assign(static_cast<size_t>(L.n_layers), 0);
  int64_t off = 0;
  for (size_t i = 0; i < L.sources.size(); ++i) {
    ps.sources[i].block_offset = off;
    off += (B / L.sources[i].ratio) * L.sources[i].entry_bytes();
  }
  if (!snapshot.empty()) {
    Reader r(snapshot);
    uint32_t version = 0, flags = 0, bt = 0, nl = 0, win = 0, wrb = 0, ns = 0, es = 0;
    uint64_t p = 0;
    if (!r.get(&version) || !r.get(&flags) || !r.get(&p) || !r.get(&bt) || !r.get(&nl) || !r.get(&win) ||
        !r.get(&wrb) || !r.get(&ns) || !r.get(&es))
      return truncated("its header");
    if (version != kSnapshotVersion)
      return unimplemented("SWA snapshot payload version " + std::to_string(version));
    auto mismatch = [](const char* f, int64_t got, int64_t want) {
      return invalid_argument(std::string("SWA snapshot field ") + f + " is " + std::to_string(got) +
                              "; this model's layout has " + std::to_string(want));
    };
    if (bt != B) return mismatch("block_tokens", bt, B);
    if (nl != L.n_layers) return mismatch("n_layers", nl, L.n_layers);
    if (win != L.window) return mismatch("window", win, L.window);
    if (wrb != L.window_row_bytes) return mismatch("window_row_bytes", wrb, L.window_row_bytes);
    if (ns != L.sources.size()) return mismatch("n_sources", ns, static_cast<int64_t>(L.sources.size()));
    if (es != kEngramSlots) return mismatch("engram_slots", es, kEngramSlots);
    const int64_t pos = static_cast<int64_t>(p);
    if (pos / B != n)
      return invalid_argument("SWA snapshot at position " + std::to_string(pos) + " needs " +
                              std::to_string(pos / B) + " full blocks, got " + std::to_string(n));
    ps.position = pos;
    if (!r.get(&ps.last_published_source) || !r.get(&ps.engram.length)) return truncated("the Engram state");
    for (int i = 0; i < kEngramSlots; ++i)
      if (!r.get(&ps.engram.recent[i])) return truncated("the Engram look-back");
    for (int64_t l = 0; l < L.n_layers; ++l)
      if (!r.get(&ps.window_floors[l])) return truncated("the window floors");
    for (size_t i = 0; i < L.sources.size(); ++i) {
      const model::KvSourceLayout& sl = L.sources[i];
      uint32_t layer = 0, ratio = 0, kd = 0, kvb = 0, keyb = 0, tail = 0;
      if (!r.get(&layer) || !r.get(&ratio) || !r.get(&kd) || !r.get(&kvb) || !r.get(&keyb) || !r.get(&tail))
        return truncated("the KV source table");
      if (layer != sl.layer || ratio != sl.ratio || kd != sl.kv_dim || kvb != sl.kv_row_bytes ||
          keyb != sl.key_row_bytes)
        return invalid_argument("SWA snapshot KV source " + std::to_string(i) + " (layer " +
                                std::to_string(layer) + ", ratio " + std::to_string(ratio) +
                                ") does not match this model's layout");
      const int64_t expect = pos / sl.ratio - n * (B / sl.ratio);
      if (tail != expect) return mismatch("tail_entries", tail, expect);
      ps.sources[i].tail = tail;
    }
    const int64_t rows = std::min(pos, L.window);
    ps.rings.resize(L.n_layers);
    for (int64_t l = 0; l < L.n_layers; ++l)
      if (!(ps.rings[l] = r.take(static_cast<size_t>(rows * L.window_row_bytes))))
        return truncated("the window rings");
    for (size_t i = 0; i < L.sources.size(); ++i) {
      const model::KvSourceLayout& sl = L.sources[i];
      ParsedSource& t = ps.sources[i];
      if (!(t.tail_kv = r.take(static_cast<size_t>(t.tail * sl.kv_row_bytes))) ||
          !(t.tail_key = r.take(static_cast<size_t>(t.tail * sl.key_row_bytes))))
        return truncated("the partial block rows");
      if (sl.ratio > 1) {
        const size_t g = static_cast<size_t>(sl.ratio * sl.kv_dim) * sizeof(float);
        if (!(t.pend_filled = r.take(static_cast<size_t>(sl.ratio))) || !(t.pend_a = r.take(g)) ||
            !(t.pend_b = r.take(g)))
          return truncated("the pending groups");
      }
    }
    if (r.left() != 0)
      return data_loss("SWA snapshot payload has " + std::to_string(r.left()) + " trailing bytes");
    ps.has_snapshot = true;
  }
  for (size_t i = 0; i < L.sources.size(); ++i)
    ps.sources[i].count = n * (B / L.sources[i].ratio) + ps.sources[i].tail;
  return ps;
}

void apply_state(model::SequenceState& st, const ParsedState& ps) {
  const model::KvLayout& L = st.layout();
  const int64_t n = ps.n_blocks(), B = ps.block_tokens;
  for (size_t i = 0; i < L.sources.size(); ++i) {
    const model::KvSourceLayout& sl = L.sources[i];
    const ParsedSource& t = ps.sources[i];
    model::KvSourceState& s = *st.source(sl.layer);
    const int64_t per = B / sl.ratio;
    s.kv_rows.resize(static_cast<size_t>(t.count * sl.kv_row_bytes));
    s.key_rows.resize(static_cast<size_t>(t.count * sl.key_row_bytes));
    for (int64_t b = 0; b < n; ++b) {
      const uint8_t* src = ps.blocks[b].data() + t.block_offset;
      std::memcpy(s.kv_rows.data() + b * per * sl.kv_row_bytes, src,
                  static_cast<size_t>(per * sl.kv_row_bytes));
      std::memcpy(s.key_rows.data() + b * per * sl.key_row_bytes, src + per * sl.kv_row_bytes,
                  static_cast<size_t>(per * sl.key_row_bytes));
    }
    if (t.tail > 0) {
      std::memcpy(s.kv_rows.data() + n * per * sl.kv_row_bytes, t.tail_kv,
                  static_cast<size_t>(t.tail * sl.kv_row_bytes));
      std::memcpy(s.key_rows.data() + n * per * sl.key_row_bytes, t.tail_key,
                  static_cast<size_t>(t.tail * sl.key_row_bytes));
    }
    s.count = t.count;
    if (sl.ratio > 1 && t.pend_filled) {
      std::memcpy(s.pend_filled.data(), t.pend_filled, s.pend_filled.size());
      std::memcpy(s.pend_a.data(), t.pend_a, s.pend_a.size() * sizeof(float));
      std::memcpy(s.pend_b.data(), t.pend_b, s.pend_b.size() * sizeof(float));
    }
  }
  if (ps.has_snapshot) {
    const int64_t pos = ps.position, r0 = std::max<int64_t>(0, pos - L.window);
    for (int64_t l = 0; l < L.n_layers; ++l) {
      st.set_window_floor(l, ps.window_floors[l]);
      for (int64_t p = r0; p < pos; ++p)
        std::memcpy(st.window_row(l, p), ps.rings[l] + (p - r0) * L.window_row_bytes,
                    static_cast<size_t>(L.window_row_bytes));
    }
    st.last_published_source = ps.last_published_source;
    st.engram_state() = ps.engram;
  }
  st.set_position(ps.position);
}

Status decode_state(model::SequenceState& st, std::span<const std::span<const uint8_t>> blocks,
                    std::span<const uint8_t> snapshot, int64_t B) {
  DS41_ASSIGN_OR_RETURN(ParsedState ps, parse_state(st.layout(), st.position(), blocks, snapshot, B));
  apply_state(st, ps);
  return ok_status();
}

}  // namespace ds41::engine
