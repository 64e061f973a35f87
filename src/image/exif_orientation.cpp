// ds41 image: the EXIF orientation tag and PIL ImageOps.exif_transpose's transforms. Only IFD0's
// tag 0x0112 is read: a bounds-checked walk of the TIFF header (either byte order); anything
// malformed means "no orientation" (1), never an error, as a viewer would show the image.
#include <cstring>

#include "image/raster.h"

namespace ds41::image::detail {

int exif_orientation(std::span<const uint8_t> b) {
  if (b.size() >= 6 && std::memcmp(b.data(), "Exif\0\0", 6) == 0) b = b.subspan(6);
  if (b.size() < 8) return 1;
  bool le;
  if (b[0] == 'I' && b[1] == 'I')
    le = true;
  else if (b[0] == 'M' && b[1] == 'M')
    le = false;
  else
    return 1;
  auto u16 = [&](size_t at) -> uint32_t {
    return le ? (b[at] | (b[at + 1] << 8)) : ((b[at] << 8) | b[at + 1]);
  };
  auto u32 = [&](size_t at) -> uint64_t {
    return le ? (uint64_t{b[at]} | (uint64_t{b[at + 1]} << 8) | (uint64_t{b[at + 2]} << 16) |
                 (uint64_t{b[at + 3]} << 24))
              : ((uint64_t{b[at]} << 24) | (uint64_t{b[at + 1]} << 16) | (uint64_t{b[at + 2]} << 8) |
                 uint64_t{b[at + 3]});
  };
  if (u16(2) != 42) return 1;
  const uint64_t ifd = u32(4);
  if (ifd + 2 > b.size()) return 1;
  const uint32_t count = u16(ifd);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t e = ifd + 2 + 12ull * i;
    if (e + 12 > b.size()) return 1;
    if (u16(e) != 0x0112) continue;
    if (u16(e + 2) != 3 || u32(e + 4) < 1) return 1;  // SHORT, at least one value
    const uint32_t v = u16(e + 8);
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

RgbImage apply_orientation(RgbImage img, int orientation) {
  if (orientation <= 1 || orientation > 8) return img;
  const int64_t w = img.width, h = img.height;
  const bool swap = orientation >= 5;  // transpose-family: output is h x w
  RgbImage o;
  o.width = swap ? h : w;
  o.height = swap ? w : h;
  o.rgb.resize(img.rgb.size());
  for (int64_t y = 0; y < o.height; ++y)
    for (int64_t x = 0; x < o.width; ++x) {
      int64_t sx = x, sy = y;  // source pixel of output (x, y)
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                  // FLIP_LEFT_RIGHT
        case 3: sx = w - 1 - x, sy = h - 1 - y; break;  // ROTATE_180
        case 4: sy = h - 1 - y; break;                  // FLIP_TOP_BOTTOM
        case 5: sx = y, sy = x; break;                  // TRANSPOSE
        case 6: sx = y, sy = h - 1 - x; break;          // ROTATE_270 (clockwise 90)
        case 7: sx = w - 1 - y, sy = h - 1 - x; break;  // TRANSVERSE
        case 8: sx = w - 1 - y, sy = x; break;          // ROTATE_90 (counter-clockwise)
      }
      std::memcpy(&o.rgb[static_cast<size_t>((y * o.width + x) * 3)],
                  &img.rgb[static_cast<size_t>((sy * w + sx) * 3)], 3);
    }
  return o;
}

}  // namespace ds41::image::detail
