// ds41 engram: the compressed-id map of MODEL_SPEC 3.2.1 (token id -> Engram compressed id).
// For every token id v the key is: the raw vocabulary string if decoding v alone (ByteLevel
// bytes -> UTF-8 with replacement; added tokens are their content verbatim) yields U+FFFD,
// otherwise engram_normalize(text), or the text itself when that is empty. Compressed ids are
// assigned in order of first appearance over v = 0, 1, 2, ...
// Built once at model load; load_compressed_vocab also checks the count against the config
// (99,092 for V4.1 — a different count means every hash is wrong, MODEL_SPEC 7 item 14).
#pragma once

// The vocabulary itself (tokenizer.json reading) and the ByteLevel alphabet are src/text's
// (text/tokenizer_vocab.h, text/byte_level.h), shared with the tokenizer.
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/tokenizer_vocab.h"

namespace ds41::engram {

struct CompressedVocab {
  std::vector<int32_t> map;  // map[token id] = compressed id
  int32_t size = 0;          // number of distinct keys (compressed ids are 0..size-1)
};

// The Engram key of one vocabulary entry (MODEL_SPEC 3.2.1).
std::string compressed_key(const std::string& piece, bool is_added);

// Builds the map for every id of the vocabulary (never fails).
CompressedVocab build_compressed_vocab(const text::TokenizerVocab& vocab);

// Checked build: fails with FailedPrecondition if the number of keys differs from
// expected_size (engram_compressed_vocab_size of the config).
Result<CompressedVocab> build_compressed_vocab_checked(const text::TokenizerVocab& vocab,
                                                       int64_t expected_size);

// text::read_tokenizer_vocab + build_compressed_vocab_checked.
Result<CompressedVocab> load_compressed_vocab(const std::string& tokenizer_json_path, int64_t expected_size);

}  // namespace ds41::engram
