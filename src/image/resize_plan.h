// ds41 image: the resize plan of MODEL_SPEC 3.11 — min-pixel upscale, sides rounded up to whole
// patches, the closed-form token-budget shrink — and the aspect fit + centre pad inside the box.
// Evaluated in IEEE double in the reference's (Python's) operation order with Python's
// half-to-even round: the golden README shows sizes whose box changes under any other order.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace ds41::image {

// The preprocessing half of vision_config (MODEL_SPEC 1.4). max_wh_ratio 0 = none (null).
struct VisionPlanConfig {
  int64_t patch_size = 14;
  int64_t downsample_ratio = 3;
  int64_t min_pixels = 295936;
  int64_t max_image_tokens = 1024;
  int64_t max_wh_ratio = 0;
};

// The golden array image{k}.plan (int32[13]) in this field order.
struct ImagePlan {
  int64_t orig_w = 0, orig_h = 0;  // decoded (oriented) size
  int64_t up_w = 0, up_h = 0;      // after the optional min-pixel upscale (and the w/h cap)
  int64_t box_h = 0, box_w = 0;    // the planned pixel size (multiples of patch_size)
  int64_t fit_h = 0, fit_w = 0;    // the aspect-preserving resize inside the box
  int64_t pad_top = 0, pad_left = 0;
  int64_t n_llm_h = 0, n_llm_w = 0;  // the aligner's token grid
  int64_t n_tokens = 0;              // n_llm_h * (n_llm_w + 1) + 2 span positions
  bool squeeze = false;              // max_wh_ratio branch: resized to the box, no pad

  int64_t n_vit_h(int64_t patch) const { return box_h / patch; }
  int64_t n_vit_w(int64_t patch) const { return box_w / patch; }
};

// Span positions of an image whose aligner grid is n_h x n_w (MODEL_SPEC 3.11).
inline int64_t image_span_tokens(int64_t n_llm_h, int64_t n_llm_w) { return n_llm_h * (n_llm_w + 1) + 2; }

// The plan for an image of width x height. Errors: non-positive sizes or config, a plan that
// cannot fit max_image_tokens, or a fit that would collapse a side to 0 pixels (an aspect ratio
// beyond what the token budget can hold; the reference fails there too).
Result<ImagePlan> plan_image(int64_t width, int64_t height, const VisionPlanConfig& cfg);

// Python's round() of a double (half to even), as an integer.
int64_t round_half_even(double x);

}  // namespace ds41::image
