// ds41 image: GIF first frame through giflib (Debian libgif7). The raster is the logical screen;
// the first frame is drawn at its offset (clipped to the screen). Pixels outside the frame, and
// the frame's transparent index, are transparent when the frame declares a transparent index
// (they become white after RGB conversion), otherwise the colour of palette entry 0. Only the
// first frame is read: later frames are never decoded (a many-frame file costs nothing extra).
#include <gif_lib.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "image/raster.h"

namespace ds41::image::detail {
namespace {

struct GifSource {
  const uint8_t* data;
  size_t size, pos;
};

int on_read(GifFileType* gif, GifByteType* dst, int n) {
  auto* s = static_cast<GifSource*>(gif->UserData);
  const size_t take = std::min(static_cast<size_t>(n < 0 ? 0 : n), s->size - s->pos);
  std::memcpy(dst, s->data + s->pos, take);
  s->pos += take;
  return static_cast<int>(take);
}

Status gif_error(const char* what, int code) {
  const char* m = GifErrorString(code);
  return invalid_argument(std::string("corrupt GIF image: ") + what + " (" + (m ? m : "unknown error") + ")");
}

}  // namespace

Result<Raster> decode_gif(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  GifSource src{bytes.data(), bytes.size(), 0};
  int err = 0;
  GifFileType* gif = DGifOpen(&src, on_read, &err);
  if (!gif) return gif_error("bad header", err);
  struct Closer {
    GifFileType* g;
    ~Closer() {
      int e;
      DGifCloseFile(g, &e);
    }
  } closer{gif};
  DS41_RETURN_IF_ERROR(check_dimensions(gif->SWidth, gif->SHeight, limits, "GIF"));
  int transparent = -1;
  for (;;) {
    GifRecordType rec;
    if (DGifGetRecordType(gif, &rec) == GIF_ERROR) return gif_error("bad record", gif->Error);
    if (rec == TERMINATE_RECORD_TYPE) return invalid_argument("corrupt GIF image: no frame");
    if (rec == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) return gif_error("bad extension", gif->Error);
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return gif_error("bad extension", gif->Error);
      }
      continue;
    }
    if (rec != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return gif_error("bad frame descriptor", gif->Error);
    const GifImageDesc& d = gif->Image;
    const ColorMapObject* cmap = d.ColorMap ? d.ColorMap : gif->SColorMap;
    if (!cmap || cmap->ColorCount <= 0)
      return invalid_argument("corrupt GIF image: the first frame has no palette");
    if (d.Width <= 0 || d.Height <= 0) return invalid_argument("corrupt GIF image: empty first frame");
    DS41_RETURN_IF_ERROR(check_dimensions(d.Width, d.Height, limits, "GIF"));
    Raster out;
    out.width = gif->SWidth;
    out.height = gif->SHeight;
    out.channels = 4;
    out.data.resize(static_cast<size_t>(out.width * out.height * 4));
    auto color = [&](int index, uint8_t* px) {
      if (index == transparent) {
        px[0] = px[1] = px[2] = px[3] = 0;
        return;
      }
      const GifColorType c = index < cmap->ColorCount ? cmap->Colors[index] : GifColorType{0, 0, 0};
      px[0] = c.Red, px[1] = c.Green, px[2] = c.Blue, px[3] = 255;
    };
    uint8_t bg[4];
    color(transparent >= 0 ? transparent : 0, bg);
    for (int64_t i = 0; i < out.width * out.height; ++i)
      std::memcpy(&out.data[static_cast<size_t>(i * 4)], bg, 4);
    std::vector<GifPixelType> line(static_cast<size_t>(d.Width));
    auto put_row = [&](int64_t y) {
      const int64_t sy = d.Top + y;
      if (sy < 0 || sy >= out.height) return;
      for (int64_t x = 0; x < d.Width; ++x) {
        const int64_t sx = d.Left + x;
        if (sx >= 0 && sx < out.width)
          color(line[x], &out.data[static_cast<size_t>((sy * out.width + sx) * 4)]);
      }
    };
    if (d.Interlace) {
      static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass)
        for (int64_t y = kStart[pass]; y < d.Height; y += kStep[pass]) {
          if (DGifGetLine(gif, line.data(), d.Width) == GIF_ERROR)
            return gif_error("truncated or damaged frame", gif->Error);
          put_row(y);
        }
    } else {
      for (int64_t y = 0; y < d.Height; ++y) {
        if (DGifGetLine(gif, line.data(), d.Width) == GIF_ERROR)
          return gif_error("truncated or damaged frame", gif->Error);
        put_row(y);
      }
    }
    return out;
  }
}

}  // namespace ds41::image::detail
