// ds41 model: binding checkpoint tensors to ModelWeights (MODEL_SPEC 2.1-2.3).
#include "model/model_weights.h"

#include <cstring>

#include "core/dtype.h"
#include "model/weight_binder.h"

namespace ds41::model {

LayerWeights bind_layer_weights(WeightBinder& b, const ModelConfig& c, const std::string& L,
                                const LayerPlan& p, int64_t n_experts) {
  const int64_t H = c.hidden_size, C = c.hc_mult, nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t M = (2 + C) * C;
  LayerWeights lw;
  lw.attn_norm = b.vec(L + "attn_norm.weight", H, DType::kBF16);
  lw.ffn_norm = b.vec(L + "ffn_norm.weight", H, DType::kBF16);
  lw.wq_a = b.linear(L + "attn.wq_a", c.q_lora_rank, H);
  lw.q_norm = b.vec(L + "attn.q_norm.weight", c.q_lora_rank, DType::kBF16);
  lw.wq_b = b.linear(L + "attn.wq_b", nh * hd, c.q_lora_rank);
  lw.wkv = b.linear(L + "attn.wkv", hd, H);
  lw.kv_norm = b.vec(L + "attn.kv_norm.weight", hd, DType::kBF16);
  lw.wo_a = b.linear(L + "attn.wo_a", c.o_groups * c.o_lora_rank, nh * hd / c.o_groups);
  lw.wo_b = b.linear(L + "attn.wo_b", H, c.o_groups * c.o_lora_rank);
  lw.attn_sink = b.vec(L + "attn.attn_sink", nh, DType::kF32);
  if (p.kv_source) {
    lw.c_wkv = b.linear(L + "attn.compressor.wkv", hd, H);
    if (p.has_gate) lw.c_wgate = b.linear(L + "attn.compressor.wgate", hd, H);
    lw.c_norm = b.vec(L + "attn.compressor.norm.weight", hd, DType::kBF16);
    lw.idx_wk = b.linear(L + "attn.indexer.wk", c.index_head_dim, hd);
    lw.idx_k_norm = b.vec(L + "attn.indexer.k_norm.weight", c.index_head_dim, DType::kBF16);
  }
  if (p.index_source) {
    lw.idx_wq_b = b.linear(L + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
    lw.idx_weights_proj = b.linear(L + "attn.indexer.weights_proj", c.index_n_heads, H);
  }
  lw.gate = b.linear(L + "ffn.gate", n_experts, H);
  lw.gate_bias = b.vec(L + "ffn.gate.bias", n_experts, DType::kF32);
  lw.gate_bias_vl = b.vec(L + "ffn.gate.bias_vl", n_experts, DType::kF32);
  const int64_t I = c.moe_intermediate_size;
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string E = L + "ffn.experts." + std::to_string(e) + ".";
    lw.experts.push_back({b.linear(E + "w1", I, H), b.linear(E + "w2", H, I), b.linear(E + "w3", I, H)});
  }
  if (c.n_shared_experts > 0) {
    const int64_t Is = I * c.n_shared_experts;
    lw.shared = {b.linear(L + "ffn.shared_experts.w1", Is, H), b.linear(L + "ffn.shared_experts.w2", H, Is),
                 b.linear(L + "ffn.shared_experts.w3", Is, H)};
  }
  for (auto [site, hw] : {std::pair{"hc_attn", &lw.hc_attn}, std::pair{"hc_ffn", &lw.hc_ffn}}) {
    hw->fn = b.f32_matrix(L + site + "_fn", M, C * H);
    hw->base = b.vec(L + site + "_base", M, DType::kF32);
    hw->scale = b.vec(L + site + "_scale", 3, DType::kF32);
  }
  if (p.engram) {
    auto ew = std::make_unique<EngramWeights>();
    const int64_t li = c.engram_index(p.layer);
    const int64_t rows =
        li < static_cast<int64_t>(c.engram_num_embeddings.size()) ? c.engram_num_embeddings[li] : 0;
    const int64_t ed = c.engram_head_dim, cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
    ew->rows = rows;
    if (const TensorRef* t = b.get(L + "engram.embed.weight", DType::kF8E4M3, {rows, ed}))
      ew->table = t->data;
    if (const TensorRef* t = b.get(L + "engram.embed.scale", DType::kF8E8M0, {rows, ed / 32}))
      ew->table_scale = t->data;
    ew->wkv = b.linear(L + "engram.wkv", (C + 1) * H, cols * ed);
    std::vector<float> qw, kw;
    for (auto [nm, dst] : {std::pair{"q_weight", &qw}, std::pair{"k_weight", &kw}}) {
      const TensorRef* t = b.get(L + "engram." + nm, DType::kBF16, {C, H});
      if (!t) continue;
      dst->resize(C * H);
      for (int64_t i = 0; i < C * H; ++i) {
        uint16_t v;
        std::memcpy(&v, t->data + 2 * i, 2);
        (*dst)[i] = bf16_to_f32(v);
      }
    }
    if (!qw.empty() && !kw.empty()) {
      ew->omega.resize(C * H);
      for (int64_t i = 0; i < C * H; ++i) ew->omega[i] = qw[i] * kw[i];
    }
    lw.engram = std::move(ew);
  }
  return lw;
}

Result<std::unique_ptr<ModelWeights>> bind_model_weights(const Checkpoint& ck, const ModelConfig& c,
                                                         const LayerSchedule& s) {
  WeightBinder b(ck);
  auto w = std::make_unique<ModelWeights>();
  const int64_t H = c.hidden_size, V = c.vocab_size;
  if (const TensorRef* e = b.get("embed.weight", DType::kBF16, {V, H})) w->embed = e->data;
  w->head = b.linear("head", V, H);
  w->norm = b.vec("norm.weight", H, DType::kBF16);
  for (const LayerPlan& p : s.layers)
    w->layers.push_back(
        bind_layer_weights(b, c, "layers." + std::to_string(p.layer) + ".", p, c.n_routed_experts));
  if (!b.errors.empty()) {
    std::string m = ck.dir() + ": checkpoint does not match config.json (" + std::to_string(b.errors.size()) +
                    " problems):";
    for (auto& e : b.errors) m += "\n  " + e;
    return invalid_argument(m);
  }
  w->names_.swap(b.names());  // keep WeightRef::name strings alive with the view
  return w;
}

}  // namespace ds41::model
