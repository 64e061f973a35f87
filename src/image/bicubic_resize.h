// ds41 image: 8-bit bicubic resize, bit for bit what the reference's image processor gets from
// Pillow's Image.resize(size, BICUBIC) on an RGB image (golden README "Preprocessing: exact
// arithmetic" step 3): a = -0.5, the support widened by the scale when downscaling, per-output
// weights normalised in double then converted to 22-bit fixed point, a horizontal pass then a
// vertical pass, each rounded and clipped to uint8. Other resamplers (torchvision's included)
// differ by 1-2 levels.
#pragma once

#include <cstdint>

#include "image/image_types.h"

namespace ds41::image {

// Resizes src to out_w x out_h (both > 0). Same size: a copy (Pillow returns a copy too). A pass
// whose size does not change is skipped, as Pillow skips it.
RgbImage resize_bicubic_u8(const RgbImage& src, int64_t out_w, int64_t out_h);

}  // namespace ds41::image
