// ds41 image: PNG through libpng (Debian libpng16). Transforms chosen to give what Pillow loads:
// palette and low-bit grey expanded to 8 bits, tRNS turned into alpha, 16-bit samples reduced to
// their high byte (Pillow's RGB;16B unpacking), no gamma correction (Pillow applies none).
// libpng reports errors by longjmp: the setjmp frame (read_png) holds no C++ objects with
// destructors, and everything it fills lives in the caller's frame.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "image/raster.h"

namespace ds41::image::detail {
namespace {

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
};

struct PngJob {
  PngSource src;
  ImageLimits limits;
  Raster* out;
  char error[256];
  bool limit_hit;
  std::vector<png_bytep>* rows;
};

void on_error(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, sizeof(job->error), "%s", msg);
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}

void on_read(png_structp png, png_bytep dst, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (job->src.size - job->src.pos < n) png_error(png, "truncated (the data ends inside a chunk)");
  std::memcpy(dst, job->src.data + job->src.pos, n);
  job->src.pos += n;
}

void take_exif(png_structp png, png_infop info, Raster* out) {
  png_uint_32 n = 0;
  png_bytep exif = nullptr;
  if (png_get_eXIf_1(png, info, &n, &exif) && exif && n > 0 && out->exif.empty())
    out->exif.assign(exif, exif + n);
}

// The limits check, outside read_png's frame (no destructors may be skipped by longjmp there).
bool dimensions_ok(PngJob* job, png_uint_32 w, png_uint_32 h) {
  Status dims = check_dimensions(w, h, job->limits, "PNG");
  if (dims.ok()) return true;
  std::snprintf(job->error, sizeof(job->error), "%s", dims.message().c_str());
  job->limit_hit = true;
  return false;
}

// Returns false with job->error set on failure.
bool read_png(png_structp png, png_infop info, png_infop end, PngJob* job) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_user_limits(png, 0x7fffffffL, 0x7fffffffL);
  png_set_chunk_malloc_max(png, 8u << 20);
  png_set_read_fn(png, job, on_read);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  if (!dimensions_ok(job, w, h)) return false;
  const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
  if (depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int ch = png_get_channels(png, info);
  if (ch < 1 || ch > 4 || png_get_bit_depth(png, info) != 8) png_error(png, "unsupported pixel layout");
  take_exif(png, info, job->out);
  job->out->width = w;
  job->out->height = h;
  job->out->channels = ch;
  job->out->data.resize(static_cast<size_t>(w) * h * ch);
  job->rows->resize(h);
  for (png_uint_32 y = 0; y < h; ++y)
    (*job->rows)[y] = job->out->data.data() + static_cast<size_t>(y) * w * ch;
  png_read_image(png, job->rows->data());
  png_read_end(png, end);
  take_exif(png, end, job->out);
  return true;
}

}  // namespace

Result<Raster> decode_png(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  Raster out;
  std::vector<png_bytep> rows;
  PngJob job{{bytes.data(), bytes.size(), 0}, limits, &out, {0}, false, &rows};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, on_error, on_warning);
  if (!png) return internal_error("PNG: cannot create a decoder");
  png_infop info = png_create_info_struct(png);
  png_infop end = png_create_info_struct(png);
  const bool ok = info && end && read_png(png, info, end, &job);
  png_destroy_read_struct(&png, info ? &info : nullptr, end ? &end : nullptr);
  if (!ok) {
    if (job.limit_hit) return resource_exhausted(job.error);
    return invalid_argument(std::string("corrupt PNG image: ") +
                            (job.error[0] ? job.error : "decoder failed"));
  }
  return out;
}

}  // namespace ds41::image::detail
