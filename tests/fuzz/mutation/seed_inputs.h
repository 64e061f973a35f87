// Seeds of the parser mutation test: valid inputs that the mutations start from.
// kTinyConfigJson is the tiny public golden config (../shared/golden/v41-tiny-public/config.json),
// embedded so that the test does not depend on the shared folder.
#pragma once

namespace ds41::fuzz {

inline constexpr const char* kTinyConfigJson = R"json({
 "architectures": [
  "DeepseekV41ForCausalLM"
 ],
 "model_type": "deepseek_v41",
 "dtype": "bfloat16",
 "bos_token_id": 0,
 "eos_token_id": 1,
 "pad_token_id": 2,
 "image_token_id": 129264,
 "quantization_config": {
  "quant_method": "fp8",
  "activation_scheme": "dynamic",
  "expert_dtype": "fp4",
  "scale_fmt": "ue8m0",
  "weight_block_size": [
   32,
   32
  ]
 },
 "text_config": {
  "model_type": "deepseek_v41_text",
  "vocab_size": 2048,
  "hidden_size": 192,
  "num_hidden_layers": 8,
  "num_nextn_predict_layers": 0,
  "num_attention_heads": 4,
  "num_key_value_heads": 1,
  "head_dim": 128,
  "qk_rope_head_dim": 64,
  "q_lora_rank": 96,
  "o_groups": 2,
  "o_lora_rank": 64,
  "attention_bias": false,
  "attention_dropout": 0.0,
  "sliding_window": 8,
  "rope_theta": 10000,
  "compress_rope_theta": 160000,
  "rope_scaling": {
   "rope_type": "yarn",
   "factor": 16,
   "beta_fast": 32,
   "beta_slow": 1,
   "original_max_position_embeddings": 65536
  },
  "max_position_embeddings": 1048576,
  "compress_ratios": [
   0,
   0,
   2,
   2,
   1,
   1,
   1,
   1
  ],
  "kv_source_layer_ids": [
   2,
   4
  ],
  "index_source_layer_ids": [
   2,
   4,
   6
  ],
  "candidate_source_layer_id": 4,
  "candidate_topk_blocks": 6,
  "candidate_block_size": 2,
  "index_n_heads": 8,
  "index_head_dim": 128,
  "index_topk": 8,
  "n_routed_experts": 8,
  "n_shared_experts": 1,
  "num_experts_per_tok": 2,
  "moe_intermediate_size": 64,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "norm_topk_prob": true,
  "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0,
  "hidden_act": "silu",
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06,
  "rms_norm_eps": 1e-20,
  "engram_layer_ids": [
   1,
   3
  ],
  "engram_num_embeddings": [
   3688,
   3904
  ],
  "engram_max_ngram_size": 4,
  "engram_n_heads": 2,
  "engram_head_dim": 64,
  "engram_vocab_size": 600,
  "engram_compressed_vocab_size": 99092,
  "engram_pad_token_id": 2,
  "dspark_block_size": 5,
  "dspark_markov_rank": 256,
  "dspark_n_routed_experts": 128,
  "dspark_num_experts_per_tok": 3,
  "dspark_noise_token_id": 128799,
  "dspark_target_layer_ids": [
   5,
   6,
   7
  ],
  "initializer_range": 0.02,
  "tie_word_embeddings": false,
  "use_cache": true
 }
})json";

// A safetensors header with every dtype family of the checkpoint, metadata and an empty tensor;
// its data section is kValidHeaderDataSize bytes.
inline constexpr const char* kValidHeaderJson = R"json({
 "__metadata__": {"format": "pt"},
 "layers.0.attn.wkv.weight": {"dtype": "F8_E4M3", "shape": [64, 96], "data_offsets": [0, 6144]},
 "layers.0.attn.wkv.scale": {"dtype": "F8_E8M0", "shape": [2, 3], "data_offsets": [6144, 6150]},
 "layers.0.ffn.experts.0.w1.weight": {"dtype": "I8", "shape": [64, 48], "data_offsets": [6150, 9222]},
 "layers.0.attn.attn_sink": {"dtype": "F32", "shape": [4], "data_offsets": [9224, 9240]},
 "norm.weight": {"dtype": "BF16", "shape": [96], "data_offsets": [9240, 9432]},
 "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [9432, 9432]}
})json";
inline constexpr unsigned long long kValidHeaderDataSize = 9432;

}  // namespace ds41::fuzz
