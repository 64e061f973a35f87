// ds41 image: the 8-bit separable bicubic resize (see bicubic_resize.h for the contract).
#include "image/bicubic_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace ds41::image {
namespace {

// Fixed-point weights: 32 bits minus 8 for the sample minus 2 of headroom for the negative lobes.
constexpr int kPrecisionBits = 32 - 8 - 2;

// Keys' cubic with a = -0.5 (Catmull-Rom), support 2.
double cubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// Per output sample: the first input index, the tap count and ksize fixed-point weights.
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> w;  // [out, ksize]
};

Taps taps_for(int64_t in_size, int64_t out_size) {
  Taps t;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = 2.0 * filter_scale;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.w.assign(out_size * t.ksize, 0);
  std::vector<double> k(t.ksize);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    // Bounds rounded by +0.5 and truncation toward zero (C cast), then clamped.
    int64_t lo = static_cast<int64_t>(static_cast<int>(center - support + 0.5));
    if (lo < 0) lo = 0;
    int64_t hi = static_cast<int64_t>(static_cast<int>(center + support + 0.5));
    if (hi > in_size) hi = in_size;
    const int64_t n = hi - lo;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      k[i] = cubic((static_cast<double>(i + lo) - center + 0.5) * inv);
      sum += k[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      const double v = sum != 0.0 ? k[i] / sum : k[i];
      // Round half away from zero into 22-bit fixed point (truncating cast after +-0.5).
      const double f = v * static_cast<double>(1 << kPrecisionBits);
      t.w[o * t.ksize + i] = static_cast<int32_t>(v < 0 ? -0.5 + f : 0.5 + f);
    }
    t.first[o] = lo;
    t.count[o] = n;
  }
  return t;
}

uint8_t clip8(int64_t acc) {
  if (acc >= (static_cast<int64_t>(1) << kPrecisionBits << 8)) return 255;
  if (acc <= 0) return 0;
  return static_cast<uint8_t>(acc >> kPrecisionBits);
}

// Horizontal pass over rows [row0, row0 + rows) of src into an out_w-wide image.
RgbImage pass_horizontal(const RgbImage& src, int64_t row0, int64_t rows, int64_t out_w) {
  const Taps t = taps_for(src.width, out_w);
  RgbImage o;
  o.width = out_w;
  o.height = rows;
  o.rgb.resize(static_cast<size_t>(out_w * rows * 3));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* in = &src.rgb[static_cast<size_t>((row0 + y) * src.width * 3)];
    uint8_t* out = &o.rgb[static_cast<size_t>(y * out_w * 3)];
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* w = &t.w[x * t.ksize];
      for (int c = 0; c < 3; ++c) {
        int64_t acc = static_cast<int64_t>(1) << (kPrecisionBits - 1);
        for (int64_t i = 0; i < t.count[x]; ++i)
          acc += static_cast<int64_t>(in[(t.first[x] + i) * 3 + c]) * w[i];
        out[x * 3 + c] = clip8(acc);
      }
    }
  }
  return o;
}

// Vertical pass with precomputed taps whose first rows are relative to src's row 0.
RgbImage pass_vertical(const RgbImage& src, const Taps& t, int64_t out_h) {
  RgbImage o;
  o.width = src.width;
  o.height = out_h;
  o.rgb.resize(static_cast<size_t>(src.width * out_h * 3));
  const int64_t stride = src.width * 3;
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* w = &t.w[y * t.ksize];
    uint8_t* out = &o.rgb[static_cast<size_t>(y * stride)];
    for (int64_t xc = 0; xc < stride; ++xc) {
      int64_t acc = static_cast<int64_t>(1) << (kPrecisionBits - 1);
      for (int64_t i = 0; i < t.count[y]; ++i)
        acc += static_cast<int64_t>(src.rgb[static_cast<size_t>((t.first[y] + i) * stride + xc)]) * w[i];
      out[xc] = clip8(acc);
    }
  }
  return o;
}

}  // namespace

RgbImage resize_bicubic_u8(const RgbImage& src, int64_t out_w, int64_t out_h) {
  const bool horizontal = out_w != src.width;
  const bool vertical = out_h != src.height;
  if (!horizontal && !vertical) return src;
  Taps vt = taps_for(src.height, out_h);
  if (!horizontal) return pass_vertical(src, vt, out_h);
  // Only the source rows the vertical pass reads go through the horizontal pass.
  const int64_t row_first = vt.first[0];
  const int64_t row_last = vt.first[out_h - 1] + vt.count[out_h - 1];
  RgbImage tmp = pass_horizontal(src, row_first, row_last - row_first, out_w);
  if (!vertical) return tmp;
  for (int64_t& f : vt.first) f -= row_first;
  return pass_vertical(tmp, vt, out_h);
}

}  // namespace ds41::image
