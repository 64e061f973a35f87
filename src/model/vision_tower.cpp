// ds41 model: the ViT blocks (MODEL_SPEC 3.11): patch embedding, pre-norm blocks with split-half
// 2D RoPE and SwiGLU, the final RMSNorm; the aligner is in vision_aligner.cpp.
#include "model/vision_tower.h"

#include <cmath>
#include <limits>
#include <string>

namespace ds41::model {
namespace {
constexpr float kVisionNormEps = 1e-6f;  // MODEL_SPEC 3.11
}  // namespace

VisionTower::VisionTower(const ModelConfig& c, const VisionWeights& w, ops::Backend& be)
    : c_(c), w_(w), be_(be) {
  // f_i = theta^(-2i / (head_dim/2)), i < head_dim/4: one set per axis (MODEL_SPEC 3.11).
  const int64_t hd = c.vision_hidden_size / c.vision_num_heads, half = hd / 2;
  inv_freq_.resize(hd / 4);
  for (int64_t i = 0; i < hd / 4; ++i)
    inv_freq_[i] = static_cast<float>(1.0 / std::pow(c.vision_rope_theta, static_cast<double>(2 * i) / half));
}

int64_t VisionTower::max_patches_per_image() const {
  // The plan keeps n_h * (n_w + 1) + 2 <= max_image_tokens, so n_h * n_w < max_image_tokens;
  // each token is downsample^2 patches.
  return c_.vision_max_image_tokens * c_.vision_downsample_ratio * c_.vision_downsample_ratio;
}

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
  std::vector<int64_t> segs{0};
  for (size_t i = 0; i < images.size(); ++i) {
    const VisionImageInput& im = images[i];
    const int64_t np = im.grid_h * im.grid_w;
    if (im.grid_h <= 0 || im.grid_w <= 0 || !im.patches)
      return invalid_argument("image " + std::to_string(i) + ": empty patch grid");
    if (np > max_patches_per_image())
      return invalid_argument("image " + std::to_string(i) + ": " + std::to_string(np) +
                              " patches, over the config's bound of " +
                              std::to_string(max_patches_per_image()));
    segs.push_back(segs.back() + np);
  }
  const int64_t n = segs.back();
  std::vector<float> patches(n * pdim);
  std::vector<int32_t> rows(n), cols(n);
  for (size_t i = 0; i < images.size(); ++i) {
    const VisionImageInput& im = images[i];
    std::copy(im.patches, im.patches + (segs[i + 1] - segs[i]) * pdim, patches.begin() + segs[i] * pdim);
    for (int64_t r = 0; r < im.grid_h; ++r)
      for (int64_t col = 0; col < im.grid_w; ++col) {
        rows[segs[i] + r * im.grid_w + col] = static_cast<int32_t>(r);
        cols[segs[i] + r * im.grid_w + col] = static_cast<int32_t>(col);
      }
  }
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
