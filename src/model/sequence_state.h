// ds41 model: SequenceState — the explicit per-sequence state of the forward pass
// (MODEL_SPEC 4.1), in the packed formats of MODEL_SPEC 5.2 / 4.1:
//   - per layer a window ring of `sliding_window` Q_win rows (528 B each at the released size),
//     slot = position % window, plus the lowest position the ring may serve (window_floor,
//     raised by the bounded-replay entry points, MODEL_SPEC 4.4 / 4.5);
//   - per KV source the compressed Q_kv rows and Q_idx key rows (the only growing state), and
//     for ratio > 1 the pending partial group (a and b rows in float32, MODEL_SPEC 3.4.4);
//   - the Engram look-back (last max_ngram - 1 compressed ids, DEAD marked);
//   - the absolute position of the next token;
//   - optionally the DSpark draft's context rings (MODEL_SPEC 3.10.3).
// Owned by the caller (engine / CLI); the model reads and appends. Not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engram/hasher.h"
#include "model/dspark_state.h"
#include "model/kv_layout.h"

namespace ds41::model {

struct KvSourceState {
  KvSourceLayout layout;
  int64_t count = 0;              // entries emitted so far
  std::vector<uint8_t> kv_rows;   // count * kv_row_bytes
  std::vector<uint8_t> key_rows;  // count * key_row_bytes
  // Pending group for ratio > 1: rows 0..ratio-1 of a and b (float32, kv_dim wide).
  std::vector<float> pend_a, pend_b;
  std::vector<uint8_t> pend_filled;

  const uint8_t* kv_row(int64_t k) const { return kv_rows.data() + k * layout.kv_row_bytes; }
  const uint8_t* key_row(int64_t k) const { return key_rows.data() + k * layout.key_row_bytes; }
};

class SequenceState {
 public:
  explicit SequenceState(const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  // Absolute position of the next token (= tokens consumed so far).
  int64_t position() const { return position_; }

  // Bytes held by compressed KV + indexer key rows (the growing part).
  int64_t global_kv_bytes() const;
  // Bytes of all bounded state (window rings, pending groups).
  int64_t bounded_bytes() const;

  // --- used by the forward pass ---
  uint8_t* window_row(int64_t layer, int64_t pos) {
    return window_[layer].data() + (pos % layout_.window) * layout_.window_row_bytes;
  }
  int64_t window_floor(int64_t layer) const { return window_floor_[layer]; }
  void set_window_floor(int64_t layer, int64_t pos) { window_floor_[layer] = pos; }
  // KV source state by layer (nullptr when the layer is not a KV source).
  KvSourceState* source(int64_t layer);
  const KvSourceState* source(int64_t layer) const;
  std::vector<KvSourceState>& sources() { return sources_; }
  // Engram look-back (last max_ngram - 1 compressed ids, DEAD marked; ds41_engram).
  engram::EngramHashState& engram_state() { return engram_; }
  void set_position(int64_t p) { position_ = p; }
  // Index of the KV source that appended an entry most recently (-1: none); MODEL_SPEC 7.21.
  int64_t last_published_source = -1;
  // DSpark draft context rings (MODEL_SPEC 3.10.3); present when speculative decoding is on for
  // this sequence (Dspark::enable). Rows are written for committed positions only.
  std::optional<DsparkState> dspark;

 private:
  KvLayout layout_;
  int64_t position_ = 0;
  std::vector<std::vector<uint8_t>> window_;
  std::vector<int64_t> window_floor_;
  std::vector<KvSourceState> sources_;
  std::vector<int64_t> source_of_layer_;
  engram::EngramHashState engram_;
};

}  // namespace ds41::model
