// ds41 gpu: the device weight list (device_weight_items.h), mirroring model::bind_model_weights.
#include "gpu/device_weight_items.h"

#include <algorithm>

#include "model/dspark_weights.h"

namespace ds41::gpu {

uint64_t WeightItem::data_bytes() const {
  switch (kind) {
    case WeightItemKind::kLinear:
      return static_cast<uint64_t>(quant::weight_payload_bytes(format, rows, cols));
    case WeightItemKind::kVec:
    case WeightItemKind::kOmega: return static_cast<uint64_t>(rows * cols) * sizeof(float);
    case WeightItemKind::kEmbed: return static_cast<uint64_t>(rows * cols) * 2;
    case WeightItemKind::kEngramTable: return static_cast<uint64_t>(rows * cols);
  }
  return 0;
}

uint64_t WeightItem::scale_bytes() const {
  if (kind == WeightItemKind::kLinear)
    return static_cast<uint64_t>(quant::weight_scale_bytes(format, rows, cols));
  if (kind == WeightItemKind::kEngramTable) return static_cast<uint64_t>(rows * (cols / 32));
  return 0;
}

namespace {

class Lister {
 public:
  explicit Lister(std::vector<WeightItem>* out) : out_(out) {}
  void item(WeightItem it) { out_->push_back(std::move(it)); }

  void linear(const std::string& base, int64_t out, int64_t in, cuda::DeviceWeight* dst,
              const ops::WeightRef* src) {
    WeightItem it;
    it.kind = WeightItemKind::kLinear;
    it.name = base;
    it.rows = out;
    it.cols = in;
    it.weight = dst;
    if (src) {
      it.format = src->format;
      it.host_data = src->data;
      it.host_scale = src->scale;
    }
    dst->out_dim = out;
    dst->in_dim = in;
    out_->push_back(std::move(it));
  }
  void vec(const std::string& name, int64_t rows, int64_t cols, DeviceVec* dst,
           const std::vector<float>* src) {
    WeightItem it;
    it.kind = WeightItemKind::kVec;
    it.name = name;
    it.rows = rows;
    it.cols = cols;
    it.vec = dst;
    it.host_vec = src;
    out_->push_back(std::move(it));
  }

 private:
  std::vector<WeightItem>* out_;
};

// MODEL_SPEC 2.2 image markers, 2.5 vision tower + aligner, in the names of model::bind_vision_weights.
// The fused matrices come from the bound view's slices: the first slice starts at the tensor's
// bytes (row_slice keeps the base), the fused bias is VisionBlockWeights::bqkv.
void list_vision_weights(const model::ModelConfig& c, DeviceModelWeights& dw, const model::VisionWeights* vw,
                         Lister& b) {
  const int64_t D = c.vision_hidden_size, I = c.vision_intermediate_size, H = c.hidden_size;
  const int64_t ps = c.vision_patch_size, k = c.vision_downsample_ratio;
  dw.vision.emplace();
  DeviceVisionWeights& v = *dw.vision;
  v.blocks.assign(static_cast<size_t>(std::max<int64_t>(c.vision_num_layers, 0)), DeviceVisionBlock{});
  auto fused = [](const ops::WeightRef& first_slice) {  // the whole tensor behind its first row slice
    ops::WeightRef r = first_slice;
    r.scale = nullptr;
    return r;
  };
  b.vec("image_start", 1, H, &v.image_start, vw ? &vw->image_start : nullptr);
  b.vec("image_end", 1, H, &v.image_end, vw ? &vw->image_end : nullptr);
  b.vec("image_newline", 1, H, &v.image_newline, vw ? &vw->image_newline : nullptr);
  b.linear("vision.patch_embed.proj", D, 3 * ps * ps, &v.patch_embed, vw ? &vw->patch_embed : nullptr);
  b.vec("vision.patch_embed.proj.bias", 1, D, &v.patch_bias, vw ? &vw->patch_bias : nullptr);
  b.vec("vision.norm.weight", 1, D, &v.norm, vw ? &vw->norm : nullptr);
  for (size_t i = 0; i < v.blocks.size(); ++i) {
    const std::string p = "vision.blocks." + std::to_string(i) + ".";
    const model::VisionBlockWeights* bw = vw ? &vw->blocks[i] : nullptr;
    DeviceVisionBlock& d = v.blocks[i];
    const ops::WeightRef qkv = bw ? fused(bw->wq) : ops::WeightRef{};
    const ops::WeightRef w1 = bw ? fused(bw->w_gate) : ops::WeightRef{};
    b.linear(p + "attn.wqkv", 3 * D, D, &d.wqkv, bw ? &qkv : nullptr);
    b.vec(p + "attn.wqkv.bias", 1, 3 * D, &d.bqkv, bw ? &bw->bqkv : nullptr);
    b.linear(p + "attn.wo", D, D, &d.wo, bw ? &bw->wo : nullptr);
    b.vec(p + "attn.wo.bias", 1, D, &d.bo, bw ? &bw->bo : nullptr);
    b.linear(p + "mlp.w1", 2 * I, D, &d.w1, bw ? &w1 : nullptr);
    b.linear(p + "mlp.w2", D, I, &d.w2, bw ? &bw->w2 : nullptr);
    b.vec(p + "norm1.weight", 1, D, &d.norm1, bw ? &bw->norm1 : nullptr);
    b.vec(p + "norm2.weight", 1, D, &d.norm2, bw ? &bw->norm2 : nullptr);
  }
  b.linear("aligner.w1", H, D * k * k, &v.aligner_w1, vw ? &vw->aligner_w1 : nullptr);
  b.vec("aligner.w1.bias", 1, H, &v.aligner_b1, vw ? &vw->aligner_b1 : nullptr);
  b.linear("aligner.w2", H, H, &v.aligner_w2, vw ? &vw->aligner_w2 : nullptr);
  b.vec("aligner.w2.bias", 1, H, &v.aligner_b2, vw ? &vw->aligner_b2 : nullptr);
}

// One block under prefix L ("layers.{l}." or "mtp.{s}."), as model::bind_layer_weights: attention,
// the compressor / indexer parts the plan asks for, the MoE with n_experts routed experts, both mHC
// sites, Engram.
void list_layer(Lister& b, const model::ModelConfig& c, const model::LayerPlan& p, const std::string& L,
                const model::LayerWeights* lw, DeviceLayer& d, int64_t n_experts) {
  const int64_t H = c.hidden_size, C = c.hc_mult, nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t M = (2 + C) * C;
  auto R = [&](const ops::WeightRef model::LayerWeights::*f) { return lw ? &(lw->*f) : nullptr; };
  auto F = [&](const std::vector<float> model::LayerWeights::*f) { return lw ? &(lw->*f) : nullptr; };
  using LW = model::LayerWeights;
  b.vec(L + "attn_norm.weight", 1, H, &d.attn_norm, F(&LW::attn_norm));
  b.vec(L + "ffn_norm.weight", 1, H, &d.ffn_norm, F(&LW::ffn_norm));
  b.linear(L + "attn.wq_a", c.q_lora_rank, H, &d.wq_a, R(&LW::wq_a));
  b.vec(L + "attn.q_norm.weight", 1, c.q_lora_rank, &d.q_norm, F(&LW::q_norm));
  b.linear(L + "attn.wq_b", nh * hd, c.q_lora_rank, &d.wq_b, R(&LW::wq_b));
  b.linear(L + "attn.wkv", hd, H, &d.wkv, R(&LW::wkv));
  b.vec(L + "attn.kv_norm.weight", 1, hd, &d.kv_norm, F(&LW::kv_norm));
  b.linear(L + "attn.wo_a", c.o_groups * c.o_lora_rank, nh * hd / c.o_groups, &d.wo_a, R(&LW::wo_a));
  b.linear(L + "attn.wo_b", H, c.o_groups * c.o_lora_rank, &d.wo_b, R(&LW::wo_b));
  b.vec(L + "attn.attn_sink", 1, nh, &d.attn_sink, F(&LW::attn_sink));
  if (p.kv_source) {
    b.linear(L + "attn.compressor.wkv", hd, H, &d.c_wkv, R(&LW::c_wkv));
    if (p.has_gate) b.linear(L + "attn.compressor.wgate", hd, H, &d.c_wgate, R(&LW::c_wgate));
    b.vec(L + "attn.compressor.norm.weight", 1, hd, &d.c_norm, F(&LW::c_norm));
    b.linear(L + "attn.indexer.wk", c.index_head_dim, hd, &d.idx_wk, R(&LW::idx_wk));
    b.vec(L + "attn.indexer.k_norm.weight", 1, c.index_head_dim, &d.idx_k_norm, F(&LW::idx_k_norm));
  }
  if (p.index_source) {
    b.linear(L + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, &d.idx_wq_b,
             R(&LW::idx_wq_b));
    b.linear(L + "attn.indexer.weights_proj", c.index_n_heads, H, &d.idx_weights_proj,
             R(&LW::idx_weights_proj));
  }
  b.linear(L + "ffn.gate", n_experts, H, &d.gate, R(&LW::gate));
  b.vec(L + "ffn.gate.bias", 1, n_experts, &d.gate_bias, F(&LW::gate_bias));
  b.vec(L + "ffn.gate.bias_vl", 1, n_experts, &d.gate_bias_vl, F(&LW::gate_bias_vl));
  const int64_t I = c.moe_intermediate_size;
  d.experts.assign(static_cast<size_t>(n_experts), DeviceExpert{});
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string E = L + "ffn.experts." + std::to_string(e) + ".";
    const model::ExpertWeights* ew = lw ? &lw->experts[static_cast<size_t>(e)] : nullptr;
    DeviceExpert& de = d.experts[static_cast<size_t>(e)];
    b.linear(E + "w1", I, H, &de.w1, ew ? &ew->w1 : nullptr);
    b.linear(E + "w2", H, I, &de.w2, ew ? &ew->w2 : nullptr);
    b.linear(E + "w3", I, H, &de.w3, ew ? &ew->w3 : nullptr);
  }
  if (c.n_shared_experts > 0) {
    const int64_t Is = I * c.n_shared_experts;
    b.linear(L + "ffn.shared_experts.w1", Is, H, &d.shared.w1, lw ? &lw->shared.w1 : nullptr);
    b.linear(L + "ffn.shared_experts.w2", H, Is, &d.shared.w2, lw ? &lw->shared.w2 : nullptr);
    b.linear(L + "ffn.shared_experts.w3", Is, H, &d.shared.w3, lw ? &lw->shared.w3 : nullptr);
  }
  for (auto [site, hw, hs] : {std::tuple{"hc_attn", &d.hc_attn, lw ? &lw->hc_attn : nullptr},
                              std::tuple{"hc_ffn", &d.hc_ffn, lw ? &lw->hc_ffn : nullptr}}) {
    b.vec(L + site + "_fn", M, C * H, &hw->fn, hs ? &hs->fn : nullptr);
    b.vec(L + site + "_base", 1, M, &hw->base, hs ? &hs->base : nullptr);
    b.vec(L + site + "_scale", 1, 3, &hw->scale, hs ? &hs->scale : nullptr);
  }
  if (p.engram) {
    d.engram.emplace();
    DeviceEngram& de = *d.engram;
    const model::EngramWeights* ew = lw ? lw->engram.get() : nullptr;
    const int64_t ei = c.engram_index(p.layer);
    const int64_t rows = ei >= 0 && ei < static_cast<int64_t>(c.engram_num_embeddings.size())
                             ? c.engram_num_embeddings[ei]
                             : 0;
    const int64_t ed = c.engram_head_dim, cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    de.rows = rows;
    WeightItem t;
    t.kind = WeightItemKind::kEngramTable;
    t.name = L + "engram.embed";
    t.rows = rows;
    t.cols = ed;
    t.format = quant::WeightFormat::kEngramRows;
    t.data = &de.table;
    t.scale = &de.table_scale;
    t.host_data = ew ? ew->table : nullptr;
    t.host_scale = ew ? ew->table_scale : nullptr;
    b.item(std::move(t));
    b.linear(L + "engram.wkv", (C + 1) * H, cols * ed, &de.wkv, ew ? &ew->wkv : nullptr);
    WeightItem o;
    o.kind = WeightItemKind::kOmega;
    o.name = L + "engram.";
    o.rows = C;
    o.cols = H;
    o.vec = &de.omega;
    o.host_vec = ew ? &ew->omega : nullptr;
    b.item(std::move(o));
  }
}

// MODEL_SPEC 3.10.1: the DSpark stages (ratio-0 blocks with dspark_n_routed_experts experts), the
// context projection on the first, the final norm, Markov factors and confidence head on the last,
// in the names of model::bind_dspark_weights. The Markov embedding is listed as a BF16 linear (its
// payload is the [V, R] table the embedding kernel reads).
void list_dspark_weights(const model::ModelConfig& c, DeviceModelWeights& dw, const model::DsparkWeights* w,
                         Lister& b) {
  const int64_t n = c.num_nextn_predict_layers, H = c.hidden_size, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  dw.dspark.emplace();
  DeviceDspark& d = *dw.dspark;
  d.stages.assign(static_cast<size_t>(n), DeviceLayer{});
  for (int64_t s = 0; s < n; ++s) {
    model::LayerPlan p;  // ratio 0, window only
    p.layer = c.num_hidden_layers + s;
    list_layer(b, c, p, "mtp." + std::to_string(s) + ".", w ? &w->stages[static_cast<size_t>(s)] : nullptr,
               d.stages[static_cast<size_t>(s)], c.dspark_n_routed_experts);
  }
  const std::string last = "mtp." + std::to_string(n - 1) + ".";
  b.linear("mtp.0.main_proj", H, nt * H, &d.main_proj, w ? &w->main_proj : nullptr);
  b.vec("mtp.0.main_norm.weight", 1, H, &d.main_norm, w ? &w->main_norm : nullptr);
  b.vec(last + "norm.weight", 1, H, &d.norm, w ? &w->norm : nullptr);
  ops::WeightRef embed;
  if (w) {
    embed.format = quant::WeightFormat::kBF16;
    embed.data = w->markov_embed;
  }
  b.linear(last + "markov_head.embed", V, R, &d.markov_embed, w ? &embed : nullptr);
  b.linear(last + "markov_head.head", V, R, &d.markov_head, w ? &w->markov_head : nullptr);
  b.linear(last + "confidence_head.proj", 1, H + R, &d.confidence_proj, w ? &w->confidence_proj : nullptr);
}

}  // namespace

std::vector<WeightItem> list_device_weights(const model::ModelConfig& c, const model::LayerSchedule& s,
                                            DeviceModelWeights& dw, const model::ModelWeights* mw,
                                            const model::VisionWeights* vw,
                                            const model::DsparkWeights* dsw) {
  std::vector<WeightItem> items;
  Lister b(&items);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  dw.layers.assign(s.layers.size(), DeviceLayer{});
  {
    WeightItem it;
    it.kind = WeightItemKind::kEmbed;
    it.name = "embed.weight";
    it.rows = V;
    it.cols = H;
    it.data = &dw.embed;
    it.host_data = mw ? mw->embed : nullptr;
    items.push_back(std::move(it));
  }
  b.linear("head", V, H, &dw.head, mw ? &mw->head : nullptr);
  b.vec("norm.weight", 1, H, &dw.norm, mw ? &mw->norm : nullptr);
  for (size_t li = 0; li < s.layers.size(); ++li)
    list_layer(b, c, s.layers[li], "layers." + std::to_string(s.layers[li].layer) + ".",
               mw ? &mw->layers[li] : nullptr, dw.layers[li], c.n_routed_experts);
  if (c.num_nextn_predict_layers > 0) list_dspark_weights(c, dw, dsw, b);
  if (c.has_vision) list_vision_weights(c, dw, vw, b);
  return items;
}

}  // namespace ds41::gpu
