// The image decoder fuzz entry point (issue 16), shared by the libFuzzer target
// (fuzz_image_decode.cpp) and the CI replay test (image_replay/): decode_image on arbitrary bytes
// under small limits, then the reference preprocessing of whatever decodes. Returns "" when every
// invariant holds, else what broke: a rejection without a message, a raster whose size disagrees
// with its dimensions or exceeds the limits, a plan outside the token budget, a padded image of
// the wrong size.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "image/image_decode.h"
#include "image/preprocess.h"

namespace ds41::fuzz {

inline std::string fuzz_image_decode(std::span<const uint8_t> bytes) {
  image::ImageLimits lim;
  lim.max_bytes = 1 << 20;
  lim.max_pixels = 1 << 20;
  auto d = image::decode_image(bytes, lim);
  if (!d.ok()) return d.status().message().empty() ? "rejection without a message" : "";
  const image::RgbImage& im = d->rgb;
  if (im.width <= 0 || im.height <= 0 || im.width * im.height > lim.max_pixels)
    return "decoded size outside the limits";
  if (static_cast<int64_t>(im.rgb.size()) != im.width * im.height * 3)
    return "raster size disagrees with dimensions";
  image::VisionPlanConfig c;  // the public vision set's small budget keeps this fast
  c.min_pixels = 7056;
  c.max_image_tokens = 32;
  auto p = image::prepare_image(im, c);
  if (!p.ok()) return p.status().message().empty() ? "plan rejection without a message" : "";
  if (p->plan.n_tokens > c.max_image_tokens) return "plan over the token budget";
  if (p->resized.width != p->plan.box_w || p->resized.height != p->plan.box_h ||
      static_cast<int64_t>(p->resized.rgb.size()) != p->plan.box_w * p->plan.box_h * 3)
    return "padded image of the wrong size";
  return "";
}

}  // namespace ds41::fuzz
