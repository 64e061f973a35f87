// ds41 model: typed V4.1 configuration parsed from the released nested config.json
// (MODEL_SPEC 1.2-1.3) — root keys + quantization_config + text_config. Validated at load with
// errors that name the key. Nothing else in the engine reads config.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ds41::model {

struct RopeScaling {
  std::string type = "yarn";
  double factor = 16;
  double beta_fast = 32;
  double beta_slow = 1;
  int64_t original_max_position_embeddings = 65536;
};

struct ModelConfig {
  // root
  std::string model_type;
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2, image_token_id = 129264;
  std::vector<int64_t> weight_block_size = {32, 32};
  std::string scale_fmt = "ue8m0";
  std::string expert_dtype = "fp4";
  // text_config sizes
  int64_t vocab_size = 0, hidden_size = 0, num_hidden_layers = 0, num_nextn_predict_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 1, head_dim = 0, qk_rope_head_dim = 0;
  int64_t q_lora_rank = 0, o_groups = 0, o_lora_rank = 0, sliding_window = 0;
  double rope_theta = 10000, compress_rope_theta = 160000;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  // CSA2
  std::vector<int64_t> compress_ratios;  // num_hidden_layers (+ DSpark stages) entries
  std::vector<int64_t> kv_source_layer_ids, index_source_layer_ids;
  int64_t candidate_source_layer_id = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  // MoE
  int64_t n_routed_experts = 0, n_shared_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  std::string scoring_func, topk_method;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0, swiglu_limit = 10.0, gate_temp = 1.0;
  // mHC
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6, rms_norm_eps = 1e-20;
  // Engram
  std::vector<int64_t> engram_layer_ids, engram_num_embeddings;
  int64_t engram_max_ngram_size = 0, engram_n_heads = 0, engram_head_dim = 0, engram_vocab_size = 0;
  int64_t engram_compressed_vocab_size = 0, engram_pad_token_id = 2;
  // DSpark
  int64_t dspark_block_size = 0, dspark_markov_rank = 0, dspark_n_routed_experts = 0;
  int64_t dspark_num_experts_per_tok = 0, dspark_noise_token_id = 0;
  std::vector<int64_t> dspark_target_layer_ids;
  bool tie_word_embeddings = false;
  // vision (present iff has_vision)
  bool has_vision = false;
  int64_t vision_hidden_size = 0, vision_intermediate_size = 0, vision_num_layers = 0, vision_num_heads = 0;
  int64_t vision_patch_size = 0, vision_downsample_ratio = 0;
  // Preprocessing and RoPE (MODEL_SPEC 1.4, 3.11); absent keys take the released values.
  double vision_rope_theta = 10000.0;
  int64_t vision_max_image_tokens = 1024, vision_min_pixels = 295936;
  int64_t vision_max_wh_ratio = 0;  // 0 = null (no cap)

  bool is_engram_layer(int64_t l) const;
  int64_t engram_index(int64_t l) const;  // position in engram_layer_ids or -1
};

// Parses config.json text. Accepts both spellings of the Engram pad key
// (engram_pad_token_id, engram_pad_id; MODEL_SPEC 7.16). Errors name the key path.
Result<ModelConfig> parse_model_config(std::string_view json_text);
// Reads DIR/config.json.
Result<ModelConfig> load_model_config(const std::string& dir);
// Semantic validation (sizes divisible by blocks, list lengths, layer ids in range, ...).
// Reports every problem at once, one per line.
Status validate_model_config(const ModelConfig& c);

}  // namespace ds41::model
