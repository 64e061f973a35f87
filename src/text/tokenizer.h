// ds41 text: the DeepSeek-V4.1 tokenizer (MODEL_SPEC 6.1) — a loader and encoder/decoder for HF
// `tokenizer.json` files of the byte-level BPE family. Owns the pipeline
//   added tokens (leftmost-longest, non-normalized first, then normalized)
//   -> pre-tokenizer (Split regexes via PCRE2) -> ByteLevel -> BPE merges by rank
// and the decoder (HF ByteLevel decoder + lossy UTF-8).
//
// Invalid UTF-8 input: encode() first replaces every maximal ill-formed subpart of the input by
// U+FFFD (text/utf8.h), exactly what a Python or Rust caller would have to do to obtain a str,
// and tokenizes the result; it never fails. decode() turns byte sequences that are not valid
// UTF-8 (e.g. a lone token that is half of a character) into U+FFFD, like HF's decode.
//
// Thread safety: a Tokenizer is immutable after loading; encode/decode may be called from any
// number of threads. Each thread keeps its own per-word BPE cache.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/pre_tokenizer.h"

namespace ds41::text {

// A byte range [begin, end) of an input text.
struct TextRange {
  size_t begin = 0, end = 0;
  bool operator==(const TextRange&) const = default;
};

struct EncodeOptions {
  // When false, added/special token strings in the text are tokenized as ordinary text (use
  // for untrusted content that must not be able to inject control tokens).
  bool split_added_tokens = true;
  // When set (and split_added_tokens is true), added tokens are matched only where the whole
  // token string lies inside one of these ranges (sorted, disjoint, within the text); the rest
  // of the text is tokenized as ordinary text even where it spells an added token. The chat
  // encoder uses this to keep message content from injecting control tokens while its own
  // markers stay tokens (ChatPrompt::special_ranges). Text between two matched tokens is
  // pre-tokenized as one piece, whichever ranges it spans, exactly as without ranges.
  std::optional<std::span<const TextRange>> added_token_ranges;
};

struct AddedTokenInfo {
  int32_t id;
  std::string content;
  bool special;
  bool normalized;
};

class Tokenizer {
 public:
  // Loads `path` (a tokenizer.json). Errors name the file and the offending field.
  static Result<std::unique_ptr<Tokenizer>> from_file(const std::string& path);
  // Loads DIR/tokenizer.json.
  static Result<std::unique_ptr<Tokenizer>> from_model_dir(const std::string& dir);
  static Result<std::unique_ptr<Tokenizer>> from_json_text(std::string_view json_text,
                                                           const std::string& source);

  // Token ids of `text` (no BOS/EOS are added: the V4.1 tokenizer_config has
  // add_bos_token=false; the chat encoder writes BOS explicitly).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const;
  void encode_append(std::string_view text, std::vector<int32_t>* out, const EncodeOptions& opts = {}) const;

  // Text of `ids`. Unknown ids are an OutOfRange error naming the id. With skip_special, ids of
  // added tokens marked special are dropped (`<｜System｜>` is not special, MODEL_SPEC 6.1).
  Result<std::string> decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // One past the highest id (129,280 for V4.1).
  int32_t id_end() const { return static_cast<int32_t>(bytes_.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < id_end() && kind_[id] != kNone; }
  bool is_added(int32_t id) const { return valid_id(id) && kind_[id] != kVocab; }
  bool is_special(int32_t id) const { return valid_id(id) && kind_[id] == kSpecial; }
  // Vocabulary string ("Ġhello") or added-token content of id; "" for invalid ids.
  std::string_view piece(int32_t id) const;
  // Raw bytes id decodes to (before UTF-8 repair); "" for invalid ids.
  std::string_view token_bytes(int32_t id) const { return valid_id(id) ? std::string_view(bytes_[id]) : ""; }
  // Id of an added-token content or of a vocabulary string.
  std::optional<int32_t> token_to_id(std::string_view piece) const;
  const std::vector<AddedTokenInfo>& added_tokens() const { return added_; }
  const BpeModel& model() const { return model_; }

 private:
  enum Kind : uint8_t { kNone = 0, kVocab, kAdded, kSpecial };
  Tokenizer() = default;
  void encode_text_segment(std::string_view text, uint32_t begin, uint32_t end,
                           std::vector<int32_t>* out) const;
  // encode_append on valid UTF-8 of at most UINT32_MAX / 2 bytes; added tokens are matched
  // inside `allowed` (sorted, disjoint, clipped to the text) only.
  void encode_valid(std::string_view text, std::span<const TextRange> allowed,
                    std::vector<int32_t>* out) const;

  BpeModel model_;
  PreTokenizer pre_;
  AddedTokenMatcher added_raw_;         // normalized=false: matched first, on the raw text
  AddedTokenMatcher added_normalized_;  // normalized=true: matched in what remains
  std::vector<AddedTokenInfo> added_;
  std::vector<std::string> bytes_;  // per id: decoded bytes (HF ByteLevel decoder rule)
  std::vector<Kind> kind_;
  std::vector<int32_t> added_index_;  // per id: index into added_, -1 if not added
  std::unordered_map<std::string, int32_t> added_by_content_;
  uint64_t serial_ = 0;  // identifies this instance in per-thread caches
};

}  // namespace ds41::text
