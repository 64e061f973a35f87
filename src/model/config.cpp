// ds41 model: config.json parsing and validation (MODEL_SPEC 1.2-1.4, 7.16).
#include "model/config.h"

#include "core/json_depth.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ds41::model {

using json = nlohmann::json;

namespace {

// Reads typed fields from one JSON object, collecting every problem (key path named).
class FieldReader {
 public:
  FieldReader(const json& obj, std::string path, std::vector<std::string>* errors)
      : obj_(obj), path_(std::move(path)), errors_(errors) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  void i64(const char* key, int64_t& out, bool required = true) {
    if (!has(key)) return missing(key, required);
    const json& v = obj_.at(key);
    if (!to_i64(v, out)) bad(key, "an integer", v);
  }
  void f64(const char* key, double& out, bool required = true) {
    if (!has(key)) return missing(key, required);
    const json& v = obj_.at(key);
    if (v.is_number()) out = v.get<double>();
    else bad(key, "a number", v);
  }
  void boolean(const char* key, bool& out, bool required = true) {
    if (!has(key)) return missing(key, required);
    const json& v = obj_.at(key);
    if (v.is_boolean()) out = v.get<bool>();
    else bad(key, "a boolean", v);
  }
  void str(const char* key, std::string& out, bool required = true) {
    if (!has(key)) return missing(key, required);
    const json& v = obj_.at(key);
    if (v.is_string()) out = v.get<std::string>();
    else bad(key, "a string", v);
  }
  void i64_list(const char* key, std::vector<int64_t>& out, bool required = true) {
    if (!has(key)) return missing(key, required);
    const json& v = obj_.at(key);
    if (!v.is_array()) return bad(key, "a list of integers", v);
    out.clear();
    for (const json& e : v) {
      int64_t x = 0;
      if (!e.is_number_integer() || !to_i64(e, x)) return bad(key, "a list of integers", v);
      out.push_back(x);
    }
  }
  const std::string& path() const { return path_; }

 private:
  // JSON number -> int64 without undefined behaviour: unsigned values above INT64_MAX and
  // non-integral or out-of-range floats (e.g. 3.3e83, found by the config fuzzer: the old
  // double -> int64 cast was UB) are refused.
  static bool to_i64(const json& v, int64_t& out) {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return false;
      out = static_cast<int64_t>(u);
      return true;
    }
    if (v.is_number_integer()) {
      out = v.get<int64_t>();
      return true;
    }
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (!(d >= -0x1p63 && d < 0x1p63) || d != std::trunc(d)) return false;
      out = static_cast<int64_t>(d);
      return true;
    }
    return false;
  }
  void missing(const char* key, bool required) {
    if (required) errors_->push_back(path_ + key + ": missing");
  }
  void bad(const char* key, const char* want, const json& v) {
    std::string dump = v.dump();
    if (dump.size() > 60) dump = dump.substr(0, 57) + "...";
    errors_->push_back(path_ + key + ": expected " + want + ", found " + dump);
  }
  const json& obj_;
  std::string path_;
  std::vector<std::string>* errors_;
};

std::string join_errors(const std::vector<std::string>& e) {
  std::string s;
  for (size_t i = 0; i < e.size(); ++i) s += (i ? "\n" : "") + e[i];
  return s;
}

}  // namespace

bool ModelConfig::is_engram_layer(int64_t l) const { return engram_index(l) >= 0; }
int64_t ModelConfig::engram_index(int64_t l) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), l);
  return it == engram_layer_ids.end() ? -1 : it - engram_layer_ids.begin();
}

Result<ModelConfig> parse_model_config(std::string_view text) {
  // Nesting is bounded before parsing: error messages dump() offending values, and dump()
  // recurses, so a value nested ~60k deep overflowed the stack (found by
  // tests/fuzz/mutation/parser_mutation_test.cpp). Real configs nest 3-4 levels.
  constexpr int kMaxConfigDepth = 32;
  if (json_nesting_exceeds(text, kMaxConfigDepth))
    return invalid_argument("config.json: JSON nesting deeper than " + std::to_string(kMaxConfigDepth) + " levels");
  json root = json::parse(text.begin(), text.end(), nullptr, false);
  if (root.is_discarded()) return invalid_argument("config.json: not valid JSON");
  if (!root.is_object()) return invalid_argument("config.json: top level is not an object");
  std::vector<std::string> errors;
  ModelConfig c;
  FieldReader r(root, "", &errors);
  r.str("model_type", c.model_type, false);
  r.i64("bos_token_id", c.bos_token_id, false);
  r.i64("eos_token_id", c.eos_token_id, false);
  r.i64("pad_token_id", c.pad_token_id, false);
  r.i64("image_token_id", c.image_token_id, false);
  if (root.contains("quantization_config")) {
    const json& q = root["quantization_config"];
    if (!q.is_object()) {
      errors.push_back("quantization_config: expected an object");
    } else {
      FieldReader qr(q, "quantization_config.", &errors);
      qr.i64_list("weight_block_size", c.weight_block_size, false);
      qr.str("scale_fmt", c.scale_fmt, false);
      qr.str("expert_dtype", c.expert_dtype, false);
    }
  }
  // The released file nests the language model under text_config; a flat file is accepted too.
  const json* tcp = &root;
  std::string tpath;
  if (root.contains("text_config")) {
    if (!root["text_config"].is_object()) return invalid_argument("config.json: text_config is not an object");
    tcp = &root["text_config"];
    tpath = "text_config.";
  }
  const json& tc = *tcp;
  FieldReader t(tc, tpath, &errors);
  t.i64("vocab_size", c.vocab_size);
  t.i64("hidden_size", c.hidden_size);
  t.i64("num_hidden_layers", c.num_hidden_layers);
  t.i64("num_nextn_predict_layers", c.num_nextn_predict_layers, false);
  t.i64("num_attention_heads", c.num_attention_heads);
  t.i64("num_key_value_heads", c.num_key_value_heads, false);
  t.i64("head_dim", c.head_dim);
  t.i64("qk_rope_head_dim", c.qk_rope_head_dim);
  t.i64("q_lora_rank", c.q_lora_rank);
  t.i64("o_groups", c.o_groups);
  t.i64("o_lora_rank", c.o_lora_rank);
  t.i64("sliding_window", c.sliding_window);
  t.f64("rope_theta", c.rope_theta, false);
  t.f64("compress_rope_theta", c.compress_rope_theta, false);
  if (t.has("rope_scaling")) {
    const json& rs = tc["rope_scaling"];
    if (!rs.is_object()) {
      errors.push_back(tpath + "rope_scaling: expected an object");
    } else {
      FieldReader rr(rs, tpath + "rope_scaling.", &errors);
      if (rs.contains("rope_type")) rr.str("rope_type", c.rope_scaling.type);
      else rr.str("type", c.rope_scaling.type, false);
      rr.f64("factor", c.rope_scaling.factor);
      rr.f64("beta_fast", c.rope_scaling.beta_fast, false);
      rr.f64("beta_slow", c.rope_scaling.beta_slow, false);
      rr.i64("original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings);
    }
  }
  t.i64("max_position_embeddings", c.max_position_embeddings, false);
  t.i64_list("compress_ratios", c.compress_ratios);
  t.i64_list("kv_source_layer_ids", c.kv_source_layer_ids);
  t.i64_list("index_source_layer_ids", c.index_source_layer_ids);
  t.i64("candidate_source_layer_id", c.candidate_source_layer_id, false);
  t.i64("candidate_topk_blocks", c.candidate_topk_blocks, false);
  t.i64("candidate_block_size", c.candidate_block_size, false);
  t.i64("index_n_heads", c.index_n_heads);
  t.i64("index_head_dim", c.index_head_dim);
  t.i64("index_topk", c.index_topk);
  t.i64("n_routed_experts", c.n_routed_experts);
  t.i64("n_shared_experts", c.n_shared_experts, false);
  t.i64("num_experts_per_tok", c.num_experts_per_tok);
  t.i64("moe_intermediate_size", c.moe_intermediate_size);
  t.str("scoring_func", c.scoring_func, false);
  t.str("topk_method", c.topk_method, false);
  t.boolean("norm_topk_prob", c.norm_topk_prob, false);
  t.f64("routed_scaling_factor", c.routed_scaling_factor, false);
  t.f64("swiglu_limit", c.swiglu_limit, false);
  t.f64("gate_temp", c.gate_temp, false);
  t.i64("hc_mult", c.hc_mult, false);
  t.i64("hc_sinkhorn_iters", c.hc_sinkhorn_iters, false);
  t.f64("hc_eps", c.hc_eps, false);
  t.f64("rms_norm_eps", c.rms_norm_eps, false);
  t.i64_list("engram_layer_ids", c.engram_layer_ids, false);
  bool has_engram = !c.engram_layer_ids.empty();
  t.i64_list("engram_num_embeddings", c.engram_num_embeddings, has_engram);
  t.i64("engram_max_ngram_size", c.engram_max_ngram_size, has_engram);
  t.i64("engram_n_heads", c.engram_n_heads, has_engram);
  t.i64("engram_head_dim", c.engram_head_dim, has_engram);
  t.i64("engram_vocab_size", c.engram_vocab_size, has_engram);
  t.i64("engram_compressed_vocab_size", c.engram_compressed_vocab_size, has_engram);
  // MODEL_SPEC 7.16: released spelling engram_pad_token_id; HF spelling engram_pad_id.
  if (t.has("engram_pad_token_id") && t.has("engram_pad_id")) {
    int64_t a = 0, b = 0;
    t.i64("engram_pad_token_id", a);
    t.i64("engram_pad_id", b);
    if (a != b) errors.push_back(tpath + "engram_pad_token_id (" + std::to_string(a) + ") and engram_pad_id (" +
                                 std::to_string(b) + ") disagree");
    c.engram_pad_token_id = a;
  } else if (t.has("engram_pad_token_id")) {
    t.i64("engram_pad_token_id", c.engram_pad_token_id);
  } else {
    t.i64("engram_pad_id", c.engram_pad_token_id, has_engram);
  }
  t.i64("dspark_block_size", c.dspark_block_size, false);
  t.i64("dspark_markov_rank", c.dspark_markov_rank, false);
  t.i64("dspark_n_routed_experts", c.dspark_n_routed_experts, false);
  t.i64("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok, false);
  t.i64("dspark_noise_token_id", c.dspark_noise_token_id, false);
  t.i64_list("dspark_target_layer_ids", c.dspark_target_layer_ids, false);
  t.boolean("tie_word_embeddings", c.tie_word_embeddings, false);
  if (root.contains("vision_config") && !root["vision_config"].is_null()) {
    const json& vc = root["vision_config"];
    if (!vc.is_object()) {
      errors.push_back("vision_config: expected an object");
    } else {
      c.has_vision = true;
      FieldReader v(vc, "vision_config.", &errors);
      v.i64("hidden_size", c.vision_hidden_size);
      v.i64("intermediate_size", c.vision_intermediate_size);
      v.i64("num_hidden_layers", c.vision_num_layers);
      v.i64("num_attention_heads", c.vision_num_heads);
      v.i64("patch_size", c.vision_patch_size);
      v.i64("downsample_ratio", c.vision_downsample_ratio);
      // MODEL_SPEC 1.4 preprocessing keys; absent ones keep the released values.
      v.f64("rope_theta", c.vision_rope_theta, false);
      v.i64("max_image_tokens", c.vision_max_image_tokens, false);
      v.i64("min_pixels", c.vision_min_pixels, false);
      if (vc.contains("max_wh_ratio") && !vc["max_wh_ratio"].is_null()) v.i64("max_wh_ratio", c.vision_max_wh_ratio);
    }
  }
  if (!errors.empty()) return invalid_argument("config.json:\n" + join_errors(errors));
  Status v = validate_model_config(c);
  if (!v.ok()) return v;
  return c;
}

Status validate_model_config(const ModelConfig& c) {
  std::vector<std::string> e;
  auto positive = [&](const char* n, int64_t v, int64_t limit) {
    if (v <= 0 || v > limit) e.push_back(std::string(n) + " = " + std::to_string(v) + " is out of range (1.." +
                                         std::to_string(limit) + ")");
  };
  positive("vocab_size", c.vocab_size, 1 << 24);
  positive("hidden_size", c.hidden_size, 1 << 17);
  positive("num_hidden_layers", c.num_hidden_layers, 4096);
  positive("num_attention_heads", c.num_attention_heads, 4096);
  positive("head_dim", c.head_dim, 1 << 14);
  positive("q_lora_rank", c.q_lora_rank, 1 << 17);
  positive("o_groups", c.o_groups, 4096);
  positive("o_lora_rank", c.o_lora_rank, 1 << 17);
  positive("sliding_window", c.sliding_window, 1 << 20);
  positive("index_n_heads", c.index_n_heads, 4096);
  positive("index_head_dim", c.index_head_dim, 1 << 14);
  positive("index_topk", c.index_topk, 1 << 20);
  positive("n_routed_experts", c.n_routed_experts, 1 << 16);
  positive("num_experts_per_tok", c.num_experts_per_tok, 1 << 16);
  positive("moe_intermediate_size", c.moe_intermediate_size, 1 << 20);
  positive("hc_mult", c.hc_mult, 64);
  if (!e.empty()) return invalid_argument("config.json:\n" + join_errors(e));
  if (c.num_experts_per_tok > c.n_routed_experts) e.push_back("num_experts_per_tok exceeds n_routed_experts");
  if (c.num_key_value_heads != 1) e.push_back("num_key_value_heads must be 1 (one shared K=V latent)");
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 || c.qk_rope_head_dim > c.head_dim)
    e.push_back("qk_rope_head_dim must be even and <= head_dim");
  if (c.qk_rope_head_dim > c.index_head_dim) e.push_back("qk_rope_head_dim exceeds index_head_dim");
  if (c.head_dim % 32) e.push_back("head_dim must be a multiple of 32 (Q_win / Q_kv blocks)");
  if (c.index_head_dim % 32) e.push_back("index_head_dim must be a multiple of 32 (Q_idx blocks)");
  if (c.num_attention_heads % c.o_groups) e.push_back("num_attention_heads must be a multiple of o_groups");
  if (c.hidden_size % 32 || c.moe_intermediate_size % 32)
    e.push_back("hidden_size and moe_intermediate_size must be multiples of 32 (FP4 expert scale blocks)");
  if (c.weight_block_size != std::vector<int64_t>{32, 32})
    e.push_back("quantization_config.weight_block_size must be [32, 32] (MODEL_SPEC 7.3)");
  int64_t L = c.num_hidden_layers;
  if (static_cast<int64_t>(c.compress_ratios.size()) < L)
    e.push_back("compress_ratios has " + std::to_string(c.compress_ratios.size()) + " entries, need at least " +
                std::to_string(L) + " (num_hidden_layers)");
  for (size_t i = 0; i < c.compress_ratios.size(); ++i)
    if (c.compress_ratios[i] < 0 || c.compress_ratios[i] > 128)
      e.push_back("compress_ratios[" + std::to_string(i) + "] = " + std::to_string(c.compress_ratios[i]) + " is out of range");
  auto ids_in_range = [&](const char* n, const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || v[i] >= L) e.push_back(std::string(n) + "[" + std::to_string(i) + "] = " + std::to_string(v[i]) + " is not a backbone layer");
      if (i && v[i] <= v[i - 1]) e.push_back(std::string(n) + " must be strictly increasing");
    }
  };
  ids_in_range("kv_source_layer_ids", c.kv_source_layer_ids);
  ids_in_range("index_source_layer_ids", c.index_source_layer_ids);
  ids_in_range("engram_layer_ids", c.engram_layer_ids);
  if (!c.engram_layer_ids.empty()) {
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
      e.push_back("engram_num_embeddings must have one entry per engram layer");
    if (c.engram_max_ngram_size < 2 || c.engram_max_ngram_size > 8) e.push_back("engram_max_ngram_size must be 2..8");
    if (c.engram_n_heads <= 0 || c.engram_head_dim <= 0 || c.engram_head_dim % 32)
      e.push_back("engram_n_heads must be positive and engram_head_dim a positive multiple of 32");
    if (c.engram_compressed_vocab_size <= 0) e.push_back("engram_compressed_vocab_size must be positive");
  }
  if (c.candidate_source_layer_id >= 0) {
    if (c.candidate_source_layer_id >= L) e.push_back("candidate_source_layer_id is not a backbone layer");
    if (c.candidate_topk_blocks <= 0 || c.candidate_block_size <= 0)
      e.push_back("candidate_topk_blocks and candidate_block_size must be positive with a candidate source");
  }
  if (c.rope_scaling.factor <= 0 || c.rope_scaling.original_max_position_embeddings <= 0)
    e.push_back("rope_scaling.factor and original_max_position_embeddings must be positive");
  if (!e.empty()) return invalid_argument("config.json:\n" + join_errors(e));
  return ok_status();
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = parse_model_config(ss.str());
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

}  // namespace ds41::model
