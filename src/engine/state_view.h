// ds41 engine: the two engine-neutral forms of a sequence's state that the payload codec
// (state_codec.h) works between, so every engine writes and reads the SAME bytes with one
// implementation:
//   - StateView: what an encoder reads — a read-only view of one sequence's state in host memory
//     (the CPU engine points into its SequenceState; the GPU engine first copies the few rows a
//     payload needs from its device pools into host buffers and points at those);
//   - ParsedState: what a decoder produced — a fully validated restore (pointers into the
//     payloads) that each engine then applies to its own storage (apply_state for SequenceState,
//     CudaEngine::import_state for the device pools).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engram/hasher.h"
#include "model/kv_layout.h"

namespace ds41::engine {

struct SourceStateView {
  int64_t count = 0;              // compressed entries emitted so far
  int64_t first = 0;              // the entry whose rows kv / key start with
  int64_t rows = 0;               // entries held contiguously from `first`
  const uint8_t* kv = nullptr;    // rows x kv_row_bytes (Q_kv packed)
  const uint8_t* key = nullptr;   // rows x key_row_bytes (Q_idx packed)
  // ratio > 1: the pending group (ratio flags, ratio x kv_dim floats of a and of b).
  const uint8_t* pend_filled = nullptr;
  const float* pend_a = nullptr;
  const float* pend_b = nullptr;
};

struct StateView {
  const model::KvLayout* layout = nullptr;
  int64_t position = 0;
  int64_t last_published_source = -1;
  engram::EngramHashState engram;
  std::vector<int64_t> window_floors;     // [n_layers]
  std::vector<const uint8_t*> rings;      // [n_layers]: `window` rows, position p at row p % window
  std::vector<SourceStateView> sources;   // layout order
};

struct ParsedSource {
  int64_t count = 0;                   // entries after the restore (blocks x B / ratio + tail)
  int64_t tail = 0;                    // entries of the partial last block (snapshot)
  const uint8_t* tail_kv = nullptr;    // tail x kv_row_bytes
  const uint8_t* tail_key = nullptr;   // tail x key_row_bytes
  // ratio > 1 with a snapshot: the pending group (flags; a and b as the payload's float32 bytes,
  // ratio x kv_dim each, not necessarily aligned).
  const uint8_t* pend_filled = nullptr;
  const uint8_t* pend_a = nullptr;
  const uint8_t* pend_b = nullptr;
  int64_t block_offset = 0;            // byte offset of this source's rows in a block payload
};

struct ParsedState {
  int64_t position = 0;                // the restored sequence's position
  int64_t block_tokens = 0;
  std::span<const std::span<const uint8_t>> blocks;
  bool has_snapshot = false;
  // With a snapshot only (otherwise a fresh sequence's values).
  int64_t last_published_source = -1;
  engram::EngramHashState engram;
  std::vector<int64_t> window_floors;  // [n_layers]
  // [n_layers]: min(position, window) Q_win rows of positions max(0, position - window) ..
  // position - 1, in position order.
  std::vector<const uint8_t*> rings;
  std::vector<ParsedSource> sources;   // layout order

  int64_t n_blocks() const { return static_cast<int64_t>(blocks.size()); }
};

}  // namespace ds41::engine
