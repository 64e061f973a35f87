// ds41 model: binding the vision tensors (MODEL_SPEC 2.5) to VisionWeights.
#include "model/vision_weights.h"

#include "model/weight_binder.h"

namespace ds41::model {
namespace {

// Rows [first, first + rows) of a BF16 [out, in] weight as its own linear.
ops::WeightRef row_slice(const ops::WeightRef& w, int64_t first, int64_t rows, const std::string& name,
                         std::vector<std::unique_ptr<std::string>>* names) {
  ops::WeightRef s = w;
  if (!w.present()) return s;
  s.data = w.data + first * w.in_dim * 2;
  s.out_dim = rows;
  names->push_back(std::make_unique<std::string>(name));
  s.name = names->back()->c_str();
  return s;
}

std::vector<float> vec_slice(const std::vector<float>& v, int64_t first, int64_t n) {
  if (static_cast<int64_t>(v.size()) < first + n) return {};
  return std::vector<float>(v.begin() + first, v.begin() + first + n);
}

}  // namespace

std::vector<const ops::WeightRef*> VisionWeights::linears() const {
  std::vector<const ops::WeightRef*> r{&patch_embed, &aligner_w1, &aligner_w2};
  for (const VisionBlockWeights& b : blocks)
    for (const ops::WeightRef* w : {&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w2}) r.push_back(w);
  return r;
}

Result<std::unique_ptr<VisionWeights>> bind_vision_weights(const Checkpoint& ck, const ModelConfig& c) {
  if (!c.has_vision) return failed_precondition("the config has no vision_config");
  detail::Binder b(ck);
  auto w = std::make_unique<VisionWeights>();
  const int64_t D = c.vision_hidden_size, I = c.vision_intermediate_size, H = c.hidden_size;
  const int64_t ps = c.vision_patch_size, k = c.vision_downsample_ratio;
  w->patch_embed = b.linear("vision.patch_embed.proj", D, 3 * ps * ps);
  w->patch_bias = b.vec("vision.patch_embed.proj.bias", D, DType::kBF16);
  w->norm = b.vec("vision.norm.weight", D, DType::kBF16);
  for (int64_t i = 0; i < c.vision_num_layers; ++i) {
    const std::string p = "vision.blocks." + std::to_string(i) + ".";
    VisionBlockWeights bw;
    const ops::WeightRef qkv = b.linear(p + "attn.wqkv", 3 * D, D);
    const std::vector<float> bqkv = b.vec(p + "attn.wqkv.bias", 3 * D, DType::kBF16);
    bw.wq = row_slice(qkv, 0, D, p + "attn.wqkv[q]", &w->names_);
    bw.wk = row_slice(qkv, D, D, p + "attn.wqkv[k]", &w->names_);
    bw.wv = row_slice(qkv, 2 * D, D, p + "attn.wqkv[v]", &w->names_);
    bw.bq = vec_slice(bqkv, 0, D);
    bw.bk = vec_slice(bqkv, D, D);
    bw.bv = vec_slice(bqkv, 2 * D, D);
    bw.bqkv = bqkv;
    bw.wo = b.linear(p + "attn.wo", D, D);
    bw.bo = b.vec(p + "attn.wo.bias", D, DType::kBF16);
    const ops::WeightRef w1 = b.linear(p + "mlp.w1", 2 * I, D);
    bw.w_gate = row_slice(w1, 0, I, p + "mlp.w1[gate]", &w->names_);
    bw.w_up = row_slice(w1, I, I, p + "mlp.w1[up]", &w->names_);
    bw.w2 = b.linear(p + "mlp.w2", D, I);
    bw.norm1 = b.vec(p + "norm1.weight", D, DType::kBF16);
    bw.norm2 = b.vec(p + "norm2.weight", D, DType::kBF16);
    for (const ops::WeightRef* r : {&qkv, &w1})
      if (r->present() && r->format != ops::WeightFormat::kBF16)
        b.errors.push_back(std::string(r->name) + ".weight: the vision tower expects BF16 (MODEL_SPEC 2.5)");
    w->blocks.push_back(std::move(bw));
  }
  w->aligner_w1 = b.linear("aligner.w1", H, D * k * k);
  w->aligner_b1 = b.vec("aligner.w1.bias", H, DType::kBF16);
  w->aligner_w2 = b.linear("aligner.w2", H, H);
  w->aligner_b2 = b.vec("aligner.w2.bias", H, DType::kBF16);
  w->image_start = b.vec("image_start", H, DType::kBF16);
  w->image_end = b.vec("image_end", H, DType::kBF16);
  w->image_newline = b.vec("image_newline", H, DType::kBF16);
  if (!b.errors.empty()) {
    std::string m = ck.dir() + ": vision tensors do not match config.json (" +
                    std::to_string(b.errors.size()) + " problems):";
    for (auto& e : b.errors) m += "\n  " + e;
    return invalid_argument(m);
  }
  for (auto& n : b.names()) w->names_.push_back(std::move(n));
  return w;
}

}  // namespace ds41::model
