// ds41 model: parameter counts, KV bytes per token and bounded state (MODEL_SPEC 5).
#include "model/model_summary.h"

#include "quant/fake_quant.h"

namespace ds41::model {

ModelSummary summarize_model(const ModelConfig& c, const LayerSchedule& s, const TensorContract& k) {
  ModelSummary m;
  m.contract_tensors = k.tensors.size();
  m.contract_payload_bytes = k.payload_bytes();
  m.by_dtype = k.by_dtype();
  m.params_by_group = k.params_by_group();
  for (auto& [g, n] : m.params_by_group) m.params_total += n;

  // MODEL_SPEC 5.1-5.3: only the KV sources' compressed rows and indexer keys grow with context;
  // a source of ratio r emits one entry (main row + key row) per r tokens.
  for (const LayerPlan& p : s.layers) {
    if (!p.kv_source || p.ratio <= 0) continue;
    KvSourceBytes b;
    b.layer = p.layer;
    b.ratio = p.ratio;
    b.kv_row_bytes = quant::kv_row_bytes(c.head_dim);
    b.idx_row_bytes = quant::idx_row_bytes(c.index_head_dim);
    b.bytes_per_token = static_cast<double>(b.kv_row_bytes + b.idx_row_bytes) / static_cast<double>(p.ratio);
    m.global_kv_bytes_per_token += b.bytes_per_token;
    m.kv_sources.push_back(b);
  }

  // MODEL_SPEC 4.1 / 5.4: window rings of every layer (+ DSpark stages), the pending group of each
  // ratio > 1 source (r - 1 tokens, FP32 kv and gate inputs of head_dim each), Engram look-back.
  BoundedState& st = m.bounded;
  st.window_layers = c.num_hidden_layers;
  st.window_stage_layers = c.num_nextn_predict_layers;
  st.window_row_bytes = quant::window_row_bytes(c.head_dim);
  st.window_ring_bytes = st.window_layers * c.sliding_window * st.window_row_bytes;
  st.window_ring_stage_bytes = st.window_stage_layers * c.sliding_window * st.window_row_bytes;
  for (const LayerPlan& p : s.layers)
    if (p.kv_source && p.ratio > 1) st.half_pair_bytes += (p.ratio - 1) * 2 * c.head_dim * 4;
  st.engram_lookback_ids = c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1;
  st.total_bytes =
      st.window_ring_bytes + st.window_ring_stage_bytes + st.half_pair_bytes + 4 * st.engram_lookback_ids;
  return m;
}

}  // namespace ds41::model
