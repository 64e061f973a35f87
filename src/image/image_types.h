// ds41 image: the value types shared by decoding and preprocessing — an 8-bit RGB raster and the
// limits every decoder entry point enforces before it allocates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds41::image {

// Interleaved 8-bit RGB, row-major: rgb[(y * width + x) * 3 + c].
struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// Limits checked before any pixel buffer is allocated (an attacker-sized header never reaches
// malloc). Defaults suit the API; the CLI and the server expose both as flags.
struct ImageLimits {
  int64_t max_bytes = 20ll << 20;           // encoded size
  int64_t max_pixels = 40ll * 1000 * 1000;  // width * height of the decoded raster (first frame)
};

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif };
const char* image_format_name(ImageFormat f);

}  // namespace ds41::image
