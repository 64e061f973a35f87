// ds41 model: the ViT blocks (MODEL_SPEC 3.11): patch embedding, pre-norm blocks with split-half
// 2D RoPE and SwiGLU, the final RMSNorm; the aligner is in vision_aligner.cpp.
#include "model/vision_tower.h"

#include <cmath>
#include <limits>
#include <string>

namespace ds41::model {

std::vector<float> vision_rope_inv_freq(const ModelConfig& c) {
  const int64_t hd = c.vision_hidden_size / c.vision_num_heads, half = hd / 2;
  std::vector<float> f(hd / 4);
  for (int64_t i = 0; i < hd / 4; ++i)
    f[i] = static_cast<float>(1.0 / std::pow(c.vision_rope_theta, static_cast<double>(2 * i) / half));
  return f;
}

int64_t vision_max_patches_per_image(const ModelConfig& c) {
  // The plan keeps n_h * (n_w + 1) + 2 <= max_image_tokens, so n_h * n_w < max_image_tokens;
  // each token is downsample^2 patches.
  return c.vision_max_image_tokens * c.vision_downsample_ratio * c.vision_downsample_ratio;
}

Status validate_vision_images(const ModelConfig& c, std::span<const VisionImageInput> images) {
  for (size_t i = 0; i < images.size(); ++i) {
    const VisionImageInput& im = images[i];
    const int64_t np = im.grid_h * im.grid_w;
    if (im.grid_h <= 0 || im.grid_w <= 0 || !im.patches)
      return invalid_argument("image " + std::to_string(i) + ": empty patch grid");
    if (np > vision_max_patches_per_image(c))
      return invalid_argument("image " + std::to_string(i) + ": " + std::to_string(np) +
                              " patches, over the config's bound of " +
                              std::to_string(vision_max_patches_per_image(c)));
  }
  return ok_status();
}

std::vector<int64_t> vision_patch_offsets(std::span<const VisionImageInput> images) {
  std::vector<int64_t> segs{0};
  for (const VisionImageInput& im : images) segs.push_back(segs.back() + im.grid_h * im.grid_w);
  return segs;
}

void vision_patch_coords(std::span<const VisionImageInput> images, std::vector<int32_t>* rows,
                         std::vector<int32_t>* cols) {
  rows->clear();
  cols->clear();
  for (const VisionImageInput& im : images)
    for (int64_t r = 0; r < im.grid_h; ++r)
      for (int64_t col = 0; col < im.grid_w; ++col) {
        rows->push_back(static_cast<int32_t>(r));
        cols->push_back(static_cast<int32_t>(col));
      }
}

VisionTower::VisionTower(const ModelConfig& c, const VisionWeights& w, ops::Backend& be)
    : c_(c), w_(w), be_(be), inv_freq_(vision_rope_inv_freq(c)) {}

int64_t VisionTower::max_patches_per_image() const { return vision_max_patches_per_image(c_); }

void VisionTower::block(const VisionBlockWeights& bw, float* x, int64_t n, const std::vector<int32_t>& rows,
                        const std::vector<int32_t>& cols, const std::vector<int64_t>& segs) const {
  const int64_t D = c_.vision_hidden_size, I = c_.vision_intermediate_size, heads = c_.vision_num_heads;
  const int64_t hd = D / heads;
  std::vector<float> h(n * D), q(n * D), k(n * D), v(n * D), o(n * D), y(n * D);
  // Attention half: RMSNorm -> q, k, v (+bias) -> 2D RoPE on q, k -> full attention -> wo (+bias).
  be_.rms_norm(x, n, D, bw.norm1.data(), kVisionNormEps, h.data());
  be_.linear(bw.wq, h.data(), n, q.data());
  be_.add_bias(q.data(), n, D, bw.bq.data());
  be_.linear(bw.wk, h.data(), n, k.data());
  be_.add_bias(k.data(), n, D, bw.bk.data());
  be_.linear(bw.wv, h.data(), n, v.data());
  be_.add_bias(v.data(), n, D, bw.bv.data());
  be_.rope_2d(q.data(), n, heads, hd, rows.data(), cols.data(), inv_freq_.data());
  be_.rope_2d(k.data(), n, heads, hd, rows.data(), cols.data(), inv_freq_.data());
  ops::DenseAttentionArgs a;
  a.n = n;
  a.n_heads = heads;
  a.head_dim = hd;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.seg_offsets = segs.data();
  a.n_segs = static_cast<int64_t>(segs.size()) - 1;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.out = o.data();
  be_.dense_attention(a);
  be_.linear(bw.wo, o.data(), n, y.data());
  be_.add_bias(y.data(), n, D, bw.bo.data());
  be_.add_inplace(x, y.data(), n * D);
  // MLP half: RMSNorm -> silu(gate) * up (no clamp) -> w2.
  be_.rms_norm(x, n, D, bw.norm2.data(), kVisionNormEps, h.data());
  std::vector<float> g(n * I), u(n * I);
  be_.linear(bw.w_gate, h.data(), n, g.data());
  be_.linear(bw.w_up, h.data(), n, u.data());
  be_.swiglu(g.data(), u.data(), n, I, std::numeric_limits<float>::infinity(), nullptr, g.data());
  be_.linear(bw.w2, g.data(), n, y.data());
  be_.add_inplace(x, y.data(), n * D);
}

Result<std::vector<VisionImageOutput>> VisionTower::encode(std::span<const VisionImageInput> images,
                                                           bool keep_vit_out) const {
  const int64_t D = c_.vision_hidden_size, ps = c_.vision_patch_size, pdim = 3 * ps * ps;
  std::vector<VisionImageOutput> out(images.size());
  if (images.empty()) return out;
  DS41_RETURN_IF_ERROR(validate_vision_images(c_, images));
  const std::vector<int64_t> segs = vision_patch_offsets(images);
  const int64_t n = segs.back();
  std::vector<float> patches(n * pdim);
  for (size_t i = 0; i < images.size(); ++i)
    std::copy(images[i].patches, images[i].patches + (segs[i + 1] - segs[i]) * pdim,
              patches.begin() + segs[i] * pdim);
  std::vector<int32_t> rows, cols;
  vision_patch_coords(images, &rows, &cols);
  std::vector<float> x(n * D);
  be_.linear(w_.patch_embed, patches.data(), n, x.data());
  be_.add_bias(x.data(), n, D, w_.patch_bias.data());
  for (const VisionBlockWeights& bw : w_.blocks) block(bw, x.data(), n, rows, cols, segs);
  be_.rms_norm(x.data(), n, D, w_.norm.data(), kVisionNormEps, x.data());
  for (size_t i = 0; i < images.size(); ++i) {
    out[i].grid_h = images[i].grid_h;
    out[i].grid_w = images[i].grid_w;
    if (keep_vit_out) out[i].vit_out.assign(x.begin() + segs[i] * D, x.begin() + segs[i + 1] * D);
  }
  align(x.data(), segs, &out);
  return out;
}

}  // namespace ds41::model
