// ds41 text: matching of tokenizer.json `added_tokens` in raw text (MODEL_SPEC 6.1), done
// before pre-tokenization. Owns a byte trie and the leftmost-longest scan that HF tokenizers'
// AddedVocabulary performs with Aho-Corasick (MatchKind::LeftmostLongest).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds41::text {

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // content must be non-empty; a repeated content keeps the first id.
  void add(std::string_view content, int32_t id);
  bool empty() const { return num_tokens_ == 0; }

  struct Match {
    uint32_t begin, end;
    int32_t id;
  };
  // Appends every leftmost-longest, non-overlapping match inside text[begin, end).
  void find_all(std::string_view text, uint32_t begin, uint32_t end, std::vector<Match>* out) const;

 private:
  // Node 0 is the root. Edges keyed by (node << 8) | byte.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> node_id_{-1};  // token id ending at this node, -1 if none
  bool first_byte_[256] = {};
  size_t num_tokens_ = 0;
};

}  // namespace ds41::text
