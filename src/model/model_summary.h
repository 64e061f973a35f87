// ds41 model: derived facts about a model for `ds41 inspect` — parameter counts per group,
// global-KV bytes per token (MODEL_SPEC 5.2-5.3) and the bounded per-sequence state (5.4), all
// computed from the config, the layer schedule and the tensor contract (never typed in).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/tensor_contract.h"

namespace ds41::model {

struct KvSourceBytes {
  int64_t layer = 0;
  int64_t ratio = 0;
  int64_t kv_row_bytes = 0;    // Q_kv packed row of head_dim channels (288 B for 512)
  int64_t idx_row_bytes = 0;   // Q_idx packed row of index_head_dim channels (68 B for 128)
  double bytes_per_token = 0;  // (kv + idx) / ratio
};

struct BoundedState {
  int64_t window_layers = 0;            // backbone layers with a window ring
  int64_t window_stage_layers = 0;      // DSpark stages with a window ring
  int64_t window_row_bytes = 0;         // Q_win packed row (528 B for 512)
  int64_t window_ring_bytes = 0;        // backbone: layers x sliding_window x row
  int64_t window_ring_stage_bytes = 0;  // DSpark stages
  int64_t half_pair_bytes = 0;          // pending compressor inputs of ratio > 1 sources (FP32 kv + gate)
  int64_t engram_lookback_ids = 0;      // compressed ids kept for the n-gram hashes
  int64_t total_bytes = 0;              // window rings (both) + half pairs + look-back ids (4 B each)
};

struct ModelSummary {
  uint64_t contract_tensors = 0;
  uint64_t contract_payload_bytes = 0;
  std::map<DType, DtypeTotals> by_dtype;
  std::map<ParamGroup, uint64_t> params_by_group;
  uint64_t params_total = 0;
  std::vector<KvSourceBytes> kv_sources;
  double global_kv_bytes_per_token = 0;
  BoundedState bounded;
};

ModelSummary summarize_model(const ModelConfig& c, const LayerSchedule& s, const TensorContract& k);

}  // namespace ds41::model
