// ds41 engram: per-sequence Engram hash ids (MODEL_SPEC 3.2.3). For every position p and every
// Engram layer, n_orders * n_heads table row ids: the n-gram hash R_{n-1} (XOR of t_j * a_{l,j}
// over look-back distances j < n) modulo prime_{l,n,h} plus offset_{l,n,h}.
// The per-sequence state keeps only the last max_ngram-1 compressed ids (or DEAD) and the
// length, so one-shot prefill, chunked prefill and token-by-token decode give identical ids.
// Blocking is sticky (MODEL_SPEC 7 item 15): once a look-back reaches before the sequence start
// or a DEAD position (image span, padding), every longer look-back uses pad* = map[pad id].
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engram/compressed_vocab.h"
#include "engram/engram_config.h"
#include "engram/hash_constants.h"

namespace ds41::engram {

// Per-sequence hashing state; cheap to copy (fork a sequence by copying it).
struct EngramHashState {
  static constexpr int32_t kDead = -1;
  // recent[k] = compressed id (or kDead) at position length-1-k, for k < min(length, max_ngram-1).
  std::array<int32_t, EngramConfig::kMaxNgram> recent{};
  int64_t length = 0;  // number of positions consumed = position of the next token
};

class EngramHasher {
 public:
  // Takes ownership of the constants and the compressed map. Fails if pad_token_id is outside
  // the map, if the constants are inconsistent, or if some t * a_{l,j} could exceed 2^63-1
  // (possible only with a map that does not belong to the config).
  static Result<EngramHasher> create(EngramHashConstants constants, CompressedVocab vocab,
                                     int32_t pad_token_id);

  int n_layers() const { return c_.n_layers; }
  int n_cols() const { return c_.n_cols; }
  // Row ids written per position: [n_layers][n_cols].
  int ids_per_token() const { return c_.n_layers * c_.n_cols; }
  const EngramHashConstants& constants() const { return c_; }
  const CompressedVocab& vocab() const { return vocab_; }
  int32_t pad_compressed_id() const { return pad_; }

  EngramHashState new_state() const { return EngramHashState{}; }

  // Consumes token_ids as the next positions of the sequence. dead is empty (no DEAD position)
  // or has one flag per token; a DEAD token's id is not looked up (any value is accepted) and
  // its own row ids are those of an all-pad n-gram (the Engram module leaves DEAD positions
  // unchanged, MODEL_SPEC 3.2.4). out is empty (only advance the state, e.g. for a prefix
  // already in the cache) or holds exactly token_ids.size() * ids_per_token() int32 values,
  // written as [token][layer][col]. On error the state is unchanged.
  Status append(EngramHashState& state, std::span<const int32_t> token_ids, std::span<const uint8_t> dead,
                std::span<int32_t> out) const;

  // One-shot: row ids [S][n_layers][n_cols] for a whole sequence from position 0.
  Result<std::vector<int32_t>> hash_ids(std::span<const int32_t> token_ids,
                                        std::span<const uint8_t> dead = {}) const;

 private:
  EngramHasher(EngramHashConstants c, CompressedVocab v, int32_t pad)
      : c_(std::move(c)), vocab_(std::move(v)), pad_(pad) {}

  EngramHashConstants c_;
  CompressedVocab vocab_;
  int32_t pad_ = 0;  // pad* (compressed id of the pad token)
};

// Everything the forward pass needs at load time: validates the config, computes the hash
// constants (checking engram_num_embeddings), builds the compressed map from the tokenizer
// (checking engram_compressed_vocab_size) and returns the hasher.
Result<EngramHasher> make_engram_hasher(const EngramConfig& config, const text::TokenizerVocab& vocab);
Result<EngramHasher> make_engram_hasher(const EngramConfig& config, const std::string& tokenizer_json_path);

}  // namespace ds41::engram
