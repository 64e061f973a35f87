// ds41 text: byte-level BPE model (see bpe_model.h).
#include "text/bpe_model.h"

#include <climits>
#include <queue>

#include "text/byte_level.h"

namespace ds41::text {

// Below this many initial symbols the quadratic rescan beats the heap (measured with
// `ds41 bench tokenize`); must stay <= 128 (the size of merge_small's arrays).
constexpr size_t kSmallWord = 24;

Result<BpeModel> BpeModel::from_json(const nlohmann::json& m) {
  if (!m.is_object() || m.value("type", "") != "BPE")
    return unimplemented("tokenizer.json model.type is not BPE (only byte-level BPE is supported)");
  if (m.contains("dropout") && !m["dropout"].is_null())
    return unimplemented("tokenizer.json model.dropout is set");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(k) && !m[k].is_null() && m[k] != "")
      return unimplemented(std::string("tokenizer.json model.") + k);
  }
  if (m.value("byte_fallback", false)) return unimplemented("tokenizer.json model.byte_fallback=true");
  if (m.value("ignore_merges", false)) return unimplemented("tokenizer.json model.ignore_merges=true");
  if (!m.contains("vocab") || !m["vocab"].is_object())
    return invalid_argument("tokenizer.json model.vocab missing");
  if (!m.contains("merges") || !m["merges"].is_array())
    return invalid_argument("tokenizer.json model.merges missing");

  BpeModel b;
  int32_t max_id = -1;
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer())
      return invalid_argument("tokenizer.json vocab entry '" + it.key() + "' has a non-integer id");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX / 2)
      return invalid_argument("tokenizer.json vocab id out of range: " + std::to_string(id));
    max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
  }
  b.id_to_token_.assign(max_id + 1, std::string());
  b.has_id_.assign(max_id + 1, 0);
  b.token_to_id_.reserve(m["vocab"].size() * 2);
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    if (b.has_id_[id])
      return invalid_argument("tokenizer.json vocab: id " + std::to_string(id) + " used twice");
    b.has_id_[id] = 1;
    b.id_to_token_[id] = it.key();
    b.token_to_id_.emplace(it.key(), id);
  }
  const ByteLevel& bl = ByteLevel::instance();
  for (int byte = 0; byte < 256; ++byte) {
    auto f = b.find(bl.byte_to_utf8(static_cast<uint8_t>(byte)));
    if (!f)
      return invalid_argument("tokenizer.json vocab lacks the byte-level token of byte " +
                              std::to_string(byte));
    b.byte_id_[byte] = *f;
  }

  const auto& merges = m["merges"];
  b.num_merges_ = merges.size();
  size_t cap = 16;
  while (cap < merges.size() * 2 + 16) cap <<= 1;
  b.slots_.assign(cap, MergeSlot{kEmpty, 0, 0});
  b.mask_ = cap - 1;
  b.shift_ = 64 - __builtin_ctzll(cap);
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string left, right;
    const auto& e = merges[r];
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return invalid_argument("tokenizer.json merge " + std::to_string(r) + " is not 'A B': '" + s + "'");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      return invalid_argument("tokenizer.json merge " + std::to_string(r) + " has an unknown format");
    }
    auto l = b.find(left), rr = b.find(right), mg = b.find(left + right);
    if (!l || !rr || !mg)
      return invalid_argument("tokenizer.json merge " + std::to_string(r) + " ('" + left + "' '" + right +
                              "') refers to a token missing from the vocabulary");
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(*l)) << 32) | static_cast<uint32_t>(*rr);
    size_t h = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> b.shift_);
    while (b.slots_[h].key != kEmpty && b.slots_[h].key != key) h = (h + 1) & b.mask_;
    if (b.slots_[h].key == key) continue;  // duplicate merge: the first (lowest) rank wins, as in HF
    b.slots_[h] = MergeSlot{key, static_cast<int32_t>(r), *mg};
  }
  return b;
}

std::optional<int32_t> BpeModel::find(std::string_view token) const {
  auto it = token_to_id_.find(std::string(token));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

// Words up to kSmallWord symbols: keep the rank of every adjacent pair and rescan for the minimum after each
// merge.
void BpeModel::merge_small(std::vector<int32_t>* syms_ptr) const {
  auto& syms = *syms_ptr;
  int32_t ranks[128], merged[128];
  int n = static_cast<int>(syms.size());
  auto pair_rank = [&](int i) {
    const MergeSlot* s = find_merge(syms[i], syms[i + 1]);
    ranks[i] = s ? s->rank : INT32_MAX;
    merged[i] = s ? s->merged : -1;
  };
  for (int i = 0; i + 1 < n; ++i) pair_rank(i);
  while (n > 1) {
    int best = -1;
    int32_t best_rank = INT32_MAX;
    for (int i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best < 0) break;
    syms[best] = merged[best];
    for (int i = best + 1; i + 1 < n; ++i) {
      syms[i] = syms[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    syms.resize(n);
    if (best > 0) pair_rank(best - 1);
    if (best + 1 < n) pair_rank(best);
  }
}

// Long words: doubly linked symbols and a min-heap of candidate merges keyed by (rank, position),
// with stale entries skipped on pop (HF tokenizers' algorithm, O(n log n)).
void BpeModel::merge_large(std::vector<int32_t>* syms_ptr) const {
  auto& syms = *syms_ptr;
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = (i + 1 < n) ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    const MergeSlot* s = find_merge(syms[i], syms[next[i]]);
    if (s) heap.push(Cand{s->rank, i, s->merged});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    const MergeSlot* s = find_merge(syms[c.pos], syms[next[c.pos]]);
    if (!s || s->merged != c.merged || s->rank != c.rank) continue;  // stale entry
    const int r = next[c.pos];
    syms[c.pos] = c.merged;
    alive[r] = 0;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int w = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_word(std::string_view bytes, std::vector<int32_t>* out) const {
  thread_local std::vector<int32_t> syms;
  syms.clear();
  for (unsigned char c : bytes) syms.push_back(byte_id_[c]);
  if (syms.size() <= kSmallWord) {
    merge_small(&syms);
  } else {
    merge_large(&syms);
  }
  out->insert(out->end(), syms.begin(), syms.end());
}

}  // namespace ds41::text
