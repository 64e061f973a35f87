// ds41 model: DsparkState — the per-sequence state of the DSpark draft (MODEL_SPEC 3.10.3, 4.1):
// one window ring per stage of `window` packed Q_win rows (the same 528-byte row format as the
// target's rings at the released size), slot = position % window, holding the stage's context
// row w_s[p] of committed positions only, and the position of the next row to write. Nothing else
// persists between draft steps: the block rows are never stored and the Markov / confidence
// values are per step. Owned by SequenceState (SequenceState::dspark); not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace ds41::model {

class DsparkState {
 public:
  DsparkState(int64_t n_stages, int64_t window, int64_t row_bytes);

  int64_t n_stages() const { return static_cast<int64_t>(rings_.size()); }
  int64_t window() const { return window_; }
  int64_t row_bytes() const { return row_bytes_; }
  // Rows exist for the committed positions max(first, next - window) .. next - 1.
  int64_t next_position() const { return next_; }
  int64_t first_position() const { return first_; }
  void set_next_position(int64_t p) { next_ = p; }
  // A sequence whose target state arrived without draft rows (a prefix-cache restore, a bounded
  // replay): no rows before p. The draft then attends to fewer context rows until the window
  // refills, which lowers acceptance only; verification keeps the output exact.
  void restart_at(int64_t p) { next_ = first_ = p; }
  uint8_t* row(int64_t stage, int64_t pos) { return rings_[stage].data() + (pos % window_) * row_bytes_; }
  const uint8_t* row(int64_t stage, int64_t pos) const {
    return rings_[stage].data() + (pos % window_) * row_bytes_;
  }
  int64_t bytes() const { return n_stages() * window_ * row_bytes_; }

 private:
  int64_t window_ = 0, row_bytes_ = 0, next_ = 0, first_ = 0;
  std::vector<std::vector<uint8_t>> rings_;
};

}  // namespace ds41::model
