// ds41 model: ModelWeights — a typed, validated view of a checkpoint's tensors for the
// forward pass (MODEL_SPEC 2), with names derived from config.json + the layer schedule.
// Linear weights stay in their checkpoint format (ops::WeightRef points into the mmapped
// files); only small vectors (norm weights, mHC parameters, sinks, router biases, the Engram
// q*k product) are converted to float32 here. Every missing or mis-shaped tensor is reported at
// once, one per line.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "ops/weight_ref.h"

namespace ds41::model {

struct HcSiteWeights {
  std::vector<float> fn;     // [(2 + C) * C, C * H]
  std::vector<float> base;   // [(2 + C) * C]
  std::vector<float> scale;  // [3]
};

struct ExpertWeights {
  ops::WeightRef w1, w2, w3;
};

struct EngramWeights {
  const uint8_t* table = nullptr;        // E4M3 [rows, head_dim]
  const uint8_t* table_scale = nullptr;  // E8M0 [rows, head_dim / 32]
  int64_t rows = 0;
  ops::WeightRef wkv;        // [(C + 1) * H, cols * head_dim]
  std::vector<float> omega;  // q_weight * k_weight, [C, H]
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  ops::WeightRef wq_a, wq_b, wkv, wo_a, wo_b;
  std::vector<float> q_norm, kv_norm, attn_sink;
  // KV source
  ops::WeightRef c_wkv, c_wgate;  // c_wgate absent for ratio 1
  std::vector<float> c_norm;
  ops::WeightRef idx_wk;
  std::vector<float> idx_k_norm;
  // index source
  ops::WeightRef idx_wq_b, idx_weights_proj;
  // MoE
  ops::WeightRef gate;
  std::vector<float> gate_bias, gate_bias_vl;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  HcSiteWeights hc_attn, hc_ffn;
  std::unique_ptr<EngramWeights> engram;
};

struct ModelWeights {
  const uint8_t* embed = nullptr;  // BF16 [vocab, hidden]
  ops::WeightRef head;             // [vocab, hidden]
  std::vector<float> norm;
  std::vector<LayerWeights> layers;
  std::vector<std::unique_ptr<std::string>> names_;  // backing store of WeightRef::name
};

// Builds the view; ck must outlive the result.
Result<std::unique_ptr<ModelWeights>> bind_model_weights(const Checkpoint& ck, const ModelConfig& c,
                                                         const LayerSchedule& s);

}  // namespace ds41::model
