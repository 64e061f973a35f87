// ds41 text: HF pre-tokenizer pipeline on PCRE2 (see pre_tokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pre_tokenizer.h"

#include <pcre2.h>

namespace ds41::text {
namespace {

// Unicode White_Space (PropList.txt), i.e. Oniguruma's `\s` for UTF-8 subjects.
constexpr std::string_view kWhiteSpaceItems =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{"
    "3000}";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#&~ ").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

Result<std::string> rewrite_onig_pattern_for_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's' || e == 'S') {
        if (in_class) {
          if (e == 'S') return unimplemented("regex '" + std::string(p) + "': \\S inside a character class");
          out += kWhiteSpaceItems;
        } else {
          out += (e == 's') ? "[" : "[^";
          out += kWhiteSpaceItems;
          out += "]";
        }
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (in_class && c == '[') {
      return unimplemented("regex '" + std::string(p) + "': nested character classes");
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  if (in_class) return invalid_argument("regex '" + std::string(p) + "': unterminated character class");
  return out;
}

Result<std::shared_ptr<const Pcre2Regex>> Pcre2Regex::compile(const std::string& pattern) {
  DS41_ASSIGN_OR_RETURN(std::string rewritten, rewrite_onig_pattern_for_pcre2(pattern));
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (code == nullptr) {
    return invalid_argument("regex '" + pattern + "' does not compile at offset " + std::to_string(off) +
                            ": " + pcre2_error_text(err));
  }
  std::shared_ptr<Pcre2Regex> r(new Pcre2Regex());
  r->code_ = code;
  r->pattern_ = pattern;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const Pcre2Regex>(std::move(r));
}

Pcre2Regex::~Pcre2Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void* Pcre2Regex::make_match_data() const {
  return pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code_), nullptr);
}

void Pcre2Regex::free_match_data(void* md) { pcre2_match_data_free(static_cast<pcre2_match_data*>(md)); }

void Pcre2Regex::split_isolated(const char* subject, uint32_t n, uint32_t base, void* md_void,
                                std::vector<std::pair<uint32_t, uint32_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(md_void);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject);
  uint32_t pos = 0, prev = 0;
  while (pos <= n) {
    int rc = jit_ ? pcre2_jit_match(code, s, n, pos, 0, md, nullptr) : PCRE2_ERROR_JIT_STACKLIMIT;
    // JIT stack exhausted (huge pathological pieces) or no JIT: the interpreter (heap-based).
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(code, s, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    // No match; or (never seen with the shipped patterns) a PCRE2 resource limit, in which case
    // the rest of the piece stays one pre-token.
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const uint32_t b = static_cast<uint32_t>(ov[0]), e = static_cast<uint32_t>(ov[1]);
    if (e == b) {
      // Empty match (the shipped patterns cannot produce one): no piece; step one character.
      if (b >= n) break;
      pos = b + 1;
      while (pos < n && (static_cast<uint8_t>(subject[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (b > prev) out->emplace_back(base + prev, base + b);
    out->emplace_back(base + b, base + e);
    prev = pos = e;
    if (e >= n) break;
  }
  if (prev < n) out->emplace_back(base + prev, base + n);
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer pt;
  if (j.is_null()) return pt;
  std::vector<const nlohmann::json*> steps;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return invalid_argument("pre_tokenizer Sequence without a 'pretokenizers' array");
    for (const auto& s : j["pretokenizers"]) steps.push_back(&s);
  } else {
    steps.push_back(&j);
  }
  bool seen_byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = *steps[i];
    const std::string t = s.value("type", "");
    const std::string where = "pre_tokenizer step " + std::to_string(i) + " (" + t + ")";
    if (seen_byte_level) return unimplemented(where + ": steps after ByteLevel are not supported");
    if (t == "Split") {
      if (s.value("behavior", "") != "Isolated")
        return unimplemented(where + ": behavior '" + s.value("behavior", "") + "' (only Isolated)");
      if (s.value("invert", false)) return unimplemented(where + ": invert=true");
      if (!s.contains("pattern") || !s["pattern"].is_object())
        return invalid_argument(where + ": missing pattern");
      const auto& pat = s["pattern"];
      std::string regex;
      if (pat.contains("Regex") && pat["Regex"].is_string()) {
        regex = pat["Regex"].get<std::string>();
      } else if (pat.contains("String") && pat["String"].is_string()) {
        regex = escape_literal(pat["String"].get<std::string>());
      } else {
        return invalid_argument(where + ": pattern is neither Regex nor String");
      }
      auto r = Pcre2Regex::compile(regex);
      if (!r.ok()) return r.status().with_context(where);
      pt.regexes_.push_back(std::move(r).value());
    } else if (t == "ByteLevel") {
      if (s.value("add_prefix_space", false)) return unimplemented(where + ": add_prefix_space=true");
      if (s.value("use_regex", true)) return unimplemented(where + ": use_regex=true (GPT-2 regex)");
      seen_byte_level = true;  // the byte mapping itself is done by the BPE model
    } else {
      return unimplemented(where + ": pre-tokenizer type not supported");
    }
  }
  if (!seen_byte_level)
    return unimplemented("pre_tokenizer: no ByteLevel step (only byte-level BPE is supported)");
  return pt;
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& pt) {
  for (const auto& r : pt.regexes_) match_data_.push_back(r->make_match_data());
}

PreTokenizer::Scratch::~Scratch() {
  for (void* md : match_data_) Pcre2Regex::free_match_data(md);
}

const std::vector<std::pair<uint32_t, uint32_t>>& PreTokenizer::split(std::string_view text,
                                                                      Scratch* sc) const {
  sc->a_.clear();
  sc->a_.emplace_back(0u, static_cast<uint32_t>(text.size()));
  for (size_t k = 0; k < regexes_.size(); ++k) {
    sc->b_.clear();
    for (const auto& [b, e] : sc->a_) {
      regexes_[k]->split_isolated(text.data() + b, e - b, b, sc->match_data_[k], &sc->b_);
    }
    sc->a_.swap(sc->b_);
  }
  return sc->a_;
}

}  // namespace ds41::text
