// ds41 gpu: the list of every device-resident weight of a model (MODEL_SPEC 2.2-2.3, 2.5), in the
// order and with the names of model::bind_model_weights, each with the field of
// DeviceModelWeights that receives its device pointer. Both loaders walk this one list: the
// safetensors loader (host sources from the bound model::ModelWeights view) and the dummy
// generator (the tensor contract's role of each name).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/device_model.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/model_weights.h"
#include "model/vision_weights.h"

namespace ds41::model {
struct DsparkWeights;
}

namespace ds41::gpu {

enum class WeightItemKind {
  kLinear,       // a linear weight in its checkpoint format (payload + E8M0 scales when quantized)
  kVec,          // a small float32 vector / matrix (norms, sinks, mHC parameters, router biases)
  kEmbed,        // the BF16 embedding table
  kEngramTable,  // E4M3 rows + E8M0 per-32 scales (device, or mapped host-pinned memory)
  kOmega,        // Engram q_weight * k_weight, float32 [C, H]
};

struct WeightItem {
  WeightItemKind kind = WeightItemKind::kVec;
  // kLinear / kEngramTable: the tensor base name P (P.weight, P.scale); kVec / kEmbed: the tensor
  // name; kOmega: "layers.L.engram." (q_weight / k_weight follow).
  std::string name;
  int64_t rows = 0, cols = 0;  // logical shape ([out, in], [rows, dim], vectors: [1, n])
  quant::WeightFormat format = quant::WeightFormat::kNone;  // kLinear (kEngramRows for tables)
  // Destinations in DeviceModelWeights (stable addresses: the layer vectors are sized first).
  cuda::DeviceWeight* weight = nullptr;  // kLinear
  DeviceVec* vec = nullptr;              // kVec, kOmega
  const uint8_t** data = nullptr;        // kEmbed, kEngramTable
  const uint8_t** scale = nullptr;       // kEngramTable
  // Host sources (safetensors path; null on the dummy path).
  const uint8_t* host_data = nullptr;   // mmapped payload
  const uint8_t* host_scale = nullptr;  // mmapped scales
  const std::vector<float>* host_vec = nullptr;

  uint64_t data_bytes() const;   // device bytes of the payload (or the float32 vector)
  uint64_t scale_bytes() const;  // device bytes of the scales (0 when none)
};

// Sizes dw.layers (and each layer's experts) for the config, then lists every weight; with
// vision_config also dw.vision's (the fused wqkv / mlp.w1 matrices and the fused qkv bias as the
// checkpoint stores them); with num_nextn_predict_layers > 0 also dw.dspark's (MODEL_SPEC 3.10.1;
// host sources from dsw). With mw (and vw for the vision tensors) the linear formats and the host
// sources come from the bound checkpoint views; without them (dummy) linears have format kNone and
// the caller sets the tensor contract's format.
std::vector<WeightItem> list_device_weights(const model::ModelConfig& c, const model::LayerSchedule& s,
                                            DeviceModelWeights& dw, const model::ModelWeights* mw,
                                            const model::VisionWeights* vw = nullptr,
                                            const model::DsparkWeights* dsw = nullptr);

}  // namespace ds41::gpu
