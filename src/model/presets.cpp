// ds41 model: preset configs and the nested config.json emitter (MODEL_SPEC 1.2-1.4).
#include "model/presets.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

namespace ds41::model {

namespace {

// Fields every preset shares with the release (MODEL_SPEC 1.2, 1.3).
ModelConfig released_common() {
  ModelConfig c;
  c.model_type = "deepseek_v41";
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.image_token_id = 129264;
  c.weight_block_size = {32, 32};
  c.scale_fmt = "ue8m0";
  c.expert_dtype = "fp4";
  c.num_key_value_heads = 1;
  c.qk_rope_head_dim = 64;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_scaling = RopeScaling{};
  c.max_position_embeddings = 1048576;
  c.n_shared_experts = 1;
  c.scoring_func = "sqrtsoftplus";
  c.topk_method = "noaux_tc";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 10.0;
  c.gate_temp = 1.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-20;
  c.engram_max_ngram_size = 4;
  c.engram_compressed_vocab_size = 99092;  // the tokenizer-derived map (MODEL_SPEC 3.2.1)
  c.engram_pad_token_id = 2;
  c.dspark_block_size = 5;
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 128;
  c.dspark_num_experts_per_tok = 3;
  c.dspark_noise_token_id = 128799;
  c.tie_word_embeddings = false;
  return c;
}

std::vector<int64_t> ratios(std::initializer_list<std::pair<int64_t, int64_t>> runs) {
  std::vector<int64_t> r;
  for (auto [count, value] : runs) r.insert(r.end(), static_cast<size_t>(count), value);
  return r;
}

void set_engram_rows(ModelConfig& c) {
  c.engram_num_embeddings =
      engram_table_rows(static_cast<int64_t>(c.engram_layer_ids.size()), c.engram_max_ngram_size - 1,
                        c.engram_n_heads, c.engram_vocab_size);
}

ModelConfig tiny() {
  ModelConfig c = released_common();
  c.vocab_size = 2048;
  c.hidden_size = 192;
  c.num_hidden_layers = 8;
  c.num_nextn_predict_layers = 0;
  c.num_attention_heads = 4;
  c.head_dim = 128;
  c.q_lora_rank = 96;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.sliding_window = 8;
  c.compress_ratios = ratios({{2, 0}, {2, 2}, {4, 1}});
  c.kv_source_layer_ids = {2, 4};
  c.index_source_layer_ids = {2, 4, 6};
  c.candidate_source_layer_id = 4;
  c.candidate_topk_blocks = 6;
  c.candidate_block_size = 2;
  c.index_n_heads = 8;
  c.index_head_dim = 128;
  c.index_topk = 8;
  c.n_routed_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 64;
  c.engram_layer_ids = {1, 3};
  c.engram_n_heads = 2;
  c.engram_head_dim = 64;
  c.engram_vocab_size = 600;
  set_engram_rows(c);
  c.dspark_target_layer_ids = {5, 6, 7};  // present for format fidelity; no stages
  return c;
}

ModelConfig small() {
  ModelConfig c = released_common();
  c.vocab_size = 129280;
  c.hidden_size = 1024;
  c.num_hidden_layers = 16;
  c.num_nextn_predict_layers = 2;
  c.num_attention_heads = 8;
  c.head_dim = 512;
  c.q_lora_rank = 256;
  c.o_groups = 4;
  c.o_lora_rank = 256;
  c.sliding_window = 32;
  c.compress_ratios = ratios({{2, 0}, {6, 2}, {8, 1}, {2, 0}});  // + 2 DSpark stages
  c.kv_source_layer_ids = {2, 5, 8};
  c.index_source_layer_ids = {2, 5, 8, 10, 12, 14};
  c.candidate_source_layer_id = 8;
  c.candidate_topk_blocks = 16;
  c.candidate_block_size = 8;
  c.index_n_heads = 8;
  c.index_head_dim = 128;
  c.index_topk = 64;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.moe_intermediate_size = 256;
  c.engram_layer_ids = {1, 5};
  c.engram_n_heads = 4;
  c.engram_head_dim = 64;
  c.engram_vocab_size = 20000;
  set_engram_rows(c);
  c.dspark_markov_rank = 64;
  c.dspark_n_routed_experts = 8;
  c.dspark_num_experts_per_tok = 2;
  c.dspark_target_layer_ids = {13, 14, 15};
  c.has_vision = true;
  c.vision_hidden_size = 256;
  c.vision_intermediate_size = 512;
  c.vision_num_layers = 2;
  c.vision_num_heads = 4;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  return c;
}

// MODEL_SPEC 1.3 / 1.4, released values.
ModelConfig v41_flash() {
  ModelConfig c = released_common();
  c.vocab_size = 129280;
  c.hidden_size = 5120;
  c.num_hidden_layers = 40;
  c.num_nextn_predict_layers = 3;
  c.num_attention_heads = 64;
  c.head_dim = 512;
  c.q_lora_rank = 1280;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.sliding_window = 128;
  c.compress_ratios = ratios({{2, 0}, {18, 2}, {20, 1}, {3, 0}});
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer_id = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.n_routed_experts = 384;
  c.num_experts_per_tok = 6;
  c.moe_intermediate_size = 2304;
  c.engram_layer_ids = {1, 14};
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.engram_vocab_size = 16000000;
  set_engram_rows(c);  // = [384006168, 384016682] (MODEL_SPEC 1.3; checked by a unit test)
  c.dspark_target_layer_ids = {37, 38, 39};
  c.has_vision = true;
  c.vision_hidden_size = 1024;
  c.vision_intermediate_size = 2816;
  c.vision_num_layers = 32;
  c.vision_num_heads = 16;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  return c;
}

// The released widths on a shortened layer list (issue 10): one layer of every CSA2 kind in
// schedule order (MODEL_SPEC 1.5): 0 window-only, 1 window-only + Engram, 2 ratio-2 Full (KV +
// index source, compressor with gate) + Engram, 3 ratio-2 Reuse, 4 ratio-1 Full + candidate
// source, 5 Reuse, 6 Reindex (candidate-restricted), 7 Reuse. Engram sits on a window-only layer
// and on a ratio-2 KV source as in the release (layers 1 and 14). Engram tables keep the released
// heads / dim / orders but start their primes at 200,000 instead of 16,000,000 (~4.8M rows,
// 1.3 GB per table instead of 101 GB). No DSpark stage, no vision tower: the text model only.
ModelConfig v41_flash_slice() {
  ModelConfig c = v41_flash();
  c.num_hidden_layers = 8;
  c.num_nextn_predict_layers = 0;
  c.compress_ratios = ratios({{2, 0}, {2, 2}, {4, 1}});
  c.kv_source_layer_ids = {2, 4};
  c.index_source_layer_ids = {2, 4, 6};
  c.candidate_source_layer_id = 4;
  c.engram_layer_ids = {1, 2};
  c.engram_vocab_size = 200000;
  set_engram_rows(c);
  c.dspark_target_layer_ids = {5, 6, 7};  // present for format fidelity; no stages (as tiny)
  c.has_vision = false;
  c.vision_hidden_size = c.vision_intermediate_size = c.vision_num_layers = c.vision_num_heads = 0;
  c.vision_patch_size = c.vision_downsample_ratio = 0;
  return c;
}

// The slice with the released vision tower (MODEL_SPEC 1.4: 32 blocks of 1024, 16 heads of 64,
// SwiGLU 2816, patch 14, downsample 3, up to 1024 span positions per image): `ds41 bench vision
// --device cuda --load-format dummy` measures the released tower widths and its aligner into the
// released hidden size on one GPU (~1 GB of BF16 vision weights on top of the slice).
ModelConfig v41_flash_slice_vision() {
  const ModelConfig full = v41_flash();
  ModelConfig c = v41_flash_slice();
  c.has_vision = true;
  c.vision_hidden_size = full.vision_hidden_size;
  c.vision_intermediate_size = full.vision_intermediate_size;
  c.vision_num_layers = full.vision_num_layers;
  c.vision_num_heads = full.vision_num_heads;
  c.vision_patch_size = full.vision_patch_size;
  c.vision_downsample_ratio = full.vision_downsample_ratio;
  return c;
}

}  // namespace

bool is_prime_i64(int64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (int64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

std::vector<int64_t> engram_table_rows(int64_t n_layers, int64_t n_orders, int64_t n_heads,
                                       int64_t vocab_start) {
  std::set<int64_t> used;
  std::vector<int64_t> rows;
  for (int64_t l = 0; l < n_layers; ++l) {
    int64_t sum = 0;
    for (int64_t o = 0; o < n_orders; ++o) {
      int64_t cur = vocab_start - 1;  // "strictly above engram_vocab_size - 1"
      for (int64_t h = 0; h < n_heads; ++h) {
        ++cur;
        while (!is_prime_i64(cur) || used.count(cur)) ++cur;
        used.insert(cur);
        sum += cur;
      }
    }
    rows.push_back(sum);
  }
  return rows;
}

// tiny + a one-block vision tower (hidden 64, 2 heads of 32) with a small image budget (64 span
// positions, min 84^2 pixels): the e2e tests' image model (issue 16).
ModelConfig tiny_vision() {
  ModelConfig c = tiny();
  c.has_vision = true;
  c.vision_hidden_size = 64;
  c.vision_intermediate_size = 128;
  c.vision_num_layers = 1;
  c.vision_num_heads = 2;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  c.vision_max_image_tokens = 64;
  c.vision_min_pixels = 7056;
  return c;
}

std::vector<std::string> preset_names() {
  return {"tiny", "tiny-vision", "small", "v41-flash", "v41-flash-slice", "v41-flash-slice-vision"};
}

Result<ModelConfig> preset_config(std::string_view name) {
  if (name == "tiny") return tiny();
  if (name == "tiny-vision") return tiny_vision();
  if (name == "small") return small();
  if (name == "v41-flash") return v41_flash();
  if (name == "v41-flash-slice") return v41_flash_slice();
  if (name == "v41-flash-slice-vision") return v41_flash_slice_vision();
  return invalid_argument(
      "unknown preset '" + std::string(name) +
      "' (known: tiny, tiny-vision, small, v41-flash, v41-flash-slice, v41-flash-slice-vision)");
}

int preset_default_shards(std::string_view name) {
  if (name == "v41-flash") return 48;
  // ~8 GB per shard, read in parallel by the GPU loader
  if (name == "v41-flash-slice" || name == "v41-flash-slice-vision") return 8;
  return 1;
}

std::string model_config_to_json(const ModelConfig& c) {
  using ojson = nlohmann::ordered_json;
  ojson root = ojson::object();
  root["architectures"] = {"DeepseekV41ForCausalLM"};
  root["model_type"] = c.model_type.empty() ? "deepseek_v41" : c.model_type;
  root["dtype"] = "bfloat16";
  root["bos_token_id"] = c.bos_token_id;
  root["eos_token_id"] = c.eos_token_id;
  root["pad_token_id"] = c.pad_token_id;
  root["image_token_id"] = c.image_token_id;
  root["quantization_config"] = {{"quant_method", "fp8"},
                                 {"activation_scheme", "dynamic"},
                                 {"expert_dtype", c.expert_dtype},
                                 {"scale_fmt", c.scale_fmt},
                                 {"weight_block_size", c.weight_block_size}};
  ojson t = ojson::object();
  t["model_type"] = "deepseek_v41_text";
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["head_dim"] = c.head_dim;
  t["qk_rope_head_dim"] = c.qk_rope_head_dim;
  t["q_lora_rank"] = c.q_lora_rank;
  t["o_groups"] = c.o_groups;
  t["o_lora_rank"] = c.o_lora_rank;
  t["attention_bias"] = false;
  t["attention_dropout"] = 0.0;
  t["sliding_window"] = c.sliding_window;
  t["rope_theta"] = c.rope_theta;
  t["compress_rope_theta"] = c.compress_rope_theta;
  t["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                       {"factor", c.rope_scaling.factor},
                       {"beta_fast", c.rope_scaling.beta_fast},
                       {"beta_slow", c.rope_scaling.beta_slow},
                       {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["compress_ratios"] = c.compress_ratios;
  t["kv_source_layer_ids"] = c.kv_source_layer_ids;
  t["index_source_layer_ids"] = c.index_source_layer_ids;
  t["candidate_source_layer_id"] = c.candidate_source_layer_id;
  t["candidate_topk_blocks"] = c.candidate_topk_blocks;
  t["candidate_block_size"] = c.candidate_block_size;
  t["index_n_heads"] = c.index_n_heads;
  t["index_head_dim"] = c.index_head_dim;
  t["index_topk"] = c.index_topk;
  t["n_routed_experts"] = c.n_routed_experts;
  t["n_shared_experts"] = c.n_shared_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["scoring_func"] = c.scoring_func;
  t["topk_method"] = c.topk_method;
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["routed_scaling_factor"] = c.routed_scaling_factor;
  t["swiglu_limit"] = c.swiglu_limit;
  t["hidden_act"] = "silu";
  t["hc_mult"] = c.hc_mult;
  t["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  t["hc_eps"] = c.hc_eps;
  t["rms_norm_eps"] = c.rms_norm_eps;
  if (!c.engram_layer_ids.empty()) {
    t["engram_layer_ids"] = c.engram_layer_ids;
    t["engram_num_embeddings"] = c.engram_num_embeddings;
    t["engram_max_ngram_size"] = c.engram_max_ngram_size;
    t["engram_n_heads"] = c.engram_n_heads;
    t["engram_head_dim"] = c.engram_head_dim;
    t["engram_vocab_size"] = c.engram_vocab_size;
    t["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
    t["engram_pad_token_id"] = c.engram_pad_token_id;  // released spelling (MODEL_SPEC 7.16)
  }
  t["dspark_block_size"] = c.dspark_block_size;
  t["dspark_markov_rank"] = c.dspark_markov_rank;
  t["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  t["dspark_num_experts_per_tok"] = c.dspark_num_experts_per_tok;
  t["dspark_noise_token_id"] = c.dspark_noise_token_id;
  t["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  t["initializer_range"] = 0.02;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["use_cache"] = true;
  root["text_config"] = t;
  if (c.has_vision) {
    // MODEL_SPEC 1.4.
    root["vision_config"] = {{"hidden_size", c.vision_hidden_size},
                             {"intermediate_size", c.vision_intermediate_size},
                             {"num_hidden_layers", c.vision_num_layers},
                             {"num_attention_heads", c.vision_num_heads},
                             {"patch_size", c.vision_patch_size},
                             {"downsample_ratio", c.vision_downsample_ratio},
                             {"rope_theta", 0},
                             {"max_image_tokens", c.vision_max_image_tokens},
                             {"min_pixels", c.vision_min_pixels},
                             {"max_wh_ratio", nullptr}};
    // rope_theta as the release writes it (an integer when integral).
    if (c.vision_rope_theta == std::floor(c.vision_rope_theta))
      root["vision_config"]["rope_theta"] = static_cast<int64_t>(c.vision_rope_theta);
    else
      root["vision_config"]["rope_theta"] = c.vision_rope_theta;
    if (c.vision_max_wh_ratio > 0) root["vision_config"]["max_wh_ratio"] = c.vision_max_wh_ratio;
  }
  return root.dump(2) + "\n";
}

}  // namespace ds41::model
