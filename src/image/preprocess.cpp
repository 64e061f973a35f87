// ds41 image: plan -> bicubic fit -> centre pad -> patches (see preprocess.h).
#include "image/preprocess.h"

#include <cstring>

#include "image/bicubic_resize.h"

namespace ds41::image {

Result<PreparedImage> prepare_image(const RgbImage& rgb, const VisionPlanConfig& cfg) {
  DS41_ASSIGN_OR_RETURN(ImagePlan plan, plan_image(rgb.width, rgb.height, cfg));
  PreparedImage p;
  p.plan = plan;
  RgbImage fit = resize_bicubic_u8(rgb, plan.fit_w, plan.fit_h);
  RgbImage& out = p.resized;
  out.width = plan.box_w;
  out.height = plan.box_h;
  out.rgb.assign(static_cast<size_t>(plan.box_w * plan.box_h * 3), kPadValue);
  for (int64_t y = 0; y < plan.fit_h; ++y)
    std::memcpy(&out.rgb[static_cast<size_t>(((y + plan.pad_top) * plan.box_w + plan.pad_left) * 3)],
                &fit.rgb[static_cast<size_t>(y * plan.fit_w * 3)], static_cast<size_t>(plan.fit_w * 3));
  return p;
}

std::vector<float> image_patches(const RgbImage& img, int64_t ps) {
  const int64_t gh = img.height / ps, gw = img.width / ps, dim = 3 * ps * ps;
  // The reference's rescale factor is 1/255 as a Python float (double); the product is stored
  // as float32 before the float32 normalisation.
  const double rescale = 1.0 / 255.0;
  float lut[256];
  for (int v = 0; v < 256; ++v) {
    const float x = static_cast<float>(static_cast<double>(v) * rescale);
    lut[v] = (x - 0.5f) / 0.5f;
  }
  std::vector<float> out(static_cast<size_t>(gh * gw * dim));
  for (int64_t py = 0; py < gh; ++py)
    for (int64_t px = 0; px < gw; ++px) {
      float* o = &out[static_cast<size_t>((py * gw + px) * dim)];
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t r = 0; r < ps; ++r)
          for (int64_t q = 0; q < ps; ++q)
            o[(c * ps + r) * ps + q] =
                lut[img.rgb[static_cast<size_t>(((py * ps + r) * img.width + px * ps + q) * 3 + c)]];
    }
  return out;
}

}  // namespace ds41::image
