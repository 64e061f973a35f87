// ds41 model: the aligner (MODEL_SPEC 3.11): each image's ViT rows laid on its patch grid,
// zero-padded to multiples of downsample_ratio, k x k windows in reading order flattened
// channel-major (space_to_depth), Linear (+bias) -> exact GELU -> Linear (+bias). All images'
// windows go through the two linears as one batch.
#include "model/vision_tower.h"

namespace ds41::model {

void VisionTower::align(const float* vit, const std::vector<int64_t>& segs,
                        std::vector<VisionImageOutput>* out) const {
  const int64_t D = c_.vision_hidden_size, k = c_.vision_downsample_ratio, H = c_.hidden_size;
  std::vector<int64_t> first{0};  // first window row of each image
  for (VisionImageOutput& o : *out) {
    o.n_llm_h = (o.grid_h + k - 1) / k;
    o.n_llm_w = (o.grid_w + k - 1) / k;
    first.push_back(first.back() + o.n_llm_h * o.n_llm_w);
  }
  const int64_t m = first.back();
  std::vector<float> windows(m * D * k * k);
  for (size_t i = 0; i < out->size(); ++i) {
    const VisionImageOutput& o = (*out)[i];
    be_.space_to_depth(vit + segs[i] * D, o.grid_h, o.grid_w, D, k, windows.data() + first[i] * D * k * k);
  }
  std::vector<float> h(m * H), y(m * H);
  be_.linear(w_.aligner_w1, windows.data(), m, h.data());
  be_.add_bias(h.data(), m, H, w_.aligner_b1.data());
  be_.gelu_erf(h.data(), m * H);
  be_.linear(w_.aligner_w2, h.data(), m, y.data());
  be_.add_bias(y.data(), m, H, w_.aligner_b2.data());
  for (size_t i = 0; i < out->size(); ++i)
    (*out)[i].aligner_out.assign(y.begin() + first[i] * H, y.begin() + first[i + 1] * H);
}

}  // namespace ds41::model
