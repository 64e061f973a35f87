// ds41 text: added-token trie and leftmost-longest scan (see added_tokens.h).
#include "text/added_tokens.h"

namespace ds41::text {

void AddedTokenMatcher::add(std::string_view content, int32_t id) {
  if (content.empty()) return;
  int32_t node = 0;
  for (unsigned char c : content) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      const auto child = static_cast<int32_t>(node_id_.size());
      node_id_.push_back(-1);
      edges_.emplace(key, child);
      node = child;
    } else {
      node = it->second;
    }
  }
  if (node_id_[node] < 0) {
    node_id_[node] = id;
    ++num_tokens_;
  }
  first_byte_[static_cast<unsigned char>(content[0])] = true;
}

void AddedTokenMatcher::find_all(std::string_view text, uint32_t begin, uint32_t end,
                                 std::vector<Match>* out) const {
  if (num_tokens_ == 0) return;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  uint32_t i = begin;
  while (i < end) {
    if (!first_byte_[p[i]]) {
      ++i;
      continue;
    }
    int32_t node = 0, best_id = -1;
    uint32_t best_end = 0;
    for (uint32_t j = i; j < end; ++j) {
      auto it = edges_.find((static_cast<uint64_t>(node) << 8) | p[j]);
      if (it == edges_.end()) break;
      node = it->second;
      if (node_id_[node] >= 0) {
        best_id = node_id_[node];
        best_end = j + 1;
      }
    }
    if (best_id >= 0) {
      out->push_back(Match{i, best_end, best_id});
      i = best_end;
    } else {
      ++i;
    }
  }
}

}  // namespace ds41::text
