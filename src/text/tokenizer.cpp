// ds41 text: tokenizer.json loader and BPE encode/decode (see tokenizer.h).
#include "text/tokenizer.h"

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

void Tokenizer::encode_append(std::string_view input, std::vector<int32_t>* out,
                              const EncodeOptions& opts) const {
  std::string repaired;
  std::string_view text = input;
  if (!utf8_is_valid(input)) {
    repaired = utf8_sanitize(input);
    text = repaired;
  }
  if (text.size() > UINT32_MAX / 2) {
    // Offsets are 32-bit; split absurdly large inputs (>2 GiB) at a character boundary. Not
    // bit-identical to HF at the cut, which no real prompt reaches.
    size_t cut = UINT32_MAX / 4;
    while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
    encode_append(text.substr(0, cut), out, opts);
    encode_append(text.substr(cut), out, opts);
    return;
  }
  const auto n = static_cast<uint32_t>(text.size());
  if (!opts.split_added_tokens || (added_raw_.empty() && added_normalized_.empty())) {
    encode_text_segment(text, 0, n, out);
    return;
  }
  // Pass 1: non-normalized added tokens on the raw text; pass 2: normalized ones in the gaps
  // (the normalizer is the identity here, so "normalized text" is the gap text itself).
  std::vector<AddedTokenMatcher::Match> first, all;
  added_raw_.find_all(text, 0, n, &first);
  uint32_t pos = 0;
  auto second_pass = [&](uint32_t b, uint32_t e) {
    if (b < e) added_normalized_.find_all(text, b, e, &all);
  };
  for (const auto& m : first) {
    second_pass(pos, m.begin);
    all.push_back(m);
    pos = m.end;
  }
  second_pass(pos, n);
  // `all` is ordered because each gap's matches precede the raw match that ends the gap.
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
