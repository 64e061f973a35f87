// ds41 image: raster -> RGB the way the reference's processor converts (transformers'
// convert_to_rgb): image.convert("RGBA") (grey replicated), then Pillow's alpha_composite over an
// opaque white background, then the alpha dropped.
#include <cstdint>

#include "image/raster.h"

namespace ds41::image::detail {
namespace {

// Pillow's integer source-over blend with an opaque destination d: 7 extra bits of precision,
// divisions by 255 done as ((v >> 8) + v) >> 8 after adding half. A fully transparent source
// leaves the destination.
uint8_t over_opaque(uint32_t s, uint32_t a, uint32_t d) {
  if (a == 0) return static_cast<uint8_t>(d);
  constexpr uint32_t kBits = 7;
  const uint32_t out_a255 = a * 255 + 255 * (255 - a);  // = 255 * 255
  const uint32_t coef1 = a * 255 * 255 * (1u << kBits) / out_a255;
  const uint32_t coef2 = 255 * (1u << kBits) - coef1;
  uint32_t v = s * coef1 + d * coef2 + (0x80u << kBits);
  v = ((v >> 8) + v) >> 8;
  return static_cast<uint8_t>(v >> kBits);
}

}  // namespace

RgbImage raster_to_rgb(const Raster& r) {
  RgbImage o;
  o.width = r.width;
  o.height = r.height;
  const int64_t n = r.width * r.height;
  o.rgb.resize(static_cast<size_t>(n * 3));
  constexpr uint32_t kWhite = 255;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = &r.data[static_cast<size_t>(i * r.channels)];
    uint8_t* q = &o.rgb[static_cast<size_t>(i * 3)];
    switch (r.channels) {
      case 1: q[0] = q[1] = q[2] = p[0]; break;
      case 2: q[0] = q[1] = q[2] = over_opaque(p[0], p[1], kWhite); break;
      case 3: q[0] = p[0], q[1] = p[1], q[2] = p[2]; break;
      default:
        for (int c = 0; c < 3; ++c) q[c] = over_opaque(p[c], p[3], kWhite);
        break;
    }
  }
  return o;
}

}  // namespace ds41::image::detail
