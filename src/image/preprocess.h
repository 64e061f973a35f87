// ds41 image: the reference's preprocessing after decoding (MODEL_SPEC 3.11, golden README
// "Preprocessing: exact arithmetic" steps 2-6): plan, Pillow-exact bicubic fit, centre pad with
// 127, rescale + normalise, 14x14 patches flattened channel-major.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "image/image_types.h"
#include "image/resize_plan.h"

namespace ds41::image {

// One image ready for the tower: its plan and the resized, padded uint8 image (the golden's
// image{k}.resized_u8, [box_h, box_w, 3]).
struct PreparedImage {
  ImagePlan plan;
  RgbImage resized;  // box_w x box_h
};

// The constant the reference pads with (grey).
inline constexpr uint8_t kPadValue = 127;

Result<PreparedImage> prepare_image(const RgbImage& rgb, const VisionPlanConfig& cfg);

// Patches of a prepared image: [n_vit_h * n_vit_w, 3 * patch * patch] float32, row-major patch
// order, each flattened (c, row, col); values float32(u8 * (1/255 in double)), then
// (x - 0.5f) / 0.5f in float32 (mean = std = 0.5).
std::vector<float> image_patches(const RgbImage& resized, int64_t patch_size);

}  // namespace ds41::image
