// ds41 model: SequenceState allocation and accounting.
#include "model/sequence_state.h"

namespace ds41::model {

SequenceState::SequenceState(const KvLayout& layout) : layout_(layout) {
  window_.resize(layout.n_layers);
  for (auto& w : window_) w.assign(static_cast<size_t>(layout.window * layout.window_row_bytes), 0);
  window_floor_.assign(layout.n_layers, 0);
  source_of_layer_.assign(layout.n_layers, -1);
  for (const KvSourceLayout& s : layout.sources) {
    source_of_layer_[s.layer] = static_cast<int64_t>(sources_.size());
    KvSourceState st;
    st.layout = s;
    if (s.ratio > 1) {
      st.pend_a.assign(s.ratio * s.kv_dim, 0.0f);
      st.pend_b.assign(s.ratio * s.kv_dim, 0.0f);
      st.pend_filled.assign(s.ratio, 0);
    }
    sources_.push_back(std::move(st));
  }
}

KvSourceState* SequenceState::source(int64_t layer) {
  int64_t i = source_of_layer_[layer];
  return i < 0 ? nullptr : &sources_[i];
}
const KvSourceState* SequenceState::source(int64_t layer) const {
  int64_t i = source_of_layer_[layer];
  return i < 0 ? nullptr : &sources_[i];
}

int64_t SequenceState::global_kv_bytes() const {
  int64_t b = 0;
  for (const KvSourceState& s : sources_) b += static_cast<int64_t>(s.kv_rows.size() + s.key_rows.size());
  return b;
}

int64_t SequenceState::bounded_bytes() const {
  int64_t b = 0;
  for (const auto& w : window_) b += static_cast<int64_t>(w.size());
  for (const KvSourceState& s : sources_)
    b += static_cast<int64_t>((s.pend_a.size() + s.pend_b.size()) * sizeof(float));
  if (dspark) b += dspark->bytes();  // MODEL_SPEC 4.1: the DSpark stages' rings count too
  return b + static_cast<int64_t>(sizeof(engram_));
}

}  // namespace ds41::model
