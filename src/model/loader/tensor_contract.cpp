// ds41 model/loader: tensor contract derivation (MODEL_SPEC 2.2-2.5) and checkpoint check.
#include "model/loader/tensor_contract.h"

#include <algorithm>
#include <limits>

#include "model/loader/safetensors.h"
#include "quant/weight_formats.h"

namespace ds41::model {

const char* param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::kEmbedding: return "embedding";
    case ParamGroup::kBackbone: return "backbone";
    case ParamGroup::kRoutedExpert: return "routed_experts";
    case ParamGroup::kEngramTable: return "engram_tables";
    case ParamGroup::kEngramProj: return "engram_proj";
    case ParamGroup::kDspark: return "dspark";
    case ParamGroup::kVision: return "vision";
  }
  return "?";
}

const char* mismatch_kind_name(ContractMismatch::Kind k) {
  switch (k) {
    case ContractMismatch::Kind::kMissing: return "missing";
    case ContractMismatch::Kind::kUnexpected: return "unexpected";
    case ContractMismatch::Kind::kWrongDtype: return "wrong dtype";
    case ContractMismatch::Kind::kWrongShape: return "wrong shape";
  }
  return "?";
}

std::string shape_to_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t ContractParam::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t ExpectedTensor::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorContract::payload_bytes() const {
  uint64_t s = 0;
  for (const auto& t : tensors) s += t.nbytes();
  return s;
}

std::map<DType, DtypeTotals> TensorContract::by_dtype() const {
  std::map<DType, DtypeTotals> m;
  for (const auto& t : tensors) {
    m[t.dtype].count += 1;
    m[t.dtype].bytes += t.nbytes();
  }
  return m;
}

std::map<ParamGroup, uint64_t> TensorContract::params_by_group() const {
  std::map<ParamGroup, uint64_t> m;
  for (const auto& p : params) m[p.group] += static_cast<uint64_t>(p.numel());
  return m;
}

const ExpectedTensor* TensorContract::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors[static_cast<size_t>(it->second)];
}

namespace {

// Accumulates params and the stored tensors they expand to; collects shape errors.
class ContractBuilder {
 public:
  explicit ContractBuilder(TensorContract* out) : out_(out) {}

  void plain(const std::string& name, DType dt, std::vector<int64_t> shape, ParamRole role,
             ParamGroup group) {
    add_param({name, ParamFormat::kPlain, dt, std::move(shape), role, group});
  }
  void bf16(const std::string& name, std::vector<int64_t> shape, ParamRole role, ParamGroup group) {
    plain(name, DType::kBF16, std::move(shape), role, group);
  }
  void f32(const std::string& name, std::vector<int64_t> shape, ParamRole role, ParamGroup group) {
    plain(name, DType::kF32, std::move(shape), role, group);
  }
  // MODEL_SPEC 2.1 FP8 linear, logical [out, in].
  void fp8(const std::string& p, int64_t out, int64_t in, ParamRole role, ParamGroup group) {
    add_param({p, ParamFormat::kFp8Linear, DType::kF8E4M3, {out, in}, role, group});
  }
  // MODEL_SPEC 2.1 FP4 routed expert, logical [out, in]; in must be a multiple of 32.
  void fp4(const std::string& p, int64_t out, int64_t in, ParamRole role, ParamGroup group) {
    if (in % quant::kFp4Block)
      error(p + ": FP4 input width " + std::to_string(in) + " is not a multiple of 32");
    add_param({p, ParamFormat::kFp4Expert, DType::kI8, {out, in}, role, group});
  }
  // MODEL_SPEC 2.1 Engram table [rows, dim]; dim must be a multiple of 32.
  void engram_table(const std::string& p, int64_t rows, int64_t dim) {
    if (dim % quant::kEngramBlock)
      error(p + ": Engram row width " + std::to_string(dim) + " is not a multiple of 32");
    add_param({p,
               ParamFormat::kEngramTable,
               DType::kF8E4M3,
               {rows, dim},
               ParamRole::kEngramTable,
               ParamGroup::kEngramTable});
  }
  void error(std::string e) { errors_.push_back(std::move(e)); }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  void add_param(ContractParam p) {
    for (int64_t d : p.shape)
      if (d <= 0) error(p.name + ": non-positive dimension in " + shape_to_string(p.shape));
    int32_t pi = static_cast<int32_t>(out_->params.size());
    const int64_t out = p.shape.empty() ? 0 : p.shape[0];
    const int64_t in = p.shape.size() > 1 ? p.shape[1] : 0;
    switch (p.format) {
      case ParamFormat::kPlain: out_->tensors.push_back({p.name, p.dtype, p.shape, pi, false}); break;
      case ParamFormat::kFp8Linear:
        out_->tensors.push_back({p.name + ".weight", DType::kF8E4M3, {out, in}, pi, false});
        out_->tensors.push_back(
            {p.name + ".scale",
             DType::kF8E8M0,
             {quant::ceil_div(out, quant::kFp8Tile), quant::ceil_div(in, quant::kFp8Tile)},
             pi,
             true});
        break;
      case ParamFormat::kFp4Expert:
        out_->tensors.push_back({p.name + ".weight", DType::kI8, {out, in / 2}, pi, false});
        out_->tensors.push_back({p.name + ".scale", DType::kF8E8M0, {out, in / quant::kFp4Block}, pi, true});
        break;
      case ParamFormat::kEngramTable:
        out_->tensors.push_back({p.name + ".weight", DType::kF8E4M3, {out, in}, pi, false});
        out_->tensors.push_back(
            {p.name + ".scale", DType::kF8E8M0, {out, in / quant::kEngramBlock}, pi, true});
        break;
    }
    out_->params.push_back(std::move(p));
  }
  TensorContract* out_;
  std::vector<std::string> errors_;
};

// MODEL_SPEC 2.3 "Always present" block set; also the DSpark stages (2.4) with their expert count.
void add_block(ContractBuilder& b, const ModelConfig& c, const std::string& p, int64_t n_experts,
               ParamGroup group, ParamGroup expert_group) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t moe = c.moe_intermediate_size, shared = c.moe_intermediate_size * c.n_shared_experts;
  const int64_t hc = c.hc_mult, hc_rows = (2 + hc) * hc;  // MODEL_SPEC 3.3: pre(C) + post(C) + Comb(CxC)
  b.bf16(p + "attn_norm.weight", {D}, ParamRole::kNorm, group);
  b.bf16(p + "ffn_norm.weight", {D}, ParamRole::kNorm, group);
  b.fp8(p + "attn.wq_a", c.q_lora_rank, D, ParamRole::kLinear, group);
  b.bf16(p + "attn.q_norm.weight", {c.q_lora_rank}, ParamRole::kNorm, group);
  b.fp8(p + "attn.wq_b", H * hd, c.q_lora_rank, ParamRole::kLinear, group);
  b.fp8(p + "attn.wkv", hd, D, ParamRole::kLinear, group);
  b.bf16(p + "attn.kv_norm.weight", {hd}, ParamRole::kNorm, group);
  // wo_a: o_groups x o_lora_rank outputs, each group reads H*hd/o_groups inputs.
  b.fp8(p + "attn.wo_a", c.o_groups * c.o_lora_rank, H * hd / c.o_groups, ParamRole::kLinear, group);
  b.fp8(p + "attn.wo_b", D, c.o_groups * c.o_lora_rank, ParamRole::kLinearOut, group);
  b.f32(p + "attn.attn_sink", {H}, ParamRole::kAttnSink, group);
  b.bf16(p + "ffn.gate.weight", {n_experts, D}, ParamRole::kRouterWeight, group);
  b.f32(p + "ffn.gate.bias", {n_experts}, ParamRole::kRouterBias, group);
  b.f32(p + "ffn.gate.bias_vl", {n_experts}, ParamRole::kRouterBias, group);
  for (int64_t e = 0; e < n_experts; ++e) {
    const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    b.fp4(ep + "w1", moe, D, ParamRole::kExpertUp, expert_group);
    b.fp4(ep + "w2", D, moe, ParamRole::kExpertDown, expert_group);
    b.fp4(ep + "w3", moe, D, ParamRole::kExpertUp, expert_group);
  }
  if (shared > 0) {
    b.fp8(p + "ffn.shared_experts.w1", shared, D, ParamRole::kSharedUp, group);
    b.fp8(p + "ffn.shared_experts.w2", D, shared, ParamRole::kSharedDown, group);
    b.fp8(p + "ffn.shared_experts.w3", shared, D, ParamRole::kSharedUp, group);
  }
  for (const char* site : {"attn", "ffn"}) {
    const std::string s = p + "hc_" + site;
    b.f32(s + "_fn", {hc_rows, hc * D}, ParamRole::kHcFn, group);
    b.f32(s + "_base", {hc_rows}, ParamRole::kHcBase, group);
    b.f32(s + "_scale", {3}, ParamRole::kHcScale, group);  // gamma_0..2 (MODEL_SPEC 3.3)
  }
}

}  // namespace

Result<TensorContract> derive_tensor_contract(const ModelConfig& c, const LayerSchedule& s) {
  TensorContract out;
  ContractBuilder b(&out);
  const int64_t D = c.hidden_size, V = c.vocab_size;
  if (static_cast<int64_t>(s.layers.size()) != c.num_hidden_layers)
    return invalid_argument("layer schedule has " + std::to_string(s.layers.size()) + " layers, config has " +
                            std::to_string(c.num_hidden_layers));
  if (c.o_groups <= 0 || (c.num_attention_heads * c.head_dim) % c.o_groups)
    b.error("num_attention_heads * head_dim must be a multiple of o_groups");

  // MODEL_SPEC 2.2 global tensors.
  b.bf16("embed.weight", {V, D}, ParamRole::kEmbed, ParamGroup::kEmbedding);

  // MODEL_SPEC 2.3 backbone blocks.
  for (const LayerPlan& lp : s.layers) {
    const std::string p = "layers." + std::to_string(lp.layer) + ".";
    add_block(b, c, p, c.n_routed_experts, ParamGroup::kBackbone, ParamGroup::kRoutedExpert);
    if (lp.kv_source) {
      b.bf16(p + "attn.compressor.wkv.weight", {c.head_dim, D}, ParamRole::kCompressorWkv,
             ParamGroup::kBackbone);
      if (lp.has_gate)  // ratio > 1 only (MODEL_SPEC 7.7)
        b.bf16(p + "attn.compressor.wgate.weight", {c.head_dim, D}, ParamRole::kCompressorWgate,
               ParamGroup::kBackbone);
      b.bf16(p + "attn.compressor.norm.weight", {c.head_dim}, ParamRole::kNorm, ParamGroup::kBackbone);
      b.bf16(p + "attn.indexer.wk.weight", {c.index_head_dim, c.head_dim}, ParamRole::kIndexerWk,
             ParamGroup::kBackbone);
      b.bf16(p + "attn.indexer.k_norm.weight", {c.index_head_dim}, ParamRole::kNorm, ParamGroup::kBackbone);
    }
    if (lp.index_source) {
      b.fp8(p + "attn.indexer.wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank, ParamRole::kLinear,
            ParamGroup::kBackbone);
      b.bf16(p + "attn.indexer.weights_proj.weight", {c.index_n_heads, D}, ParamRole::kIndexerWeightsProj,
             ParamGroup::kBackbone);
    }
    if (lp.engram) {
      const int64_t e = c.engram_index(lp.layer);
      if (e < 0 || e >= static_cast<int64_t>(c.engram_num_embeddings.size())) {
        b.error(p + "engram: no engram_num_embeddings entry for layer " + std::to_string(lp.layer));
        continue;
      }
      const int64_t rows = c.engram_num_embeddings[static_cast<size_t>(e)];
      const int64_t n_orders = c.engram_max_ngram_size - 1;  // n = 2..max (MODEL_SPEC 3.2.3)
      b.engram_table(p + "engram.embed", rows, c.engram_head_dim);
      // MODEL_SPEC 3.2.4: u = 24 gathered rows (orders x heads x head_dim) -> hc_mult keys + 1 value.
      b.fp8(p + "engram.wkv", (c.hc_mult + 1) * D, n_orders * c.engram_n_heads * c.engram_head_dim,
            ParamRole::kLinear, ParamGroup::kEngramProj);
      b.bf16(p + "engram.q_weight", {c.hc_mult, D}, ParamRole::kEngramQk, ParamGroup::kEngramProj);
      b.bf16(p + "engram.k_weight", {c.hc_mult, D}, ParamRole::kEngramQk, ParamGroup::kEngramProj);
    }
  }

  // MODEL_SPEC 2.4 DSpark stages.
  const int64_t n_stages = c.num_nextn_predict_layers;
  if (n_stages > 0) {
    if (c.dspark_n_routed_experts <= 0)
      b.error("dspark_n_routed_experts must be positive when num_nextn_predict_layers > 0");
    if (c.dspark_target_layer_ids.empty())
      b.error("dspark_target_layer_ids must not be empty when num_nextn_predict_layers > 0");
    if (c.dspark_markov_rank <= 0)
      b.error("dspark_markov_rank must be positive when num_nextn_predict_layers > 0");
    if (!b.errors().empty()) {
      std::string m = "tensor contract:";
      for (auto& e : b.errors()) m += "\n" + e;
      return invalid_argument(m);
    }
    for (int64_t i = 0; i < n_stages; ++i)
      add_block(b, c, "mtp." + std::to_string(i) + ".", c.dspark_n_routed_experts, ParamGroup::kDspark,
                ParamGroup::kDspark);
    // MODEL_SPEC 3.10: the stream means of the target layers are concatenated before main_proj.
    const int64_t n_targets = static_cast<int64_t>(c.dspark_target_layer_ids.size());
    b.fp8("mtp.0.main_proj", D, n_targets * D, ParamRole::kLinear, ParamGroup::kDspark);
    b.bf16("mtp.0.main_norm.weight", {D}, ParamRole::kNorm, ParamGroup::kDspark);
    const std::string last = "mtp." + std::to_string(n_stages - 1) + ".";
    const int64_t R = c.dspark_markov_rank;
    b.bf16(last + "norm.weight", {D}, ParamRole::kNorm, ParamGroup::kDspark);
    b.bf16(last + "markov_head.embed.weight", {V, R}, ParamRole::kDense, ParamGroup::kDspark);
    b.bf16(last + "markov_head.head.weight", {V, R}, ParamRole::kHead, ParamGroup::kDspark);
    b.bf16(last + "confidence_head.proj.weight", {1, D + R}, ParamRole::kDense, ParamGroup::kDspark);
  }

  b.bf16("norm.weight", {D}, ParamRole::kNorm, ParamGroup::kEmbedding);
  b.bf16("head.weight", {V, D}, ParamRole::kHead, ParamGroup::kEmbedding);

  // MODEL_SPEC 2.2 image markers and 2.5 vision tower + aligner (only with vision_config).
  if (c.has_vision) {
    for (const char* n : {"image_start", "image_end", "image_newline"})
      b.bf16(n, {D}, ParamRole::kImageMarker, ParamGroup::kVision);
    const int64_t vh = c.vision_hidden_size, vi = c.vision_intermediate_size, ps = c.vision_patch_size;
    const int64_t ds = c.vision_downsample_ratio;
    if (vh <= 0 || vi <= 0 || ps <= 0 || ds <= 0 || c.vision_num_layers <= 0)
      b.error(
          "vision_config: hidden_size, intermediate_size, patch_size, downsample_ratio and num_hidden_layers "
          "must be positive");
    b.bf16("vision.patch_embed.proj.weight", {vh, 3 * ps * ps}, ParamRole::kDense,
           ParamGroup::kVision);  // RGB patches
    b.bf16("vision.patch_embed.proj.bias", {vh}, ParamRole::kBias, ParamGroup::kVision);
    b.bf16("vision.norm.weight", {vh}, ParamRole::kNorm, ParamGroup::kVision);
    for (int64_t i = 0; i < c.vision_num_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      b.bf16(p + "attn.wqkv.weight", {3 * vh, vh}, ParamRole::kDense, ParamGroup::kVision);
      b.bf16(p + "attn.wqkv.bias", {3 * vh}, ParamRole::kBias, ParamGroup::kVision);
      b.bf16(p + "attn.wo.weight", {vh, vh}, ParamRole::kDense, ParamGroup::kVision);
      b.bf16(p + "attn.wo.bias", {vh}, ParamRole::kBias, ParamGroup::kVision);
      b.bf16(p + "mlp.w1.weight", {2 * vi, vh}, ParamRole::kDense,
             ParamGroup::kVision);  // gate rows, then up rows
      b.bf16(p + "mlp.w2.weight", {vh, vi}, ParamRole::kDense, ParamGroup::kVision);
      b.bf16(p + "norm1.weight", {vh}, ParamRole::kNorm, ParamGroup::kVision);
      b.bf16(p + "norm2.weight", {vh}, ParamRole::kNorm, ParamGroup::kVision);
    }
    // MODEL_SPEC 3.11 aligner: ds x ds windows of ViT outputs, flattened.
    b.bf16("aligner.w1.weight", {D, vh * ds * ds}, ParamRole::kDense, ParamGroup::kVision);
    b.bf16("aligner.w1.bias", {D}, ParamRole::kBias, ParamGroup::kVision);
    b.bf16("aligner.w2.weight", {D, D}, ParamRole::kDense, ParamGroup::kVision);
    b.bf16("aligner.w2.bias", {D}, ParamRole::kBias, ParamGroup::kVision);
  }

  if (!b.errors().empty()) {
    std::string m = "tensor contract:";
    for (auto& e : b.errors()) m += "\n" + e;
    return invalid_argument(m);
  }
  for (size_t i = 0; i < out.tensors.size(); ++i) {
    if (!out.index_.emplace(out.tensors[i].name, static_cast<int32_t>(i)).second)
      return internal_error("tensor contract: duplicate tensor name '" + out.tensors[i].name + "'");
  }
  return out;
}

std::string ContractMismatch::to_string() const {
  std::string r = std::string(mismatch_kind_name(kind)) + ": tensor '" + tensor + "'";
  if (!file.empty()) r += " in " + file;
  if (!expected.empty()) r += ", expected " + expected;
  if (!found.empty()) r += ", found " + found;
  return r;
}

std::string ContractReport::to_string(size_t max_lines) const {
  if (ok())
    return "contract ok: " + std::to_string(matched_tensors) + " of " + std::to_string(expected_tensors) +
           " tensors match";
  std::string r = "contract violated: " + std::to_string(mismatches.size()) + " mismatch(es) (" +
                  std::to_string(expected_tensors) + " expected tensors, " + std::to_string(found_tensors) +
                  " found, " + std::to_string(matched_tensors) + " match)";
  for (size_t i = 0; i < mismatches.size() && i < max_lines; ++i) r += "\n  " + mismatches[i].to_string();
  if (mismatches.size() > max_lines)
    r += "\n  ... and " + std::to_string(mismatches.size() - max_lines) + " more";
  return r;
}

ContractReport check_checkpoint(const Checkpoint& ck, const TensorContract& contract) {
  using Kind = ContractMismatch::Kind;
  ContractReport rep;
  rep.expected_tensors = contract.tensors.size();
  rep.found_tensors = ck.tensors().size();
  auto desc = [](DType dt, const std::vector<int64_t>& shape) {
    return std::string(dtype_name(dt)) + " " + shape_to_string(shape);
  };
  // Unexpected / wrong dtype / wrong shape, in checkpoint (name) order.
  for (const auto& [name, ref] : ck.tensors()) {
    const std::string file = ref.file ? ref.file->path() : std::string();
    const ExpectedTensor* want = contract.find(name);
    if (!want) {
      rep.mismatches.push_back({Kind::kUnexpected, file, name, "", desc(ref.info->dtype, ref.info->shape)});
      continue;
    }
    bool ok = true;
    if (ref.info->dtype != want->dtype) {
      rep.mismatches.push_back({Kind::kWrongDtype, file, name, desc(want->dtype, want->shape),
                                desc(ref.info->dtype, ref.info->shape)});
      ok = false;
    }
    if (ref.info->shape != want->shape) {
      rep.mismatches.push_back({Kind::kWrongShape, file, name, desc(want->dtype, want->shape),
                                desc(ref.info->dtype, ref.info->shape)});
      ok = false;
    }
    if (ok) ++rep.matched_tensors;
  }
  for (const ExpectedTensor& t : contract.tensors)
    if (!ck.find(t.name)) rep.mismatches.push_back({Kind::kMissing, "", t.name, desc(t.dtype, t.shape), ""});
  return rep;
}

Status validate_checkpoint(const Checkpoint& ck, const TensorContract& contract) {
  ContractReport r = check_checkpoint(ck, contract);
  if (r.ok()) return ok_status();
  return invalid_argument(ck.dir() + ": " + r.to_string(std::numeric_limits<size_t>::max()));
}

}  // namespace ds41::model
