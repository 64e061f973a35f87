// ds41 image: decoding entry points — encoded bytes (PNG, JPEG, WebP, GIF first frame; the
// format is sniffed from the magic bytes) to an oriented 8-bit RGB image, as the reference
// loads images (EXIF orientation applied; palette, grey and alpha converted to RGB, alpha over
// white). Every failure is a Status naming the format and the problem (truncated, corrupt,
// unsupported, over a limit); no input crashes (tests/fuzz/fuzz_image_decode.cpp).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "image/image_types.h"

namespace ds41::image {

ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

struct DecodedImage {
  RgbImage rgb;  // oriented
  ImageFormat format = ImageFormat::kUnknown;
  int exif_orientation = 1;
  bool had_alpha = false;
};

Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits = {});

// Reads a file (bounded by limits.max_bytes) and decodes it; errors name the path.
Result<DecodedImage> decode_image_file(const std::string& path, const ImageLimits& limits = {});

}  // namespace ds41::image
