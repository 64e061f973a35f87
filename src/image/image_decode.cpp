// ds41 image: format sniffing, dispatch to the per-format decoder, RGB conversion, orientation.
#include "image/image_decode.h"

#include <cstring>
#include <fstream>

#include "image/raster.h"

namespace ds41::image {

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kGif: return "GIF";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  auto starts = [&](const char* m, size_t n, size_t at = 0) {
    return b.size() >= at + n && std::memcmp(b.data() + at, m, n) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (starts("\xff\xd8\xff", 3)) return ImageFormat::kJpeg;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return ImageFormat::kWebp;
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return ImageFormat::kGif;
  return ImageFormat::kUnknown;
}

namespace detail {

Status check_dimensions(int64_t w, int64_t h, const ImageLimits& limits, const char* format) {
  if (w <= 0 || h <= 0)
    return invalid_argument(std::string(format) + " image has an empty size " + std::to_string(w) + "x" +
                            std::to_string(h));
  if (w > limits.max_pixels || h > limits.max_pixels || w * h > limits.max_pixels)
    return resource_exhausted(std::string(format) + " image is " + std::to_string(w) + "x" +
                              std::to_string(h) + " = " + std::to_string(w * h) +
                              " pixels, over the limit of " + std::to_string(limits.max_pixels) + " pixels");
  return ok_status();
}

}  // namespace detail

Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  if (bytes.empty()) return invalid_argument("image is empty (0 bytes)");
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes)
    return resource_exhausted("image is " + std::to_string(bytes.size()) + " bytes, over the limit of " +
                              std::to_string(limits.max_bytes) + " bytes");
  DecodedImage out;
  out.format = sniff_image_format(bytes);
  Result<detail::Raster> r = invalid_argument("");
  switch (out.format) {
    case ImageFormat::kPng: r = detail::decode_png(bytes, limits); break;
    case ImageFormat::kJpeg: r = detail::decode_jpeg(bytes, limits); break;
    case ImageFormat::kWebp: r = detail::decode_webp(bytes, limits); break;
    case ImageFormat::kGif: r = detail::decode_gif(bytes, limits); break;
    case ImageFormat::kUnknown:
      return invalid_argument("not a supported image: the bytes are not PNG, JPEG, WebP or GIF");
  }
  if (!r.ok()) return r.status();
  const detail::Raster& raster = r.value();
  out.had_alpha = raster.channels == 2 || raster.channels == 4;
  out.exif_orientation = raster.exif.empty() ? 1 : detail::exif_orientation(raster.exif);
  out.rgb = detail::apply_orientation(detail::raster_to_rgb(raster), out.exif_orientation);
  return out;
}

Result<DecodedImage> decode_image_file(const std::string& path, const ImageLimits& limits) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return not_found("cannot open image " + path);
  const std::streamoff size = f.tellg();
  if (size < 0) return io_error("cannot read image " + path);
  if (size > limits.max_bytes)
    return resource_exhausted("image " + path + " is " + std::to_string(size) + " bytes, over the limit of " +
                              std::to_string(limits.max_bytes) + " bytes");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  f.seekg(0);
  if (size > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), size))
    return io_error("cannot read image " + path);
  Result<DecodedImage> d = decode_image(bytes, limits);
  if (!d.ok()) return d.status().with_context(path);
  return d;
}

}  // namespace ds41::image
