// ds41 model: image bytes -> span embeddings (see image_input.h).
#include "model/image_input.h"

#include "image/image_decode.h"
#include "model/vision_span.h"

namespace ds41::model {

image::VisionPlanConfig vision_plan_config(const ModelConfig& c) {
  image::VisionPlanConfig p;
  p.patch_size = c.vision_patch_size;
  p.downsample_ratio = c.vision_downsample_ratio;
  p.min_pixels = c.vision_min_pixels;
  p.max_image_tokens = c.vision_max_image_tokens;
  p.max_wh_ratio = c.vision_max_wh_ratio;
  return p;
}

Result<image::PreparedImage> prepare_image_bytes(std::span<const uint8_t> bytes, const ModelConfig& c,
                                                 const image::ImageLimits& limits) {
  if (!c.has_vision)
    return failed_precondition("this model has no vision tower (no vision_config in config.json)");
  DS41_ASSIGN_OR_RETURN(image::DecodedImage d, image::decode_image(bytes, limits));
  return image::prepare_image(d.rgb, vision_plan_config(c));
}

Result<std::vector<EncodedImage>> encode_prepared_images(const ModelConfig& c, const VisionTowerFn& tower,
                                                         const ImageSpanMarkers& markers,
                                                         std::span<const image::PreparedImage* const> images,
                                                         bool keep) {
  const int64_t ps = c.vision_patch_size;
  std::vector<std::vector<float>> patches(images.size());
  std::vector<VisionImageInput> in;
  for (size_t i = 0; i < images.size(); ++i) {
    patches[i] = image::image_patches(images[i]->resized, ps);
    in.push_back({patches[i].data(), images[i]->plan.box_h / ps, images[i]->plan.box_w / ps});
  }
  DS41_ASSIGN_OR_RETURN(auto outs, tower(in, keep));
  if (outs.size() != images.size())
    return internal_error("the vision tower returned another number of images");
  std::vector<EncodedImage> r(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    r[i].plan = images[i]->plan;
    if (outs[i].n_llm_h != images[i]->plan.n_llm_h || outs[i].n_llm_w != images[i]->plan.n_llm_w)
      return internal_error("image " + std::to_string(i) + ": the tower's token grid differs from the plan");
    r[i].span_embeds =
        image_span_embeddings(markers, outs[i].aligner_out, outs[i].n_llm_h, outs[i].n_llm_w, c.hidden_size);
    r[i].aligner_out = std::move(outs[i].aligner_out);
    if (keep) {
      r[i].vit_out = std::move(outs[i].vit_out);
      r[i].pixel_values = std::move(patches[i]);
    }
  }
  return r;
}

Result<std::vector<EncodedImage>> encode_images(const Model& m, std::span<const image::PreparedImage> images,
                                                bool keep) {
  const VisionTower* tower = m.vision_tower();
  if (!tower) return failed_precondition("this model has no vision tower (no vision_config in config.json)");
  std::vector<const image::PreparedImage*> ptrs;
  for (const image::PreparedImage& p : images) ptrs.push_back(&p);
  return encode_prepared_images(
      m.config(), [tower](std::span<const VisionImageInput> in, bool k) { return tower->encode(in, k); },
      image_span_markers(*m.vision_weights()), ptrs, keep);
}

}  // namespace ds41::model
