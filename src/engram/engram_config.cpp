// ds41 engram: EngramConfig validation and parsing from config.json (MODEL_SPEC 1.3, 7.16).
#include "engram/engram_config.h"

#include <climits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

namespace ds41::engram {

Status EngramConfig::validate() const {
  if (max_ngram_size < 2 || max_ngram_size > kMaxNgram) {
    return invalid_argument("engram_max_ngram_size = " + std::to_string(max_ngram_size) + " must be in [2, " +
                            std::to_string(kMaxNgram) + "]");
  }
  if (n_heads < 1) return invalid_argument("engram_n_heads = " + std::to_string(n_heads) + " must be >= 1");
  if (head_dim < 1)
    return invalid_argument("engram_head_dim = " + std::to_string(head_dim) + " must be >= 1");
  if (vocab_size < 2 || vocab_size > (int64_t{1} << 40)) {
    return invalid_argument("engram_vocab_size = " + std::to_string(vocab_size) + " must be in [2, 2^40]");
  }
  if (compressed_vocab_size < 1 || compressed_vocab_size > INT32_MAX) {
    return invalid_argument("engram_compressed_vocab_size = " + std::to_string(compressed_vocab_size) +
                            " must be in [1, 2^31-1]");
  }
  if (pad_token_id < 0) {
    return invalid_argument("engram_pad_token_id = " + std::to_string(pad_token_id) + " must be >= 0");
  }
  if (num_embeddings.size() != layer_ids.size()) {
    return invalid_argument("engram_num_embeddings has " + std::to_string(num_embeddings.size()) +
                            " entries but engram_layer_ids has " + std::to_string(layer_ids.size()));
  }
  std::set<int> seen;
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    if (layer_ids[i] < 0) {
      return invalid_argument("engram_layer_ids[" + std::to_string(i) +
                              "] = " + std::to_string(layer_ids[i]) + " is negative");
    }
    if (!seen.insert(layer_ids[i]).second) {
      return invalid_argument("engram_layer_ids lists layer " + std::to_string(layer_ids[i]) + " twice");
    }
    if (num_embeddings[i] < 1 || num_embeddings[i] > INT32_MAX) {
      return invalid_argument("engram_num_embeddings[" + std::to_string(i) +
                              "] = " + std::to_string(num_embeddings[i]) +
                              " must be in [1, 2^31-1] (row ids are int32)");
    }
  }
  return ok_status();
}

namespace {

// Integer JSON value -> T, rejecting values T cannot hold (no silent truncation).
template <typename T>
Status narrow(const char* key, const nlohmann::json& v, T* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (!std::in_range<T>(u)) return out_of_range(std::string("config key '") + key + "' value is too large");
    *out = static_cast<T>(u);
  } else {
    const int64_t i = v.get<int64_t>();
    if (!std::in_range<T>(i))
      return out_of_range(std::string("config key '") + key + "' value is out of range");
    *out = static_cast<T>(i);
  }
  return ok_status();
}

template <typename T>
Status read_int(const nlohmann::json& obj, const char* key, T* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return not_found(std::string("config key '") + key + "' is missing");
  if (!it->is_number_integer())
    return invalid_argument(std::string("config key '") + key + "' is not an integer");
  return narrow(key, *it, out);
}

template <typename T>
Status read_int_list(const nlohmann::json& obj, const char* key, std::vector<T>* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return not_found(std::string("config key '") + key + "' is missing");
  if (!it->is_array()) return invalid_argument(std::string("config key '") + key + "' is not a list");
  out->clear();
  for (const auto& v : *it) {
    if (!v.is_number_integer()) {
      return invalid_argument(std::string("config key '") + key + "' holds a non-integer value");
    }
    T x{};
    DS41_RETURN_IF_ERROR(narrow(key, v, &x));
    out->push_back(x);
  }
  return ok_status();
}

}  // namespace

Result<EngramConfig> engram_config_from_text_config(const nlohmann::json& config) {
  if (!config.is_object()) return invalid_argument("engram config: expected a JSON object");
  const nlohmann::json& tc = config.contains("text_config") ? config["text_config"] : config;
  if (!tc.is_object()) return invalid_argument("engram config: 'text_config' is not an object");
  EngramConfig c;
  DS41_RETURN_IF_ERROR(read_int_list(tc, "engram_layer_ids", &c.layer_ids));
  DS41_RETURN_IF_ERROR(read_int_list(tc, "engram_num_embeddings", &c.num_embeddings));
  DS41_RETURN_IF_ERROR(read_int(tc, "engram_max_ngram_size", &c.max_ngram_size));
  DS41_RETURN_IF_ERROR(read_int(tc, "engram_n_heads", &c.n_heads));
  DS41_RETURN_IF_ERROR(read_int(tc, "engram_head_dim", &c.head_dim));
  DS41_RETURN_IF_ERROR(read_int(tc, "engram_vocab_size", &c.vocab_size));
  DS41_RETURN_IF_ERROR(read_int(tc, "engram_compressed_vocab_size", &c.compressed_vocab_size));
  // MODEL_SPEC 7 item 16: the released file spells it engram_pad_token_id, HF engram_pad_id.
  const bool has_a = tc.contains("engram_pad_token_id"), has_b = tc.contains("engram_pad_id");
  if (!has_a && !has_b) return not_found("config key 'engram_pad_token_id' (or 'engram_pad_id') is missing");
  int32_t pad_a = 0, pad_b = 0;
  if (has_a) DS41_RETURN_IF_ERROR(read_int(tc, "engram_pad_token_id", &pad_a));
  if (has_b) DS41_RETURN_IF_ERROR(read_int(tc, "engram_pad_id", &pad_b));
  if (has_a && has_b && pad_a != pad_b) {
    return invalid_argument("config keys engram_pad_token_id = " + std::to_string(pad_a) +
                            " and engram_pad_id = " + std::to_string(pad_b) + " disagree");
  }
  c.pad_token_id = has_a ? pad_a : pad_b;
  DS41_RETURN_IF_ERROR(c.validate().with_context("engram config"));
  return c;
}

}  // namespace ds41::engram
