// ds41 text: the id -> string table of a HF tokenizer.json (MODEL_SPEC 6.1): model.vocab entries
// (ByteLevel strings) and added tokens (content verbatim; an added token overrides a
// model.vocab entry with its id). A streaming reader of only these two fields, for callers that
// need the table but not a Tokenizer (the Engram compressed vocabulary at model load, MODEL_SPEC
// 3.2.1): tokenizer.json is mostly merges, and a DOM of them would dominate the load time.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds41::text {

struct TokenizerVocab {
  std::vector<std::string> pieces;  // indexed by token id, UTF-8
  std::vector<uint8_t> is_added;    // 1 for added tokens
  size_t size() const { return pieces.size(); }
};

// Reads model.vocab and added_tokens. Every id in 0..max_id must be present (an id gap is an
// error naming the id), ids must be non-negative and model.vocab ids unique.
Result<TokenizerVocab> tokenizer_vocab_from_json(const nlohmann::json& doc);
// The same from a file, streamed (no DOM). Errors name the file.
Result<TokenizerVocab> read_tokenizer_vocab(const std::string& tokenizer_json_path);

}  // namespace ds41::text
