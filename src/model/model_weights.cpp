// ds41 model: binding checkpoint tensors to ModelWeights (MODEL_SPEC 2.1-2.3).
#include "model/model_weights.h"

#include <cstring>

#include "core/dtype.h"

namespace ds41::model {
namespace {

using ops::WeightFormat;
using ops::WeightRef;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

class Binder {
 public:
  explicit Binder(const Checkpoint& ck) : ck_(ck) {}
  std::vector<std::string> errors;

  const TensorRef* get(const std::string& name, DType dt, const std::vector<int64_t>& shape) {
    const TensorRef* t = ck_.find(name);
    if (!t) {
      errors.push_back(name + ": missing");
      return nullptr;
    }
    if (t->info->dtype != dt) {
      errors.push_back(name + ": dtype " + dtype_name(t->info->dtype) + ", expected " + dtype_name(dt));
      return nullptr;
    }
    if (t->info->shape != shape) {
      errors.push_back(name + ": shape " + shape_str(t->info->shape) + ", expected " + shape_str(shape));
      return nullptr;
    }
    return t;
  }

  // BF16 or F32 vector -> float.
  std::vector<float> vec(const std::string& name, int64_t n, DType dt) {
    std::vector<float> v;
    const TensorRef* t = get(name, dt, {n});
    if (!t) return v;
    v.resize(n);
    if (dt == DType::kBF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, t->data + 2 * i, 2);
        v[i] = bf16_to_f32(b);
      }
    } else {
      std::memcpy(v.data(), t->data, n * sizeof(float));
    }
    return v;
  }
  std::vector<float> f32_matrix(const std::string& name, int64_t r, int64_t c) {
    std::vector<float> v;
    const TensorRef* t = get(name, DType::kF32, {r, c});
    if (!t) return v;
    v.resize(r * c);
    std::memcpy(v.data(), t->data, r * c * sizeof(float));
    return v;
  }

  // A linear weight `base` of logical shape [out, in], in whichever checkpoint format it has.
  WeightRef linear(const std::string& base, int64_t out, int64_t in) {
    WeightRef w;
    const std::string wn = base + ".weight";
    const TensorRef* t = ck_.find(wn);
    if (!t) {
      errors.push_back(wn + ": missing");
      return w;
    }
    names_.push_back(std::make_unique<std::string>(base));
    w.name = names_.back()->c_str();
    w.out_dim = out;
    w.in_dim = in;
    switch (t->info->dtype) {
      case DType::kF8E4M3: {
        const TensorRef* q = get(wn, DType::kF8E4M3, {out, in});
        const TensorRef* s = get(base + ".scale", DType::kF8E8M0, {(out + 31) / 32, (in + 31) / 32});
        if (!q || !s) return w;
        w.format = WeightFormat::kFp8Tiles;
        w.data = q->data;
        w.scale = s->data;
        return w;
      }
      case DType::kI8: {
        if (in % 32 != 0) {
          errors.push_back(wn + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
          return w;
        }
        const TensorRef* q = get(wn, DType::kI8, {out, in / 2});
        const TensorRef* s = get(base + ".scale", DType::kF8E8M0, {out, in / 32});
        if (!q || !s) return w;
        w.format = WeightFormat::kFp4Rows;
        w.data = q->data;
        w.scale = s->data;
        return w;
      }
      case DType::kBF16:
      case DType::kF32: {
        const TensorRef* q = get(wn, t->info->dtype, {out, in});
        if (!q) return w;
        w.format = t->info->dtype == DType::kBF16 ? WeightFormat::kBF16 : WeightFormat::kF32;
        w.data = q->data;
        if (w.format == WeightFormat::kF32 && reinterpret_cast<uintptr_t>(q->data) % alignof(float) != 0) {
          errors.push_back(wn + ": F32 data is not 4-byte aligned in the file");
          w.format = WeightFormat::kNone;
        }
        return w;
      }
      default:
        errors.push_back(wn + ": unsupported dtype " + std::string(dtype_name(t->info->dtype)) +
                         " for a linear weight");
        return w;
    }
  }
  std::vector<std::unique_ptr<std::string>>& names() { return names_; }

 private:
  const Checkpoint& ck_;
  std::vector<std::unique_ptr<std::string>> names_;
};

}  // namespace

Result<std::unique_ptr<ModelWeights>> bind_model_weights(const Checkpoint& ck, const ModelConfig& c,
                                                         const LayerSchedule& s) {
  Binder b(ck);
  auto w = std::make_unique<ModelWeights>();
  const int64_t H = c.hidden_size, V = c.vocab_size, C = c.hc_mult, nh = c.num_attention_heads,
                hd = c.head_dim;
  const int64_t M = (2 + C) * C;
  if (const TensorRef* e = b.get("embed.weight", DType::kBF16, {V, H})) w->embed = e->data;
  w->head = b.linear("head", V, H);
  w->norm = b.vec("norm.weight", H, DType::kBF16);
  for (const LayerPlan& p : s.layers) {
    const std::string L = "layers." + std::to_string(p.layer) + ".";
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
    lw.gate = b.linear(L + "ffn.gate", c.n_routed_experts, H);
    lw.gate_bias = b.vec(L + "ffn.gate.bias", c.n_routed_experts, DType::kF32);
    lw.gate_bias_vl = b.vec(L + "ffn.gate.bias_vl", c.n_routed_experts, DType::kF32);
    const int64_t I = c.moe_intermediate_size;
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
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
    w->layers.push_back(std::move(lw));
  }
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
