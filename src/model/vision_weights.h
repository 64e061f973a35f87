// ds41 model: VisionWeights — the typed view of the vision tower, the aligner and the image
// delimiters (MODEL_SPEC 2.2, 2.5). Matrices stay BF16 in the checkpoint (ops::WeightRef); the
// fused qkv and the fused gate/up matrices are exposed as row slices (q | k | v, each head-major;
// gate | up), so a backend sees plain linears. Biases, norm weights and the three delimiter rows
// are converted to float32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/loader/safetensors.h"
#include "ops/weight_ref.h"

namespace ds41::model {

struct VisionBlockWeights {
  ops::WeightRef wq, wk, wv, wo;  // [D, D] each (slices of attn.wqkv; attn.wo)
  std::vector<float> bq, bk, bv, bo, norm1, norm2;
  std::vector<float> bqkv;  // [3 D] the fused bias as stored (q | k | v; the GPU tower's fused projection)
  ops::WeightRef w_gate, w_up, w2;  // [I, D], [I, D] (slices of mlp.w1), [D, I]
};

struct VisionWeights {
  ops::WeightRef patch_embed;  // [D, 3 * patch^2]
  std::vector<float> patch_bias, norm;
  std::vector<VisionBlockWeights> blocks;
  ops::WeightRef aligner_w1, aligner_w2;  // [H, D * k^2], [H, H]
  std::vector<float> aligner_b1, aligner_b2;
  std::vector<float> image_start, image_end, image_newline;  // [H] each
  std::vector<std::unique_ptr<std::string>> names_;          // backing store of WeightRef::name

  // Every linear weight, for Backend::prepare at load.
  std::vector<const ops::WeightRef*> linears() const;
};

// Binds the vision tensors; only valid for a config with vision_config. Errors list every
// missing or mis-shaped tensor.
Result<std::unique_ptr<VisionWeights>> bind_vision_weights(const Checkpoint& ck, const ModelConfig& c);

}  // namespace ds41::model
