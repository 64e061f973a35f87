// ds41 text: tokenizer.json vocabulary reading (see tokenizer_vocab.h).
#include "text/tokenizer_vocab.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

namespace ds41::text {

namespace {

constexpr int64_t kMaxTokenId = (int64_t{1} << 31) - 2;

}  // namespace

namespace {

// The entries of model.vocab and added_tokens as they appear in the file.
struct RawVocabEntries {
  std::vector<std::pair<std::string, int64_t>> vocab;  // (string, id)
  std::vector<std::pair<int64_t, std::string>> added;  // (id, content)
};

Status check_id(int64_t id, const std::string& what) {
  if (id < 0 || id > kMaxTokenId) {
    return out_of_range("tokenizer.json: " + what + " has id " + std::to_string(id) + " out of range");
  }
  return ok_status();
}

// Common to the DOM and the streaming reader: id checks, gap check, added tokens override.
Result<TokenizerVocab> assemble_vocab(RawVocabEntries raw) {
  int64_t max_id = -1;
  for (const auto& [piece, id] : raw.vocab) {
    DS41_RETURN_IF_ERROR(check_id(id, "model.vocab entry '" + piece + "'"));
    max_id = std::max(max_id, id);
  }
  for (const auto& [id, content] : raw.added) {
    DS41_RETURN_IF_ERROR(check_id(id, "added token '" + content + "'"));
    max_id = std::max(max_id, id);
  }
  if (max_id < 0) return invalid_argument("tokenizer.json: the vocabulary is empty");

  TokenizerVocab out;
  const auto n = static_cast<size_t>(max_id + 1);
  out.pieces.resize(n);
  out.is_added.assign(n, 0);
  std::vector<uint8_t> present(n, 0);
  for (auto& [piece, id] : raw.vocab) {
    const auto k = static_cast<size_t>(id);
    if (present[k]) {
      return invalid_argument("tokenizer.json: model.vocab id " + std::to_string(id) + " is used by '" +
                              out.pieces[k] + "' and '" + piece + "'");
    }
    present[k] = 1;
    out.pieces[k] = std::move(piece);
  }
  for (auto& [id, content] : raw.added) {  // an added token wins over model.vocab (as in make_goldens.py)
    const auto k = static_cast<size_t>(id);
    present[k] = 1;
    out.pieces[k] = std::move(content);
    out.is_added[k] = 1;
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

// Streaming (SAX) reader that keeps only model.vocab and added_tokens: tokenizer.json is mostly
// merges, and building a DOM for them would dominate the model-load time.
class VocabSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  RawVocabEntries entries;
  bool saw_model = false, saw_vocab = false, saw_added = false;
  std::string error;  // first semantic error (the parse is stopped)

  bool null() override { return scalar(Scalar{}); }
  bool boolean(bool) override { return scalar(Scalar{}); }
  bool number_integer(number_integer_t v) override { return scalar(Scalar{true, v, false, {}}); }
  bool number_unsigned(number_unsigned_t v) override {
    return scalar(
        Scalar{true, v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v), false, {}});
  }
  bool number_float(number_float_t, const string_t&) override { return scalar(Scalar{}); }
  bool string(string_t& v) override { return scalar(Scalar{false, 0, true, std::move(v)}); }
  bool binary(binary_t&) override { return scalar(Scalar{}); }
  bool start_object(std::size_t) override {
    const Where w = where();
    if (w == Where::kModel) saw_model = true;
    if (w == Where::kVocab) saw_vocab = true;
    if (w == Where::kAddedList) return fail("'added_tokens' is not a list");
    if (w == Where::kAddedElement) {
      added_open_ = true;
      added_id_.reset();
      added_content_.reset();
    }
    stack_.push_back(Frame{false, {}});
    return true;
  }
  bool key(string_t& k) override {
    stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    if (added_open_ && stack_.size() == 2 && in_added_list()) {
      added_open_ = false;
      if (!added_id_ || !added_content_)
        return fail("an added_tokens entry lacks an integer 'id' or string 'content'");
      entries.added.emplace_back(*added_id_, std::move(*added_content_));
    }
    return true;
  }
  bool start_array(std::size_t) override {
    const Where w = where();
    if (w == Where::kAddedList) saw_added = true;
    if (w == Where::kModel) return fail("'model' is not an object");
    if (w == Where::kAddedElement) return fail("an added_tokens entry is not an object");
    if (w == Where::kVocab) return fail("'model.vocab' is not an object");
    stack_.push_back(Frame{true, {}});
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    if (error.empty()) error = "not valid JSON at byte " + std::to_string(pos) + ": " + e.what();
    return false;
  }

 private:
  struct Frame {
    bool is_array;
    std::string key;  // current key (objects only)
  };
  struct Scalar {
    bool is_int = false;
    int64_t i = 0;
    bool is_string = false;
    std::string s;
  };
  enum class Where { kOther, kModel, kVocab, kVocabValue, kAddedList, kAddedElement, kAddedField };

  bool in_added_list() const { return !stack_.empty() && stack_[0].key == "added_tokens"; }

  // What a value starting now would be.
  Where where() const {
    const size_t d = stack_.size();
    if (d == 1 && !stack_[0].is_array) {
      if (stack_[0].key == "model") return Where::kModel;
      if (stack_[0].key == "added_tokens") return Where::kAddedList;
    }
    if (d == 2 && !stack_[0].is_array && stack_[0].key == "model" && !stack_[1].is_array &&
        stack_[1].key == "vocab")
      return Where::kVocab;
    if (d == 3 && !stack_[0].is_array && stack_[0].key == "model" && stack_[1].key == "vocab" &&
        !stack_[1].is_array)
      return Where::kVocabValue;
    if (d == 2 && in_added_list() && stack_[1].is_array) return Where::kAddedElement;
    if (d == 3 && in_added_list() && stack_[1].is_array && !stack_[2].is_array) return Where::kAddedField;
    return Where::kOther;
  }

  bool scalar(Scalar v) {
    switch (where()) {
      case Where::kVocabValue:
        if (!v.is_int) return fail("model.vocab entry '" + stack_[2].key + "' has a non-integer id");
        entries.vocab.emplace_back(stack_[2].key, v.i);
        return true;
      case Where::kAddedField:
        if (stack_[2].key == "id") {
          if (!v.is_int) return fail("an added token has a non-integer id");
          added_id_ = v.i;
        } else if (stack_[2].key == "content") {
          if (!v.is_string) return fail("an added token has a non-string content");
          added_content_ = std::move(v.s);
        }
        return true;
      case Where::kModel: return fail("'model' is not an object");
      case Where::kVocab: return fail("'model.vocab' is not an object");
      case Where::kAddedList: return fail("'added_tokens' is not a list");
      case Where::kAddedElement: return fail("an added_tokens entry is not an object");
      default: return true;
    }
  }
  bool fail(const std::string& m) {
    if (error.empty()) error = m;
    return false;
  }

  std::vector<Frame> stack_;
  bool added_open_ = false;
  std::optional<int64_t> added_id_;
  std::optional<std::string> added_content_;
};

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

  RawVocabEntries raw;
  raw.vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return invalid_argument("tokenizer.json: model.vocab entry '" + it.key() + "' has a non-integer id");
    }
    raw.vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  if (added != doc.end()) {
    for (const auto& a : *added) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return invalid_argument(
            "tokenizer.json: an added_tokens entry lacks an integer 'id' or string 'content'");
      }
      raw.added.emplace_back(a["id"].get<int64_t>(), a["content"].get<std::string>());
    }
  }
  return assemble_vocab(std::move(raw));
}

Result<TokenizerVocab> read_tokenizer_vocab(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot open tokenizer file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return io_error("read error on " + path);
  const std::string text = ss.str();
  VocabSax sax;
  const bool parsed = nlohmann::json::sax_parse(text, &sax);
  if (!sax.error.empty()) return invalid_argument(path + ": " + sax.error);
  if (!parsed) return data_loss(path + ": not valid JSON");
  if (!sax.saw_model) return not_found(path + ": 'model' object is missing");
  if (!sax.saw_vocab) return not_found(path + ": 'model.vocab' is missing");
  auto r = assemble_vocab(std::move(sax.entries));
  if (!r.ok()) return r.status().with_context(path);
  return r;
}

}  // namespace ds41::text
