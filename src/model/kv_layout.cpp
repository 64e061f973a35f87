// ds41 model: KvLayout derivation (MODEL_SPEC 5).
#include "model/kv_layout.h"

#include "quant/fake_quant.h"

namespace ds41::model {

double KvLayout::global_bytes_per_token() const {
  double b = 0;
  for (const KvSourceLayout& s : sources)
    b += static_cast<double>(s.entry_bytes()) / static_cast<double>(s.ratio);
  return b;
}

Result<KvLayout> make_kv_layout(const ModelConfig& c, const LayerSchedule& s) {
  if (c.head_dim % quant::kQwinBlock != 0 || c.head_dim % quant::kQkvBlock != 0)
    return invalid_argument("head_dim " + std::to_string(c.head_dim) +
                            " is not a multiple of 32 (Q_win / Q_kv blocks)");
  if (c.index_head_dim % quant::kQidxBlock != 0)
    return invalid_argument("index_head_dim " + std::to_string(c.index_head_dim) +
                            " is not a multiple of 32 (Q_idx blocks)");
  KvLayout k;
  k.n_layers = c.num_hidden_layers;
  k.window = c.sliding_window;
  k.window_dim = c.head_dim;
  k.window_row_bytes = quant::window_row_bytes(c.head_dim);
  for (const LayerPlan& p : s.layers) {
    if (!p.kv_source) continue;
    KvSourceLayout src;
    src.layer = p.layer;
    src.ratio = p.ratio;
    src.kv_dim = c.head_dim;
    src.key_dim = c.index_head_dim;
    src.kv_row_bytes = quant::kv_row_bytes(c.head_dim);
    src.key_row_bytes = quant::idx_row_bytes(c.index_head_dim);
    k.sources.push_back(src);
  }
  return k;
}

}  // namespace ds41::model
