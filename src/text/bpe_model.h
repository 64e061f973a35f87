// ds41 text: the byte-level BPE model of tokenizer.json (MODEL_SPEC 6.1: 128,000 base tokens,
// 127,741 merges, no byte fallback). Owns the vocabulary, the merge table (pair of ids ->
// rank and merged id, an open-addressing hash map) and the merge loop for one pre-token.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace ds41::text {

class BpeModel {
 public:
  // Builds from the "model" object of tokenizer.json (type BPE). Rejects dropout, unk tokens
  // used as fallback, continuing_subword_prefix / end_of_word_suffix, byte_fallback and
  // ignore_merges=true with an Unimplemented error naming the field.
  static Result<BpeModel> from_json(const nlohmann::json& model);

  // Appends the ids of one pre-token given as raw bytes (bytes.size() >= 1). Merges are applied
  // lowest rank first, leftmost first among equal ranks (as HF tokenizers' BPE::merge_word).
  void encode_word(std::string_view bytes, std::vector<int32_t>* out) const;

  // Highest id + 1 (ids may have gaps in principle).
  int32_t id_end() const { return static_cast<int32_t>(id_to_token_.size()); }
  // Vocabulary string of id ("" when id has no vocabulary entry).
  const std::string& token(int32_t id) const { return id_to_token_[id]; }
  bool has_id(int32_t id) const { return id >= 0 && id < id_end() && has_id_[id]; }
  std::optional<int32_t> find(std::string_view token) const;
  size_t num_merges() const { return num_merges_; }
  size_t vocab_size() const { return token_to_id_.size(); }

 private:
  struct MergeSlot {
    uint64_t key;  // (left << 32) | right; kEmpty when unused
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  const MergeSlot* find_merge(int32_t left, int32_t right) const {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
    for (;;) {
      const MergeSlot& s = slots_[h];
      if (s.key == key) return &s;
      if (s.key == kEmpty) return nullptr;
      h = (h + 1) & mask_;
    }
  }
  void merge_small(std::vector<int32_t>* syms) const;
  void merge_large(std::vector<int32_t>* syms) const;

  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_id_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<MergeSlot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t num_merges_ = 0;
  std::array<int32_t, 256> byte_id_{};  // id of the one-character token of each byte
};

}  // namespace ds41::text
