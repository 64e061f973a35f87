// ds41 image: WebP through libwebp (Debian libwebp7 + libwebpdemux2): still images decode
// directly (RGB, or RGBA when the file has alpha); animated ones through WebPAnimDecoder, first
// frame on its canvas. The EXIF chunk is read through the demuxer.
#include <webp/decode.h>
#include <webp/demux.h>

#include <string>

#include "image/raster.h"

namespace ds41::image::detail {

Result<Raster> decode_webp(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(bytes.data(), bytes.size(), &f);
  if (st == VP8_STATUS_NOT_ENOUGH_DATA) return invalid_argument("corrupt WebP image: truncated header");
  if (st != VP8_STATUS_OK)
    return invalid_argument("corrupt WebP image: bad header (libwebp status " + std::to_string(st) + ")");
  DS41_RETURN_IF_ERROR(check_dimensions(f.width, f.height, limits, "WebP"));
  Raster out;
  WebPData wd{bytes.data(), bytes.size()};
  if (WebPDemuxer* dmux = WebPDemux(&wd)) {
    WebPChunkIterator it;
    if (WebPDemuxGetI(dmux, WEBP_FF_FORMAT_FLAGS) & EXIF_FLAG && WebPDemuxGetChunk(dmux, "EXIF", 1, &it)) {
      out.exif.assign(it.chunk.bytes, it.chunk.bytes + it.chunk.size);
      WebPDemuxReleaseChunkIterator(&it);
    }
    WebPDemuxDelete(dmux);
  }
  if (f.has_animation) {
    WebPAnimDecoderOptions o;
    if (!WebPAnimDecoderOptionsInit(&o)) return internal_error("WebP: cannot set up the animation decoder");
    o.color_mode = MODE_RGBA;
    o.use_threads = 0;
    WebPAnimDecoder* dec = WebPAnimDecoderNew(&wd, &o);
    if (!dec) return invalid_argument("corrupt WebP image: bad animation container");
    WebPAnimInfo info;
    uint8_t* buf = nullptr;
    int ts = 0;
    Status s = ok_status();
    if (!WebPAnimDecoderGetInfo(dec, &info)) s = invalid_argument("corrupt WebP image: bad animation header");
    if (s.ok()) s = check_dimensions(info.canvas_width, info.canvas_height, limits, "WebP");
    if (s.ok() && !WebPAnimDecoderGetNext(dec, &buf, &ts))
      s = invalid_argument("corrupt WebP image: first frame does not decode");
    if (s.ok()) {
      out.width = info.canvas_width;
      out.height = info.canvas_height;
      out.channels = 4;
      out.data.assign(buf, buf + static_cast<size_t>(out.width * out.height * 4));
    }
    WebPAnimDecoderDelete(dec);
    if (!s.ok()) return s;
    return out;
  }
  out.width = f.width;
  out.height = f.height;
  out.channels = f.has_alpha ? 4 : 3;
  out.data.resize(static_cast<size_t>(out.width * out.height * out.channels));
  const int stride = static_cast<int>(out.width * out.channels);
  const uint8_t* r =
      f.has_alpha ? WebPDecodeRGBAInto(bytes.data(), bytes.size(), out.data.data(), out.data.size(), stride)
                  : WebPDecodeRGBInto(bytes.data(), bytes.size(), out.data.data(), out.data.size(), stride);
  if (!r) return invalid_argument("corrupt WebP image: the bitstream does not decode (truncated or damaged)");
  return out;
}

}  // namespace ds41::image::detail
