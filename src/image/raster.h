// ds41 image (internal): what a format decoder hands back before RGB conversion and orientation —
// a raster of 1 (grey), 2 (grey + alpha), 3 (RGB) or 4 (RGBA) 8-bit channels and the image's
// EXIF block, if any. The per-format decoders live in one file each (png_decoder.cpp, ...).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "image/image_types.h"

namespace ds41::image::detail {

struct Raster {
  int64_t width = 0, height = 0;
  int channels = 0;
  std::vector<uint8_t> data;  // [height, width, channels]
  std::vector<uint8_t> exif;  // TIFF block, with or without the "Exif\0\0" prefix
};

// The dimension check every decoder runs right after reading the header, before allocating.
Status check_dimensions(int64_t width, int64_t height, const ImageLimits& limits, const char* format);

Result<Raster> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Raster> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Raster> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits);
Result<Raster> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits);

// To RGB as the reference's processor does it (transformers convert_to_rgb: grey replicated,
// alpha composited over opaque white with Pillow's alpha_composite integer arithmetic).
RgbImage raster_to_rgb(const Raster& r);

// EXIF orientation tag (0x0112) of IFD0: 1..8, or 1 when absent or malformed.
int exif_orientation(std::span<const uint8_t> exif);
// PIL ImageOps.exif_transpose's transform for an orientation value.
RgbImage apply_orientation(RgbImage img, int orientation);

}  // namespace ds41::image::detail
