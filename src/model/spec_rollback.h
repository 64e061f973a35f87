// ds41 model: SpecJournal and rollback — undoing what a speculative verification forward wrote
// for rejected positions, so that the sequence state equals that of a plain decode of the
// committed tokens (MODEL_SPEC 3.10.8).
//
// A verification forward runs the target once over [x_L, c_0 .. c_{l-1}] at positions L..L+l
// (an ordinary chunk through the cache, 4.2). Before acceptance is known it has
//   - written its window rows into the 128-row rings, overwriting the rows of positions q - W
//     that are still needed if q is rejected: the journal keeps the overwritten rows (the spec's
//     "save the overwritten rows" option; the rings keep their format and size);
//   - emitted compressed / indexer rows (ratio 1: one per position; ratio 2: one per pair
//     completed in the chunk) and changed the ratio-2 half-pair buffer: the journal keeps the
//     buffer after every row and the position of every emission;
//   - advanced the Engram look-back and the position counter: the journal keeps the look-back
//     from before the call.
// rollback_spec() keeps the first `keep` rows of the call and undoes the rest. Index top-k and
// candidate masks are per query and carry no state. The journal is filled by ForwardPass when
// passed in ForwardOptions::journals; a journaled call holds at most `sliding_window` rows.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engram/hasher.h"
#include "model/sequence_state.h"

namespace ds41::model {

struct SpecJournal {
  int64_t start_pos = -1;  // position of the call's first row
  int64_t rows = 0;        // tokens of the call
  int64_t last_published_before = -1;
  engram::EngramHashState engram_before;
  // Window rings: per layer, the overwritten rows (old bytes) of positions ring_first[l]...
  std::vector<int64_t> ring_first;
  std::vector<std::vector<uint8_t>> ring_old;
  // KV sources (index = position in SequenceState::sources()).
  struct Source {
    int64_t layer = -1;
    int64_t count_before = 0;
    std::vector<int64_t> emit_pos;  // position of the row whose processing emitted each entry
    // Half-pair buffer after each row of the call (ratio > 1 only): [rows] snapshots.
    std::vector<std::vector<float>> pend_a, pend_b;
    std::vector<std::vector<uint8_t>> pend_filled;
  };
  std::vector<Source> sources;

  // --- filled by ForwardPass ---
  void begin(const SequenceState& st, int64_t rows);
  void save_ring_row(int64_t layer, int64_t pos, const uint8_t* old_row, int64_t row_bytes);
  void note_source_row(int64_t layer, int64_t pos, const KvSourceState& src, bool emitted);
};

// Keeps rows [0, keep) of the journaled call (positions start_pos .. start_pos + keep - 1) and
// undoes every state change made for the others; `tokens` are the call's tokens (the Engram
// look-back is rebuilt from them). keep in [1, rows]. The journal is spent afterwards.
Status rollback_spec(SequenceState& st, const SpecJournal& j, int64_t keep, std::span<const int32_t> tokens,
                     const engram::EngramHasher* hasher);

}  // namespace ds41::model
