// ds41 model: DsparkWeights — a typed, validated view of the DSpark draft stages' tensors
// `mtp.{s}.*` (MODEL_SPEC 3.10.1). Each stage is an ordinary ratio-0 block (window attention, no
// compressor / indexer / Engram) whose MoE has dspark_n_routed_experts experts; the context
// projection lives on the first stage, the final norm, the Markov factors and the confidence
// head on the last. Embedding and output head are the target's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/loader/safetensors.h"
#include "model/model_weights.h"
#include "ops/weight_ref.h"

namespace ds41::model {

struct DsparkWeights {
  std::vector<LayerWeights> stages;                  // mtp.0 .. mtp.{n-1}
  ops::WeightRef main_proj;                          // [H, n_targets * H] (FP8)
  std::vector<float> main_norm;                      // [H]
  std::vector<float> norm;                           // [H] final norm of the draft (last stage)
  const uint8_t* markov_embed = nullptr;             // BF16 [V, R] ("embed", vLLM markov_w1)
  ops::WeightRef markov_head;                        // BF16 [V, R] ("head", vLLM markov_w2)
  ops::WeightRef confidence_proj;                    // BF16 [1, H + R], no bias
  std::vector<std::unique_ptr<std::string>> names_;  // backing store of WeightRef::name

  int64_t n_stages() const { return static_cast<int64_t>(stages.size()); }
};

// Binds the num_nextn_predict_layers stages; every missing or mis-shaped tensor is reported at
// once. ck must outlive the result. Precondition: c.num_nextn_predict_layers > 0.
Result<std::unique_ptr<DsparkWeights>> bind_dspark_weights(const Checkpoint& ck, const ModelConfig& c);

}  // namespace ds41::model
