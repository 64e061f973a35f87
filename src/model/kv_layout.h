// ds41 model: KvLayout — what a sequence's cache holds and how many bytes it costs
// (MODEL_SPEC 4.1, 5.2-5.4), derived from config.json + the layer schedule. The per-sequence
// allocator (SequenceState) sizes every buffer from this struct, so the bytes it reports are the
// bytes it really spends.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/layer_schedule.h"

namespace ds41::model {

struct KvSourceLayout {
  int64_t layer = 0;
  int64_t ratio = 1;          // tokens per compressed entry
  int64_t kv_dim = 0;         // head_dim (main compressed entry width)
  int64_t key_dim = 0;        // index_head_dim
  int64_t kv_row_bytes = 0;   // Q_kv packed row (288 B for 512)
  int64_t key_row_bytes = 0;  // Q_idx packed row (68 B for 128)
  int64_t entry_bytes() const { return kv_row_bytes + key_row_bytes; }
};

struct KvLayout {
  int64_t n_layers = 0;
  int64_t window = 0;            // sliding_window rows per layer ring
  int64_t window_row_bytes = 0;  // Q_win packed row (528 B for 512)
  int64_t window_dim = 0;
  std::vector<KvSourceLayout> sources;  // one per KV-source layer, in layer order

  // Global (growing) KV bytes per token: sum over sources of entry_bytes / ratio
  // (890 B for the released config, MODEL_SPEC 5.3).
  double global_bytes_per_token() const;
  // Bounded state: all window rings (MODEL_SPEC 5.4).
  int64_t window_ring_bytes() const { return n_layers * window * window_row_bytes; }
};

// Errors name the dimension that is not a multiple of a fake-quant block.
Result<KvLayout> make_kv_layout(const ModelConfig& c, const LayerSchedule& s);

}  // namespace ds41::model
