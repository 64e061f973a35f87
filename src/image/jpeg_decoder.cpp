// ds41 image: JPEG through libjpeg-turbo with the library defaults Pillow uses (islow DCT, fancy
// upsampling). Grey stays one channel; YCbCr comes out as RGB; CMYK/YCCK come out as CMYK
// (inverted when an Adobe marker says so, as Pillow's "CMYK;I") and are converted as Pillow
// converts CMYK to RGB. The APP1 EXIF block is kept for orientation. Errors longjmp back to the
// setjmp frame (read_jpeg), which holds no C++ objects with destructors.
// jpeglib.h first: jerror.h uses its types.
#include <jerror.h>
#include <jpeglib.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "image/raster.h"

namespace ds41::image::detail {
namespace {

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}
void on_message(j_common_ptr) {}
// libjpeg fills a truncated stream with grey and warns; Pillow refuses such a file, and so do we.
void on_emit(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = reinterpret_cast<JpegError*>(cinfo->err);
    std::snprintf(e->message, sizeof(e->message), "truncated (the data ends before the last scan line)");
    std::longjmp(e->jump, 1);
  }
}

struct JpegJob {
  ImageLimits limits;
  Raster* out;
  std::vector<uint8_t>* row;
  char error[256];
  bool limit_hit;
};

bool dimensions_ok(JpegJob* job, int64_t w, int64_t h) {
  Status dims = check_dimensions(w, h, job->limits, "JPEG");
  if (dims.ok()) return true;
  std::snprintf(job->error, sizeof(job->error), "%s", dims.message().c_str());
  job->limit_hit = true;
  return false;
}

void take_exif(jpeg_decompress_struct* cinfo, Raster* out) {
  for (jpeg_saved_marker_ptr m = cinfo->marker_list; m; m = m->next)
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      out->exif.assign(m->data, m->data + m->data_length);
      return;
    }
}

// Pillow's CMYK -> RGB: r = (255 - k) - (255 - k) * c / 255 with its rounded division by 255.
uint8_t cmyk_channel(uint32_t c, uint32_t k) {
  const uint32_t nk = 255 - k;
  uint32_t t = c * nk + 128;
  t = ((t >> 8) + t) >> 8;
  const int32_t v = static_cast<int32_t>(nk) - static_cast<int32_t>(t);
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

bool read_jpeg(jpeg_decompress_struct* cinfo, JpegError* err, const uint8_t* data, size_t size,
               JpegJob* job) {
  if (setjmp(err->jump)) {
    std::snprintf(job->error, sizeof(job->error), "%s", err->message);
    return false;
  }
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(cinfo, TRUE);
  if (!dimensions_ok(job, cinfo->image_width, cinfo->image_height)) return false;
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  const bool grey = cinfo->jpeg_color_space == JCS_GRAYSCALE;
  cinfo->out_color_space = cmyk ? JCS_CMYK : (grey ? JCS_GRAYSCALE : JCS_RGB);
  jpeg_start_decompress(cinfo);
  const int64_t w = cinfo->output_width, h = cinfo->output_height;
  const int comps = cinfo->output_components;
  if (comps != (cmyk ? 4 : (grey ? 1 : 3))) {
    std::snprintf(job->error, sizeof(job->error), "unsupported component count %d", comps);
    return false;
  }
  take_exif(cinfo, job->out);
  const bool invert = cmyk && cinfo->saw_Adobe_marker;
  job->out->width = w;
  job->out->height = h;
  job->out->channels = cmyk ? 3 : comps;
  job->out->data.resize(static_cast<size_t>(w * h * job->out->channels));
  job->row->resize(static_cast<size_t>(w * comps));
  while (cinfo->output_scanline < cinfo->output_height) {
    const int64_t y = cinfo->output_scanline;
    if (!cmyk) {
      JSAMPROW dst = job->out->data.data() + y * w * comps;
      jpeg_read_scanlines(cinfo, &dst, 1);
      continue;
    }
    JSAMPROW dst = job->row->data();
    jpeg_read_scanlines(cinfo, &dst, 1);
    uint8_t* o = job->out->data.data() + y * w * 3;
    for (int64_t x = 0; x < w; ++x) {
      uint8_t p[4];
      for (int c = 0; c < 4; ++c) p[c] = invert ? 255 - dst[x * 4 + c] : dst[x * 4 + c];
      for (int c = 0; c < 3; ++c) o[x * 3 + c] = cmyk_channel(p[c], p[3]);
    }
  }
  jpeg_finish_decompress(cinfo);
  return true;
}

}  // namespace

Result<Raster> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  Raster out;
  std::vector<uint8_t> row;
  JpegJob job{limits, &out, &row, {0}, false};
  jpeg_decompress_struct cinfo;
  JpegError err;
  std::memset(&cinfo, 0, sizeof(cinfo));
  err.message[0] = 0;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_error;
  err.mgr.output_message = on_message;
  err.mgr.emit_message = on_emit;
  const bool ok = read_jpeg(&cinfo, &err, bytes.data(), bytes.size(), &job);
  jpeg_destroy_decompress(&cinfo);
  if (!ok) {
    if (job.limit_hit) return resource_exhausted(job.error);
    return invalid_argument(std::string("corrupt JPEG image: ") +
                            (job.error[0] ? job.error : "decoder failed"));
  }
  return out;
}

}  // namespace ds41::image::detail
