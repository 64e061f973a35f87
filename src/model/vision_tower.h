// ds41 model: VisionTower — the DeepSeek-ViT and the aligner (MODEL_SPEC 3.11) as a composition of
// ops over a Backend, batched over images: one pass over the patches of all images (attention
// stays inside each image), then the aligner over all images' 3x3 windows. Each image's tower
// runs once; the caller keeps the aligner rows (the vision-feature cache) and turns them into
// text-stream span embeddings (vision_span.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/vision_weights.h"
#include "ops/backend.h"

namespace ds41::model {

struct VisionImageInput {
  const float* patches = nullptr;  // [grid_h * grid_w, 3 * patch^2] (image::image_patches)
  int64_t grid_h = 0, grid_w = 0;  // ViT patch grid
};

struct VisionImageOutput {
  int64_t grid_h = 0, grid_w = 0;
  int64_t n_llm_h = 0, n_llm_w = 0;
  std::vector<float> vit_out;      // [grid_h * grid_w, D] after the final norm (only with keep_vit_out)
  std::vector<float> aligner_out;  // [n_llm_h * n_llm_w, hidden] in reading order
};

// Shared by the CPU tower and the GPU engine's twin (src/gpu/gpu_vision_tower.h):
inline constexpr float kVisionNormEps = 1e-6f;  // every ViT RMSNorm (MODEL_SPEC 3.11)
// The 2D RoPE frequencies f_i = theta^(-2i / (head_dim/2)), i < head_dim/4 (one set per axis).
std::vector<float> vision_rope_inv_freq(const ModelConfig& c);
// Upper bound on the patches of one image the config's preprocessing can produce.
int64_t vision_max_patches_per_image(const ModelConfig& c);
// The input checks of VisionTower::encode: a non-empty grid with patches, at most the bound above.
Status validate_vision_images(const ModelConfig& c, std::span<const VisionImageInput> images);
// Row offsets of each image's patches in one batch: [images + 1], starting at 0.
std::vector<int64_t> vision_patch_offsets(std::span<const VisionImageInput> images);
// Every patch's (row, col) on its image's grid, in batch order (the 2D RoPE positions).
void vision_patch_coords(std::span<const VisionImageInput> images, std::vector<int32_t>* rows,
                         std::vector<int32_t>* cols);

class VisionTower {
 public:
  // w and be must outlive the tower.
  VisionTower(const ModelConfig& c, const VisionWeights& w, ops::Backend& be);

  // Encodes a batch of images. Errors: an empty grid or more patches than max_patches.
  Result<std::vector<VisionImageOutput>> encode(std::span<const VisionImageInput> images,
                                                bool keep_vit_out = false) const;

  // Upper bound on the patches of one image the config's preprocessing can produce.
  int64_t max_patches_per_image() const;

 private:
  void block(const VisionBlockWeights& bw, float* x, int64_t n, const std::vector<int32_t>& rows,
             const std::vector<int32_t>& cols, const std::vector<int64_t>& segs) const;
  // The aligner over every image's ViT rows (vision_aligner.cpp): fills n_llm_h/w and aligner_out.
  void align(const float* vit, const std::vector<int64_t>& segs, std::vector<VisionImageOutput>* out) const;

  const ModelConfig& c_;
  const VisionWeights& w_;
  ops::Backend& be_;
  std::vector<float> inv_freq_;  // [head_dim / 4]
};

}  // namespace ds41::model
