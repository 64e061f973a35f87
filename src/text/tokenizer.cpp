// ds41 text: tokenizer.json loader and BPE encode/decode (see tokenizer.h).
#include "text/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "text/byte_level.h"
#include "text/utf8.h"

namespace ds41::text {
namespace {

std::atomic<uint64_t> g_next_serial{1};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Per-thread state for one tokenizer instance: PCRE2 scratch and the pre-token -> ids cache.
struct ThreadState {
  uint64_t serial = 0;
  std::unique_ptr<PreTokenizer::Scratch> scratch;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<int32_t> arena;
};
constexpr size_t kCacheMaxEntries = 1 << 17;
constexpr size_t kCacheMaxWordBytes = 256;

ThreadState& thread_state(uint64_t serial, const PreTokenizer& pre) {
  thread_local ThreadState st;
  if (st.serial != serial) {
    st.serial = serial;
    st.scratch = std::make_unique<PreTokenizer::Scratch>(pre);
    st.cache.clear();
    st.arena.clear();
  }
  return st;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("tokenizer file '" + path + "' cannot be opened");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return io_error("tokenizer file '" + path + "': read error");
  return from_json_text(ss.str(), path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_model_dir(const std::string& dir) {
  return from_file(dir + "/tokenizer.json");
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(std::string_view text,
                                                             const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument(source + ": not a JSON object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->serial_ = g_next_serial.fetch_add(1);

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const auto& n = j["normalizer"];
    const bool empty_seq = n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                           n["normalizers"].is_array() && n["normalizers"].empty();
    if (!empty_seq)
      return unimplemented(source + ": normalizer '" + n.value("type", "?") + "' is not supported");
  }
  if (!j.contains("decoder") || !j["decoder"].is_object() || j["decoder"].value("type", "") != "ByteLevel")
    return unimplemented(source + ": decoder must be ByteLevel");
  {
    auto m = BpeModel::from_json(j.contains("model") ? j["model"] : nlohmann::json());
    if (!m.ok()) return m.status().with_context(source);
    t->model_ = std::move(m).value();
  }
  {
    auto p = PreTokenizer::from_json(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json());
    if (!p.ok()) return p.status().with_context(source);
    t->pre_ = std::move(p).value();
  }

  int32_t id_end = t->model_.id_end();
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) return invalid_argument(source + ": added_tokens is not an array");
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string())
        return invalid_argument(source + ": added_tokens entry without integer id / string content");
      AddedTokenInfo info{a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", false),
                          a.value("normalized", !a.value("special", false))};
      if (info.id < 0)
        return invalid_argument(source + ": added token '" + info.content + "' has a negative id");
      if (info.content.empty())
        return invalid_argument(source + ": added token " + std::to_string(info.id) + " is empty");
      if (!utf8_is_valid(info.content))
        return invalid_argument(source + ": added token " + std::to_string(info.id) + " is not valid UTF-8");
      for (const char* k : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(k, false))
          return unimplemented(source + ": added token '" + info.content + "' uses " + k + "=true");
      }
      id_end = std::max(id_end, info.id + 1);
      t->added_.push_back(std::move(info));
    }
  }

  const ByteLevel& bl = ByteLevel::instance();
  t->bytes_.assign(id_end, std::string());
  t->kind_.assign(id_end, kNone);
  for (int32_t id = 0; id < t->model_.id_end(); ++id) {
    if (!t->model_.has_id(id)) continue;
    const std::string& tok = t->model_.token(id);
    auto b = bl.decode(tok);
    t->bytes_[id] = b ? *b : tok;  // HF ByteLevel decoder: unmappable token -> its own bytes
    t->kind_[id] = kVocab;
  }
  t->added_index_.assign(id_end, -1);
  for (size_t i = 0; i < t->added_.size(); ++i) {
    const auto& a = t->added_[i];
    if (t->added_index_[a.id] >= 0)
      return invalid_argument(source + ": added token id " + std::to_string(a.id) + " appears twice");
    t->added_index_[a.id] = static_cast<int32_t>(i);
    t->added_by_content_.emplace(a.content, a.id);
    auto b = bl.decode(a.content);
    t->bytes_[a.id] = b ? *b : a.content;
    t->kind_[a.id] = a.special ? kSpecial : kAdded;
    (a.normalized ? t->added_normalized_ : t->added_raw_).add(a.content, a.id);
  }
  return t;
}

std::string_view Tokenizer::piece(int32_t id) const {
  if (!valid_id(id)) return "";
  if (kind_[id] != kVocab) return added_[added_index_[id]].content;
  return model_.token(id);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view piece) const {
  auto it = added_by_content_.find(std::string(piece));
  if (it != added_by_content_.end()) return it->second;
  return model_.find(piece);
}

void Tokenizer::encode_text_segment(std::string_view text, uint32_t begin, uint32_t end,
                                    std::vector<int32_t>* out) const {
  if (begin >= end) return;
  ThreadState& st = thread_state(serial_, pre_);
  const std::string_view seg = text.substr(begin, end - begin);
  const auto& ranges = pre_.split(seg, st.scratch.get());
  for (const auto& [b, e] : ranges) {
    const std::string_view word = seg.substr(b, e - b);
    if (word.size() > kCacheMaxWordBytes) {
      model_.encode_word(word, out);
      continue;
    }
    auto it = st.cache.find(word);
    if (it != st.cache.end()) {
      out->insert(out->end(), st.arena.begin() + it->second.first,
                  st.arena.begin() + it->second.first + it->second.second);
      continue;
    }
    const size_t before = out->size();
    model_.encode_word(word, out);
    if (st.cache.size() >= kCacheMaxEntries) {
      st.cache.clear();
      st.arena.clear();
    }
    const auto off = static_cast<uint32_t>(st.arena.size());
    st.arena.insert(st.arena.end(), out->begin() + before, out->end());
    st.cache.emplace(std::string(word), std::make_pair(off, static_cast<uint32_t>(out->size() - before)));
  }
}

namespace {

// The ranges of `ranges` that overlap [lo, hi), clipped to it and shifted by -lo.
std::vector<TextRange> clip_ranges(std::span<const TextRange> ranges, size_t lo, size_t hi) {
  std::vector<TextRange> out;
  for (const TextRange& r : ranges) {
    const size_t b = std::max(r.begin, lo), e = std::min(r.end, hi);
    if (b < e) out.push_back({b - lo, e - lo});
  }
  return out;
}

}  // namespace

void Tokenizer::encode_append(std::string_view input, std::vector<int32_t>* out,
                              const EncodeOptions& opts) const {
  const bool match = opts.split_added_tokens && !(added_raw_.empty() && added_normalized_.empty());
  const TextRange whole{0, input.size()};
  std::span<const TextRange> ranges;  // where added tokens may be matched (none: plain text)
  if (match) ranges = opts.added_token_ranges.value_or(std::span<const TextRange>(&whole, 1));

  std::string repaired;
  std::vector<TextRange> repaired_ranges;
  std::string_view text = input;
  if (!utf8_is_valid(input)) {
    // Repair each piece between range boundaries on its own, so that the ranges keep covering
    // the same characters (a replacement never joins bytes from both sides of a boundary).
    // Without ranges this is utf8_sanitize of the whole input.
    std::vector<size_t> cuts = {0, input.size()};
    for (const TextRange& r : ranges) {
      cuts.push_back(std::min(r.begin, input.size()));
      cuts.push_back(std::min(r.end, input.size()));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<size_t> new_pos(cuts.size());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      new_pos[i] = repaired.size();
      repaired += utf8_sanitize(input.substr(cuts[i], cuts[i + 1] - cuts[i]));
    }
    new_pos.back() = repaired.size();
    auto moved = [&](size_t p) {
      p = std::min(p, input.size());
      return new_pos[std::lower_bound(cuts.begin(), cuts.end(), p) - cuts.begin()];
    };
    for (const TextRange& r : ranges) repaired_ranges.push_back({moved(r.begin), moved(r.end)});
    text = repaired;
    ranges = repaired_ranges;
  }
  // Offsets are 32-bit; split absurdly large inputs (>2 GiB) at a character boundary. Not
  // bit-identical to HF at the cut, which no real prompt reaches.
  size_t lo = 0;
  while (text.size() - lo > UINT32_MAX / 2) {
    size_t cut = lo + UINT32_MAX / 4;
    while (cut > lo && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
    encode_valid(text.substr(lo, cut - lo), clip_ranges(ranges, lo, cut), out);
    lo = cut;
  }
  encode_valid(text.substr(lo), clip_ranges(ranges, lo, text.size()), out);
}

void Tokenizer::encode_valid(std::string_view text, std::span<const TextRange> allowed,
                             std::vector<int32_t>* out) const {
  const auto n = static_cast<uint32_t>(text.size());
  // Pass 1: non-normalized added tokens on the raw text; pass 2: normalized ones in the gaps
  // (the normalizer is the identity here, so "normalized text" is the gap text itself). Both
  // passes look only inside the allowed ranges.
  auto find_in = [&](const AddedTokenMatcher& m, uint32_t b, uint32_t e,
                     std::vector<AddedTokenMatcher::Match>* found) {
    for (const TextRange& r : allowed) {
      const auto rb = static_cast<uint32_t>(std::max<size_t>(r.begin, b));
      const auto re = static_cast<uint32_t>(std::min<size_t>(r.end, e));
      if (rb < re) m.find_all(text, rb, re, found);
    }
  };
  std::vector<AddedTokenMatcher::Match> first, all;
  find_in(added_raw_, 0, n, &first);
  uint32_t pos = 0;
  for (const auto& m : first) {
    find_in(added_normalized_, pos, m.begin, &all);
    all.push_back(m);
    pos = m.end;
  }
  find_in(added_normalized_, pos, n, &all);
  // `all` is ordered because the ranges are sorted and each gap's matches precede the raw
  // match that ends the gap.
  pos = 0;
  for (const auto& m : all) {
    encode_text_segment(text, pos, m.begin, out);
    out->push_back(m.id);
    pos = m.end;
  }
  encode_text_segment(text, pos, n, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_append(text, &ids, opts);
  return ids;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (!valid_id(id))
      return out_of_range("decode: token id " + std::to_string(id) + " at position " + std::to_string(i) +
                          " is not in the vocabulary (ids are 0.." + std::to_string(id_end() - 1) + ")");
    if (skip_special && kind_[id] == kSpecial) continue;
    bytes += bytes_[id];
  }
  return utf8_sanitize(bytes);
}

}  // namespace ds41::text
