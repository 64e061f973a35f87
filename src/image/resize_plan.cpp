// ds41 image: the MODEL_SPEC 3.11 resize plan in the reference's arithmetic (see resize_plan.h).
#include "image/resize_plan.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace ds41::image {
namespace {

struct Grid {
  int64_t n_h, n_w;
};

// MODEL_SPEC 3.11: n = ceil((side / patch) / downsample) on the patch grid.
Grid llm_grid(int64_t box_h, int64_t box_w, const VisionPlanConfig& c) {
  const int64_t gh = box_h / c.patch_size, gw = box_w / c.patch_size;
  return {(gh + c.downsample_ratio - 1) / c.downsample_ratio,
          (gw + c.downsample_ratio - 1) / c.downsample_ratio};
}

int64_t ceil_to(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The closed-form shrink (MODEL_SPEC 3.11), each expression in Python's order, in double.
void solve_shrink(int64_t height, int64_t width, const VisionPlanConfig& c, int64_t* box_h, int64_t* box_w) {
  const int64_t n = c.max_image_tokens;
  const int64_t cell = c.patch_size * c.downsample_ratio;
  const double ratio = static_cast<double>(height) / static_cast<double>(width);
  const double max_w = std::sqrt(static_cast<double>(n - 2) / ratio + 0.25) - 0.5;
  const double max_h = max_w * ratio;
  if (max_w < 1.0) {  // very tall: one column
    *box_h = (n - 2) / 2 * cell;
    *box_w = cell;
    return;
  }
  if (max_h < 1.0) {  // very wide: one row
    *box_h = cell;
    *box_w = (n - 3) * cell;
    return;
  }
  // beta = min(floor(w*) * cell / W, floor(h*) * cell / H): integer products, then one division.
  const double bw =
      static_cast<double>(static_cast<int64_t>(std::floor(max_w)) * cell) / static_cast<double>(width);
  const double bh =
      static_cast<double>(static_cast<int64_t>(std::floor(max_h)) * cell) / static_cast<double>(height);
  const double beta = std::min(bw, bh);
  const double ps = static_cast<double>(c.patch_size);
  *box_h = static_cast<int64_t>(std::floor(static_cast<double>(height) * beta / ps)) * c.patch_size;
  *box_w = static_cast<int64_t>(std::floor(static_cast<double>(width) * beta / ps)) * c.patch_size;
}

}  // namespace

int64_t round_half_even(double x) {
  // nearbyint rounds to the current mode; the process never changes it from FE_TONEAREST,
  // which is half to even (Python's round()).
  return static_cast<int64_t>(std::nearbyint(x));
}

Result<ImagePlan> plan_image(int64_t width, int64_t height, const VisionPlanConfig& c) {
  if (width <= 0 || height <= 0)
    return invalid_argument("image size " + std::to_string(width) + "x" + std::to_string(height) +
                            " is not positive");
  if (c.patch_size <= 0 || c.downsample_ratio <= 0 || c.min_pixels <= 0 || c.max_image_tokens < 4 ||
      c.max_wh_ratio < 0)
    return invalid_argument(
        "vision preprocessing config: patch_size, downsample_ratio and min_pixels must be positive, "
        "max_image_tokens at least 4, max_wh_ratio non-negative");
  ImagePlan p;
  p.orig_w = width;
  p.orig_h = height;
  int64_t w = width, h = height;
  if (c.max_wh_ratio > 0 && w > h * c.max_wh_ratio) w = h * c.max_wh_ratio;
  if (w * h < c.min_pixels) {
    // ratio = (min_pixels / (w * h)) ** 0.5; sides truncated (Python int()).
    const double ratio = std::pow(static_cast<double>(c.min_pixels) / static_cast<double>(w * h), 0.5);
    w = static_cast<int64_t>(static_cast<double>(w) * ratio);
    h = static_cast<int64_t>(static_cast<double>(h) * ratio);
  }
  p.up_w = w;
  p.up_h = h;
  p.box_w = ceil_to(w, c.patch_size);
  p.box_h = ceil_to(h, c.patch_size);
  Grid g = llm_grid(p.box_h, p.box_w, c);
  if (image_span_tokens(g.n_h, g.n_w) > c.max_image_tokens) {
    solve_shrink(h, w, c, &p.box_h, &p.box_w);
    g = llm_grid(p.box_h, p.box_w, c);
    if (p.box_h <= 0 || p.box_w <= 0 || image_span_tokens(g.n_h, g.n_w) > c.max_image_tokens)
      return invalid_argument("the resize plan cannot fit a " + std::to_string(width) + "x" +
                              std::to_string(height) + " image in " + std::to_string(c.max_image_tokens) +
                              " image tokens");
  }
  p.n_llm_h = g.n_h;
  p.n_llm_w = g.n_w;
  p.n_tokens = image_span_tokens(g.n_h, g.n_w);
  if (c.max_wh_ratio > 0 && width >= c.max_wh_ratio * height) {
    p.squeeze = true;  // resized to the whole box, aspect not kept
    p.fit_h = p.box_h;
    p.fit_w = p.box_w;
    return p;
  }
  // Aspect fit (PIL ImageOps.contain rounding): one side exact, the other round()ed.
  const double image_ratio = static_cast<double>(width) / static_cast<double>(height);
  const double box_ratio = static_cast<double>(p.box_w) / static_cast<double>(p.box_h);
  if (image_ratio > box_ratio) {
    p.fit_w = p.box_w;
    p.fit_h = round_half_even(static_cast<double>(height) / static_cast<double>(width) *
                              static_cast<double>(p.box_w));
  } else if (image_ratio < box_ratio) {
    p.fit_h = p.box_h;
    p.fit_w = round_half_even(static_cast<double>(width) / static_cast<double>(height) *
                              static_cast<double>(p.box_h));
  } else {
    p.fit_h = p.box_h;
    p.fit_w = p.box_w;
  }
  if (p.fit_h <= 0 || p.fit_w <= 0)
    return invalid_argument("a " + std::to_string(width) + "x" + std::to_string(height) +
                            " image is too elongated: it fits the planned " + std::to_string(p.box_w) + "x" +
                            std::to_string(p.box_h) + " box with a side of 0 pixels");
  p.pad_top = round_half_even(static_cast<double>(p.box_h - p.fit_h) * 0.5);
  p.pad_left = round_half_even(static_cast<double>(p.box_w - p.fit_w) * 0.5);
  return p;
}

}  // namespace ds41::image
