// ds41 engram: EngramConfig — the Engram hyper-parameters of text_config (MODEL_SPEC 1.3, 3.2).
// The forward pass fills it from config.json (engram_config_from_text_config does the key
// mapping, including both spellings of the pad key, MODEL_SPEC 7 item 16). validate() checks
// the values every other engram component relies on, with messages naming the field.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "core/status.h"

namespace ds41::engram {

struct EngramConfig {
  std::vector<int> layer_ids;           // engram_layer_ids (may be empty: no Engram)
  std::vector<int64_t> num_embeddings;  // engram_num_embeddings: table rows per layer
  int max_ngram_size = 0;               // engram_max_ngram_size: hashes n = 2..max
  int n_heads = 0;                      // engram_n_heads: primes per n-gram order
  int head_dim = 0;                     // engram_head_dim: width of one table row
  int64_t vocab_size = 0;               // engram_vocab_size: prime search start (NOT the LM vocab)
  int64_t compressed_vocab_size = 0;    // engram_compressed_vocab_size (99,092 for V4.1)
  int32_t pad_token_id = 0;             // engram_pad_token_id / engram_pad_id

  int n_layers() const { return static_cast<int>(layer_ids.size()); }
  int n_orders() const { return max_ngram_size - 1; }  // n = 2..max_ngram_size
  int n_cols() const { return n_orders() * n_heads; }  // row ids per position per layer

  // Bounds: 2 <= max_ngram_size <= kMaxNgram, n_heads >= 1, head_dim >= 1,
  // 2 <= vocab_size <= 2^40, compressed_vocab_size >= 1, pad_token_id >= 0,
  // layer ids distinct and >= 0, one num_embeddings entry per layer, each in [1, INT32_MAX]
  // (row ids are int32).
  Status validate() const;

  static constexpr int kMaxNgram = 16;
};

// Reads the engram_* keys of a text_config object (or of a root config that has a
// "text_config" member). Accepts "engram_pad_token_id" and HF's "engram_pad_id"; if both are
// present they must agree. Returns the validated config or an error naming the key.
Result<EngramConfig> engram_config_from_text_config(const nlohmann::json& config);

}  // namespace ds41::engram
