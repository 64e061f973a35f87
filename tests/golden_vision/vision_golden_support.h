// Test support for the vision goldens: paths of the public vision set and its arrays.
#pragma once

#include <string>

#include "golden/golden_arrays.h"
#include "image/resize_plan.h"

namespace ds41::testing {

inline std::string vision_dir() { return std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-vision-public"; }
inline std::string vision_image_path(int k) {
  return vision_dir() + "/images/image" + std::to_string(k) + ".png";
}
inline constexpr int kVisionImages = 6;

// vision_config of the public set (golden README "Files").
inline image::VisionPlanConfig vision_plan_config() {
  image::VisionPlanConfig c;
  c.min_pixels = 7056;
  c.max_image_tokens = 32;
  return c;
}

}  // namespace ds41::testing
