// ds41 engram: tokenizer.json vocabulary reading and the MODEL_SPEC 3.2.1 compressed-id map.
#include "engram/compressed_vocab.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "engram/engram_normalize.h"

namespace ds41::engram {

namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 2;

// ByteLevel string -> bytes. Returns false if some character is outside the ByteLevel alphabet
// (make_goldens.py then keeps the raw string as the text).
bool byte_level_to_bytes(std::string_view piece, std::string& bytes) {
  bytes.clear();
  bytes.reserve(piece.size());
  size_t i = 0;
  while (i < piece.size()) {
    const auto b0 = static_cast<uint8_t>(piece[i]);
    char32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      ++i;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < piece.size()) {  // alphabet is < U+0800
      cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | (static_cast<uint8_t>(piece[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;
    }
    const int b = byte_level_byte(cp);
    if (b < 0) return false;
    bytes.push_back(static_cast<char>(b));
  }
  return true;
}

}  // namespace

Result<TokenizerVocab> tokenizer_vocab_from_json(const nlohmann::json& doc) {
  if (!doc.is_object()) return invalid_argument("tokenizer.json: top level is not an object");
  auto model = doc.find("model");
  if (model == doc.end() || !model->is_object())
    return not_found("tokenizer.json: 'model' object is missing");
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object())
    return not_found("tokenizer.json: 'model.vocab' is missing");
  auto added = doc.find("added_tokens");
  if (added != doc.end() && !added->is_array())
    return invalid_argument("tokenizer.json: 'added_tokens' is not a list");

  int64_t max_id = -1;
  auto check_id = [&](const nlohmann::json& v, const std::string& what) -> Result<int64_t> {
    if (!v.is_number_integer()) return invalid_argument("tokenizer.json: " + what + " has a non-integer id");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > kMaxTokenId) {
      return out_of_range("tokenizer.json: " + what + " has id " + std::to_string(id) + " out of range");
    }
    return id;
  };
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    DS41_ASSIGN_OR_RETURN(int64_t id, check_id(it.value(), "model.vocab entry '" + it.key() + "'"));
    max_id = std::max(max_id, id);
  }
  if (added != doc.end()) {
    for (const auto& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string()) {
        return invalid_argument("tokenizer.json: an added_tokens entry lacks 'id' or string 'content'");
      }
      DS41_ASSIGN_OR_RETURN(int64_t id,
                            check_id(a["id"], "added token '" + a["content"].get<std::string>() + "'"));
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) return invalid_argument("tokenizer.json: the vocabulary is empty");

  TokenizerVocab out;
  const auto n = static_cast<size_t>(max_id + 1);
  out.pieces.resize(n);
  out.is_added.assign(n, 0);
  std::vector<uint8_t> present(n, 0);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const auto id = static_cast<size_t>(it.value().get<int64_t>());
    if (present[id]) {
      return invalid_argument("tokenizer.json: model.vocab id " + std::to_string(id) + " is used by '" +
                              out.pieces[id] + "' and '" + it.key() + "'");
    }
    present[id] = 1;
    out.pieces[id] = it.key();
  }
  if (added != doc.end()) {
    for (const auto& a : *added) {  // an added token wins over model.vocab (as in make_goldens.py)
      const auto id = static_cast<size_t>(a["id"].get<int64_t>());
      present[id] = 1;
      out.pieces[id] = a["content"].get<std::string>();
      out.is_added[id] = 1;
    }
  }
  for (size_t id = 0; id < n; ++id) {
    if (!present[id]) {
      return invalid_argument("tokenizer.json: token id " + std::to_string(id) +
                              " is in neither model.vocab nor added_tokens (ids run to " +
                              std::to_string(max_id) + ")");
    }
  }
  return out;
}

Result<TokenizerVocab> read_tokenizer_vocab(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open tokenizer file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return io_error("read error on " + path);
  nlohmann::json doc = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return data_loss(path + ": not valid JSON");
  auto r = tokenizer_vocab_from_json(doc);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

std::string compressed_key(const std::string& piece, bool is_added) {
  // MODEL_SPEC 3.2.1: decode the id alone. Added tokens decode to their content verbatim;
  // model.vocab strings are ByteLevel characters -> bytes -> UTF-8 with replacement.
  std::string text;
  bool bad = false;
  if (is_added) {
    text = piece;
    bad = contains_replacement_char(text);
  } else {
    std::string bytes;
    if (byte_level_to_bytes(piece, bytes)) {
      Utf8Decoded d = decode_utf8_replace(bytes);
      bad = d.replaced || contains_replacement_char(d.text);
      if (!bad) text = std::move(d.text);
    } else {  // not a ByteLevel string: the raw string is the text
      text = piece;
      bad = contains_replacement_char(text);
    }
  }
  if (bad) return piece;
  std::string key = engram_normalize(text);
  return key.empty() ? text : key;
}

CompressedVocab build_compressed_vocab(const TokenizerVocab& vocab) {
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

Result<CompressedVocab> build_compressed_vocab_checked(const TokenizerVocab& vocab, int64_t expected_size) {
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
  DS41_ASSIGN_OR_RETURN(TokenizerVocab vocab, read_tokenizer_vocab(path));
  auto r = build_compressed_vocab_checked(vocab, expected_size);
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

}  // namespace ds41::engram
