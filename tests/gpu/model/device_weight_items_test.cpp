// gpu::list_device_weights (the device weight list both loaders fill) against the tensor contract
// (MODEL_SPEC 2), on the host (runs without a GPU): every item is a contract tensor with the
// contract's format, every contract tensor of the text model and of the vision tower (MODEL_SPEC
// 2.5) and of the DSpark stages (MODEL_SPEC 3.10.1) is an item, and the checkpoint-format bytes the device holds equal the contract's payload
// less the small vectors (stored as float32 on the device) — for tiny, tiny-vision, the slice and
// the full released layout.
#include "gpu/device_weight_items.h"

#include <gtest/gtest.h>

#include <set>

#include "gpu/dummy_weights.h"
#include "model/presets.h"

namespace ds41::gpu {
namespace {

TEST(DeviceWeightItems, CoverTheTextModelsAndVisionTowersContract) {
  for (const char* preset : {"tiny", "tiny-vision", "v41-flash-slice", "v41-flash"}) {
    SCOPED_TRACE(preset);
    auto c = model::preset_config(preset);
    ASSERT_TRUE(c.ok());
    auto s = model::derive_layer_schedule(*c);
    ASSERT_TRUE(s.ok());
    auto k = model::derive_tensor_contract(*c, *s);
    ASSERT_TRUE(k.ok());
    DeviceModelWeights dw;
    std::vector<WeightItem> items = list_device_weights(*c, *s, dw, nullptr);
    Status st = apply_contract_formats(*k, items);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(dw.layers.size(), static_cast<size_t>(c->num_hidden_layers));
    EXPECT_EQ(dw.layers[0].experts.size(), static_cast<size_t>(c->n_routed_experts));
    // Contract tensors the items stand for.
    std::set<std::string> covered;
    uint64_t quantized = 0;
    for (const WeightItem& it : items) {
      switch (it.kind) {
        case WeightItemKind::kLinear:
          ASSERT_NE(it.format, quant::WeightFormat::kNone) << it.name;
          covered.insert(it.name + ".weight");
          if (it.scale_bytes()) covered.insert(it.name + ".scale");
          quantized += it.data_bytes() + it.scale_bytes();
          break;
        case WeightItemKind::kEngramTable:
          covered.insert(it.name + ".weight");
          covered.insert(it.name + ".scale");
          quantized += it.data_bytes() + it.scale_bytes();
          break;
        case WeightItemKind::kEmbed:
          covered.insert(it.name);
          quantized += it.data_bytes();
          break;
        case WeightItemKind::kVec: covered.insert(it.name); break;
        case WeightItemKind::kOmega:
          covered.insert(it.name + "q_weight");
          covered.insert(it.name + "k_weight");
          break;
      }
    }
    uint64_t text_payload = 0, vec_payload = 0, dspark_payload = 0;
    for (const model::ExpectedTensor& t : k->tensors) {
      const bool text = t.name.rfind("layers.", 0) == 0 || t.name == "embed.weight" ||
                        t.name == "head.weight" || t.name == "norm.weight";
      const bool vision = t.name.rfind("vision.", 0) == 0 || t.name.rfind("aligner.", 0) == 0 ||
                          t.name.rfind("image_", 0) == 0;
      const bool dspark = t.name.rfind("mtp.", 0) == 0;
      if (!text && !vision && !dspark) continue;
      if (vision) {
        EXPECT_TRUE(c->has_vision) << t.name;
      }
      if (dspark) {
        EXPECT_GT(c->num_nextn_predict_layers, 0) << t.name;
      }
      EXPECT_TRUE(covered.count(t.name)) << t.name << " has no device item";
      (dspark ? dspark_payload : text_payload) += t.nbytes();
      if (t.shape.size() == 1 || t.name.find("hc_") != std::string::npos ||
          t.name.find("engram.q_weight") != std::string::npos ||
          t.name.find("engram.k_weight") != std::string::npos)
        vec_payload += t.nbytes();
    }
    EXPECT_EQ(covered.size(), [&] {
      size_t n = 0;
      for (const auto& t : k->tensors) n += covered.count(t.name);
      return n;
    }()) << "an item names a tensor the contract lacks";
    EXPECT_EQ(quantized, text_payload + dspark_payload - vec_payload);
    EXPECT_EQ(dw.dspark.has_value(), c->num_nextn_predict_layers > 0);
    if (dw.dspark) {
      EXPECT_EQ(dw.dspark->stages.size(), static_cast<size_t>(c->num_nextn_predict_layers));
      EXPECT_EQ(dw.dspark->stages[0].experts.size(), static_cast<size_t>(c->dspark_n_routed_experts));
    }
    if (std::string(preset) == "v41-flash-slice") {
      EXPECT_EQ(text_payload, 64'649'508'208ULL);
    }
  }
}

}  // namespace
}  // namespace ds41::gpu
