// ds41 engram: the MODEL_SPEC 3.2.1 compressed-id map over the tokenizer.json vocabulary read
// by text/tokenizer_vocab.h.
#include "engram/compressed_vocab.h"

#include <unordered_map>
#include <utility>

#include "engram/engram_normalize.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace ds41::engram {

std::string compressed_key(const std::string& piece, bool is_added) {
  // MODEL_SPEC 3.2.1: decode the id alone. Added tokens decode to their content verbatim;
  // model.vocab strings are ByteLevel characters -> bytes -> UTF-8 with replacement.
  std::string text;
  bool bad = false;
  if (is_added) {
    text = piece;
    bad = contains_replacement_char(text);
  } else {
    // ByteLevel string -> bytes; a character outside the alphabet keeps the raw string as the
    // text (make_goldens.py).
    if (std::optional<std::string> bytes = text::ByteLevel::instance().decode(piece)) {
      // Bytes that are not valid UTF-8 decode with a replacement: the key is the raw string.
      bad = !text::utf8_is_valid(*bytes) || contains_replacement_char(*bytes);
      if (!bad) text = std::move(*bytes);
    } else {
      text = piece;
      bad = contains_replacement_char(text);
    }
  }
  if (bad) return piece;
  std::string key = engram_normalize(text);
  return key.empty() ? text : key;
}

CompressedVocab build_compressed_vocab(const text::TokenizerVocab& vocab) {
  CompressedVocab cv;
  cv.map.resize(vocab.size());
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(vocab.size());
  for (size_t v = 0; v < vocab.size(); ++v) {
    auto [it, inserted] = ids.try_emplace(compressed_key(vocab.pieces[v], vocab.is_added[v] != 0),
                                          static_cast<int32_t>(ids.size()));
    cv.map[v] = it->second;
  }
  cv.size = static_cast<int32_t>(ids.size());
  return cv;
}

Result<CompressedVocab> build_compressed_vocab_checked(const text::TokenizerVocab& vocab,
                                                       int64_t expected_size) {
  CompressedVocab cv = build_compressed_vocab(vocab);
  if (cv.size != expected_size) {
    return failed_precondition(
        "Engram compressed vocabulary has " + std::to_string(cv.size) +
        " keys but engram_compressed_vocab_size is " + std::to_string(expected_size) +
        " (MODEL_SPEC 3.2.1: wrong tokenizer or normalisation; every Engram hash would be wrong)");
  }
  return cv;
}

Result<CompressedVocab> load_compressed_vocab(const std::string& path, int64_t expected_size) {
  DS41_ASSIGN_OR_RETURN(text::TokenizerVocab vocab, text::read_tokenizer_vocab(path));
  auto r = build_compressed_vocab_checked(vocab, expected_size);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

}  // namespace ds41::engram
