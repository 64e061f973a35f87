// ds41 model: from encoded image bytes to text-stream span embeddings — decode and preprocess
// (ds41_image, with the model's vision_config), one batched tower run (VisionTower), span rows
// (vision_span.h). Shared by `ds41 score`, `ds41 generate --image` and the server's vision path.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "image/image_types.h"
#include "image/preprocess.h"
#include "model/model.h"
#include "model/vision_span.h"
#include "model/vision_tower.h"

namespace ds41::model {

// The preprocessing half of the model's vision_config (MODEL_SPEC 1.4, 3.11).
image::VisionPlanConfig vision_plan_config(const ModelConfig& c);

// Decode + preprocess one image for this model. Errors name the problem (format, corrupt data,
// limits, an image the plan cannot fit).
Result<image::PreparedImage> prepare_image_bytes(std::span<const uint8_t> bytes, const ModelConfig& c,
                                                 const image::ImageLimits& limits);

struct EncodedImage {
  image::ImagePlan plan;
  std::vector<float> pixel_values;  // [patches, 3 * patch^2] (only with keep_intermediates)
  std::vector<float> vit_out;       // [patches, D] (only with keep_intermediates)
  std::vector<float> aligner_out;   // [n_llm_h * n_llm_w, hidden]
  std::vector<float> span_embeds;   // [plan.n_tokens, hidden]
};

// Runs the tower once over all images (one batch). Requires a model with vision_config.
Result<std::vector<EncodedImage>> encode_images(const Model& m, std::span<const image::PreparedImage> images,
                                                bool keep_intermediates = false);

// The engine-independent half of encode_images, shared with the GPU engine: the patches of each
// image, one call of `tower` (a VisionTower::encode or its device twin) over all of them, the
// check that the tower's token grid is the plan's, and the span rows from `markers`.
using VisionTowerFn = std::function<Result<std::vector<VisionImageOutput>>(
    std::span<const VisionImageInput> images, bool keep_vit_out)>;
Result<std::vector<EncodedImage>> encode_prepared_images(const ModelConfig& c, const VisionTowerFn& tower,
                                                         const ImageSpanMarkers& markers,
                                                         std::span<const image::PreparedImage* const> images,
                                                         bool keep_intermediates = false);

}  // namespace ds41::model
