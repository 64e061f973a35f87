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

// Global-KV block: for each KV source in layer order, its B / ratio compressed rows (Q_kv packed,
// MODEL_SPEC 5.2) then its B / ratio indexer key rows (Q_idx packed).
Result<std::vector<uint8_t>> encode_kv_block(const model::SequenceState& st, int64_t index, int64_t B) {
  DS41_RETURN_IF_ERROR(check_block_tokens(st.layout(), B));
  if (index < 0 || (index + 1) * B > st.position())
    return out_of_range("global-KV block " + std::to_string(index) + " (tokens up to " +
                        std::to_string((index + 1) * B) + ") is past the sequence's position " +
                        std::to_string(st.position()));
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(kv_block_payload_bytes(st.layout(), B)));
  Writer w(&out);
  for (const model::KvSourceLayout& sl : st.layout().sources) {
    const model::KvSourceState& s = *st.source(sl.layer);
    const int64_t n = B / sl.ratio, first = index * n;
    DS41_CHECK(first + n <= s.count, "KV source has fewer entries than its position implies");
    w.bytes(s.kv_row(first), static_cast<size_t>(n * sl.kv_row_bytes));
    w.bytes(s.key_row(first), static_cast<size_t>(n * sl.key_row_bytes));
  }
  return out;
}

Result<std::vector<uint8_t>> encode_swa_snapshot(const model::SequenceState& st0, int64_t B, uint32_t flags) {
  DS41_RETURN_IF_ERROR(check_block_tokens(st0.layout(), B));
  // The accessors the forward pass uses are non-const; nothing below writes.
  model::SequenceState& st = const_cast<model::SequenceState&>(st0);
  const model::KvLayout& L = st.layout();
  const int64_t pos = st.position(), full = pos / B;
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
  w.put<int64_t>(st.last_published_source);
  const engram::EngramHashState& eg = st.engram_state();
  w.put<int64_t>(eg.length);
  for (int i = 0; i < kEngramSlots; ++i) w.put<int32_t>(eg.recent[i]);
  for (int64_t l = 0; l < L.n_layers; ++l) w.put<int64_t>(st.window_floor(l));
  for (const model::KvSourceLayout& sl : L.sources) {
    const model::KvSourceState& s = *st.source(sl.layer);
    w.put<uint32_t>(static_cast<uint32_t>(sl.layer));
    w.put<uint32_t>(static_cast<uint32_t>(sl.ratio));
    w.put<uint32_t>(static_cast<uint32_t>(sl.kv_dim));
    w.put<uint32_t>(static_cast<uint32_t>(sl.kv_row_bytes));
    w.put<uint32_t>(static_cast<uint32_t>(sl.key_row_bytes));
    w.put<uint32_t>(static_cast<uint32_t>(s.count - full * (B / sl.ratio)));
  }
  // Window rings in position order (engine-neutral; a ring's slot is position % window).
  const int64_t r0 = std::max<int64_t>(0, pos - L.window);
  for (int64_t l = 0; l < L.n_layers; ++l)
    for (int64_t p = r0; p < pos; ++p) w.bytes(st.window_row(l, p), static_cast<size_t>(L.window_row_bytes));
  for (const model::KvSourceLayout& sl : L.sources) {
    const model::KvSourceState& s = *st.source(sl.layer);
    const int64_t first = full * (B / sl.ratio), tail = s.count - first;
    if (tail > 0) {
      w.bytes(s.kv_row(first), static_cast<size_t>(tail * sl.kv_row_bytes));
      w.bytes(s.key_row(first), static_cast<size_t>(tail * sl.key_row_bytes));
    }
    if (sl.ratio > 1) {
      w.bytes(s.pend_filled.data(), s.pend_filled.size());
      w.bytes(s.pend_a.data(), s.pend_a.size() * sizeof(float));
      w.bytes(s.pend_b.data(), s.pend_b.size() * sizeof(float));
    }
  }
  return out;
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

Status decode_state(model::SequenceState& st, std::span<const std::span<const uint8_t>> blocks,
                    std::span<const uint8_t> snapshot, int64_t B) {
  const model::KvLayout& L = st.layout();
  DS41_RETURN_IF_ERROR(check_block_tokens(L, B));
  if (st.position() != 0)
    return failed_precondition("state import needs a fresh sequence (it is at position " +
                               std::to_string(st.position()) + ")");
  const int64_t n = static_cast<int64_t>(blocks.size());
  const int64_t want = kv_block_payload_bytes(L, B);
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(blocks[i].size()) != want)
      return data_loss("global-KV block " + std::to_string(i) + " has " + std::to_string(blocks[i].size()) +
                       " payload bytes; this model's layout needs " + std::to_string(want));

  // Parse and check the whole snapshot before touching the state.
  struct SourceTail {
    int64_t tail = 0;
    const uint8_t *kv = nullptr, *key = nullptr, *filled = nullptr, *pa = nullptr, *pb = nullptr;
  };
  std::vector<SourceTail> tails(L.sources.size());
  std::vector<int64_t> floors;
  std::vector<const uint8_t*> rings;
  int64_t pos = n * B, last_pub = -1, eg_len = 0;
  std::array<int32_t, kEngramSlots> eg_recent{};
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
    pos = static_cast<int64_t>(p);
    if (pos / B != n)
      return invalid_argument("SWA snapshot at position " + std::to_string(pos) + " needs " +
                              std::to_string(pos / B) + " full blocks, got " + std::to_string(n));
    if (!r.get(&last_pub) || !r.get(&eg_len)) return truncated("the Engram state");
    for (int i = 0; i < kEngramSlots; ++i)
      if (!r.get(&eg_recent[i])) return truncated("the Engram look-back");
    floors.resize(L.n_layers);
    for (int64_t l = 0; l < L.n_layers; ++l)
      if (!r.get(&floors[l])) return truncated("the window floors");
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
      tails[i].tail = tail;
    }
    const int64_t rows = std::min(pos, L.window);
    rings.resize(L.n_layers);
    for (int64_t l = 0; l < L.n_layers; ++l)
      if (!(rings[l] = r.take(static_cast<size_t>(rows * L.window_row_bytes))))
        return truncated("the window rings");
    for (size_t i = 0; i < L.sources.size(); ++i) {
      const model::KvSourceLayout& sl = L.sources[i];
      SourceTail& t = tails[i];
      if (!(t.kv = r.take(static_cast<size_t>(t.tail * sl.kv_row_bytes))) ||
          !(t.key = r.take(static_cast<size_t>(t.tail * sl.key_row_bytes))))
        return truncated("the partial block rows");
      if (sl.ratio > 1) {
        const size_t g = static_cast<size_t>(sl.ratio * sl.kv_dim) * sizeof(float);
        if (!(t.filled = r.take(static_cast<size_t>(sl.ratio))) || !(t.pa = r.take(g)) || !(t.pb = r.take(g)))
          return truncated("the pending groups");
      }
    }
    if (r.left() != 0)
      return data_loss("SWA snapshot payload has " + std::to_string(r.left()) + " trailing bytes");
  }

  // Everything checked: write the state.
  for (size_t i = 0; i < L.sources.size(); ++i) {
    const model::KvSourceLayout& sl = L.sources[i];
    model::KvSourceState& s = *st.source(sl.layer);
    const int64_t per = B / sl.ratio, count = n * per + tails[i].tail;
    s.kv_rows.resize(static_cast<size_t>(count * sl.kv_row_bytes));
    s.key_rows.resize(static_cast<size_t>(count * sl.key_row_bytes));
    int64_t off = 0;
    for (const model::KvSourceLayout& prev : L.sources) {
      if (prev.layer == sl.layer) break;
      off += (B / prev.ratio) * prev.entry_bytes();
    }
    for (int64_t b = 0; b < n; ++b) {
      const uint8_t* src = blocks[b].data() + off;
      std::memcpy(s.kv_rows.data() + b * per * sl.kv_row_bytes, src,
                  static_cast<size_t>(per * sl.kv_row_bytes));
      std::memcpy(s.key_rows.data() + b * per * sl.key_row_bytes, src + per * sl.kv_row_bytes,
                  static_cast<size_t>(per * sl.key_row_bytes));
    }
    if (tails[i].tail > 0) {
      std::memcpy(s.kv_rows.data() + n * per * sl.kv_row_bytes, tails[i].kv,
                  static_cast<size_t>(tails[i].tail * sl.kv_row_bytes));
      std::memcpy(s.key_rows.data() + n * per * sl.key_row_bytes, tails[i].key,
                  static_cast<size_t>(tails[i].tail * sl.key_row_bytes));
    }
    s.count = count;
    if (sl.ratio > 1 && tails[i].filled) {
      std::memcpy(s.pend_filled.data(), tails[i].filled, s.pend_filled.size());
      std::memcpy(s.pend_a.data(), tails[i].pa, s.pend_a.size() * sizeof(float));
      std::memcpy(s.pend_b.data(), tails[i].pb, s.pend_b.size() * sizeof(float));
    }
  }
  if (!snapshot.empty()) {
    const int64_t r0 = std::max<int64_t>(0, pos - L.window);
    for (int64_t l = 0; l < L.n_layers; ++l) {
      st.set_window_floor(l, floors[l]);
      for (int64_t p = r0; p < pos; ++p)
        std::memcpy(st.window_row(l, p), rings[l] + (p - r0) * L.window_row_bytes,
                    static_cast<size_t>(L.window_row_bytes));
    }
    st.last_published_source = last_pub;
    engram::EngramHashState& eg = st.engram_state();
    eg.length = eg_len;
    for (int i = 0; i < kEngramSlots; ++i) eg.recent[i] = eg_recent[i];
  }
  st.set_position(pos);
  return ok_status();
}

}  // namespace ds41::engine
