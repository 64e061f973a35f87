// ds41 gpu: SequenceSlots — the bounded part of every sequence's state on the device
// (MODEL_SPEC 4.1, 5.4), one fixed slot per live sequence: per layer a window ring of
// `sliding_window` Q_win rows (slot = position % window) and, per KV source with ratio > 1, the
// pending partial group (a and b rows in float32, MODEL_SPEC 3.4.4). The rings are laid out
// [layer][slot][window][row] so one list of row offsets serves every layer of a step (base pointer
// per layer). GpuSequence is the host mirror the step plan is built from: position, the page list
// and entry count of each KV source, which pending rows are filled, the Engram look-back (the
// hasher runs on the host), the per-layer window floors (MODEL_SPEC 4.4 / 4.5: the lowest position
// a layer's window may read; raised by a bounded replay) — all derived from positions alone.
// Nothing is allocated after creation. The host transfers (state export / import, cuda_engine.h)
// run on the caller's stream; the caller synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "engram/hasher.h"
#include "gpu/device_buffer.h"
#include "model/kv_layout.h"

namespace ds41::gpu {

struct GpuSourceMirror {
  int64_t count = 0;                 // compressed entries emitted so far
  std::vector<int32_t> pages;        // KvBlockPool pages, entry k in pages[k / entries_per_page]
  std::vector<uint8_t> pend_filled;  // ratio > 1: which pending rows hold this group's a/b rows
};

struct GpuSequence {
  int64_t position = 0;                  // absolute position of the next token
  int32_t slot = -1;                     // SequenceSlots slot
  std::vector<GpuSourceMirror> sources;  // one per KvLayout source, in layout order
  engram::EngramHashState engram;
  int64_t last_published_source = -1;
  std::vector<int64_t> window_floor;  // per layer (empty: all 0), as SequenceState::window_floor
  // DSpark draft rings (MODEL_SPEC 3.10.3; GpuForward::enable_dspark): rows exist for the committed
  // positions max(draft_first, draft_next - window) .. draft_next - 1 (as model::DsparkState).
  int64_t draft_next = 0, draft_first = 0;
};

class SequenceSlots {
 public:
  SequenceSlots() = default;
  static Result<SequenceSlots> create(const model::KvLayout& layout, int64_t max_slots);

  Result<int32_t> allocate();  // resource_exhausted when every slot is live
  void release(int32_t slot);
  // Zeroes the slot's pending groups (a new sequence): a ratio-R group's slot R - 1 is never written
  // by a one-token decode, and SWA snapshots carry the whole group, so its bytes must not depend
  // on what the slot held before (the CPU reference starts from zeros too).
  Status clear_pending(int32_t slot, cudaStream_t stream) const;
  // Copies the whole bounded state of slot src into dst (fork), on `stream`.
  Status copy(int32_t src, int32_t dst, cudaStream_t stream) const;
  int64_t max_slots() const { return max_slots_; }
  int64_t live() const { return max_slots_ - static_cast<int64_t>(free_.size()); }

  // Window rings: base of layer l's rings, and the byte offset of position t's row of a slot.
  uint8_t* ring_layer_base(int64_t l) const { return rings_.as<uint8_t>() + l * layer_stride_; }
  int64_t ring_row_offset(int32_t slot, int64_t t) const {
    return slot * window_ * row_bytes_ + (t % window_) * row_bytes_;
  }
  // Pending groups: row index (in rows of kv_dim floats from pending_base()) of row i of the a
  // (ab = 0) or b (ab = 1) part of pending source j (j counts the ratio > 1 sources only).
  float* pending_base() const { return pending_.as<float>(); }
  int64_t pending_row(int32_t slot, int64_t j, int64_t ab, int64_t i) const {
    return ((slot * n_pending_ + j) * 2 + ab) * r_max_ + i;
  }
  // Index among the ratio > 1 sources of layout source s (-1 for ratio 1).
  int64_t pending_index(int64_t s) const { return pending_of_source_[s]; }
  // Host transfers of one slot's state (export / import): the rings of every layer as
  // [n_layers][window][row] (position p at row p % window), and rows 0..rows-1 of the a and b parts
  // of pending source j (rows x kv_dim floats each).
  Status download_rings(int32_t slot, uint8_t* host, cudaStream_t stream) const;
  Status upload_rings(int32_t slot, const uint8_t* host, cudaStream_t stream) const;
  Status download_pending(int32_t slot, int64_t j, int64_t rows, float* a, float* b, cudaStream_t stream) const;
  Status upload_pending(int32_t slot, int64_t j, int64_t rows, const void* a, const void* b,
                        cudaStream_t stream) const;
  int64_t ring_slot_bytes() const { return n_layers_ * window_ * row_bytes_; }
  int64_t ring_layer_stride() const { return layer_stride_; }
  int64_t window() const { return window_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t n_layers() const { return n_layers_; }
  int64_t kv_dim() const { return kv_dim_; }

  // Bytes of one slot (rings + pending groups), as SequenceState::bounded_bytes() counts them
  // without the host-side Engram look-back.
  int64_t slot_bytes() const { return n_layers_ * window_ * row_bytes_ + pending_slot_floats_ * 4; }

 private:
  int64_t max_slots_ = 0, n_layers_ = 0, window_ = 0, row_bytes_ = 0, layer_stride_ = 0;
  int64_t n_pending_ = 0, r_max_ = 0, kv_dim_ = 0, pending_slot_floats_ = 0;
  std::vector<int64_t> pending_of_source_;
  std::vector<int32_t> free_;
  DeviceBuffer rings_, pending_;
};

}  // namespace ds41::gpu
