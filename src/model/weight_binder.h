// ds41 model (internal): WeightBinder — looks checkpoint tensors up by name and checks dtype
// and shape against what config.json implies (MODEL_SPEC 2), collecting every mismatch instead
// of stopping at the first. Shared by the text model's binding (model_weights.cpp) and the
// DSpark stages' (dspark_weights.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/model_weights.h"
#include "ops/weight_ref.h"

namespace ds41::model {

class WeightBinder {
 public:
  explicit WeightBinder(const Checkpoint& ck) : ck_(ck) {}
  std::vector<std::string> errors;

  // The tensor, or nullptr (and an error line) when missing or of another dtype / shape.
  const TensorRef* get(const std::string& name, DType dt, const std::vector<int64_t>& shape);
  // BF16 or F32 vector -> float.
  std::vector<float> vec(const std::string& name, int64_t n, DType dt);
  std::vector<float> f32_matrix(const std::string& name, int64_t r, int64_t c);
  // A linear weight `base` of logical shape [out, in], in whichever checkpoint format it has.
  ops::WeightRef linear(const std::string& base, int64_t out, int64_t in);
  // Backing store of WeightRef::name strings; move it into the weights view.
  std::vector<std::unique_ptr<std::string>>& names() { return names_; }

 private:
  const Checkpoint& ck_;
  std::vector<std::unique_ptr<std::string>> names_;
};

// One block's tensors under prefix L ("layers.{l}." or "mtp.{s}."): attention, the compressor and
// indexer parts the plan asks for, the MoE with n_experts routed experts, both mHC sites, Engram.
LayerWeights bind_layer_weights(WeightBinder& b, const ModelConfig& c, const std::string& L,
                                const LayerPlan& p, int64_t n_experts);

}  // namespace ds41::model
