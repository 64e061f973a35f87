// ds41 text: the HF `pre_tokenizer` pipeline of tokenizer.json (MODEL_SPEC 6.1): a Sequence of
// `Split` steps (regex, behavior Isolated) followed by a `ByteLevel` step without its own
// regex. Owns regex compilation (PCRE2, UTF + UCP, JIT) and the splitting of a text into
// pre-tokens as byte ranges of the input.
//
// Regex dialect: tokenizer.json regexes are written for Oniguruma (what HF tokenizers runs).
// PCRE2 agrees with it on everything these patterns use except `\s`: Oniguruma's `\s` is the
// Unicode White_Space property (includes U+0085 NEL), PCRE2+UCP's `\s` is "Z categories plus
// \t\n\v\f\r" (no U+0085). We therefore rewrite `\s` / `\S` outside character classes into an
// explicit White_Space class before compiling, so splitting matches HF exactly. (JavaScript's
// `\s`, used by the npm oracle, differs again: it has U+FEFF and lacks U+0085.)
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace ds41::text {

// A compiled PCRE2 regex (UTF, UCP, JIT when available). Immutable and thread-safe; each thread
// passes its own MatchScratch.
class Pcre2Regex {
 public:
  static Result<std::shared_ptr<const Pcre2Regex>> compile(const std::string& pattern);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Appends to out the Isolated split of subject [0, n): matches and the gaps between them, as
  // [begin, end) offsets relative to `base`. `subject` must be valid UTF-8. `match_data` is a
  // pcre2_match_data* created for this regex (see make_match_data()).
  void split_isolated(const char* subject, uint32_t n, uint32_t base, void* match_data,
                      std::vector<std::pair<uint32_t, uint32_t>>* out) const;
  void* make_match_data() const;
  static void free_match_data(void* md);
  const std::string& pattern() const { return pattern_; }

 private:
  Pcre2Regex() = default;
  void* code_ = nullptr;  // pcre2_code*
  bool jit_ = false;
  std::string pattern_;
};

// Rewrites Oniguruma `\s` / `\S` (outside character classes) and `\s` inside classes into
// explicit Unicode White_Space classes; other syntax is passed through. Exposed for tests.
Result<std::string> rewrite_onig_pattern_for_pcre2(std::string_view pattern);

class PreTokenizer {
 public:
  // Builds from the "pre_tokenizer" object of tokenizer.json. Supported: null, Sequence, Split
  // (Regex or String pattern, behavior Isolated, invert false) and ByteLevel with
  // add_prefix_space=false and use_regex=false. Anything else is an Unimplemented error that
  // names the step.
  static Result<PreTokenizer> from_json(const nlohmann::json& j);

  // Per-thread scratch (PCRE2 match data and range buffers). Cheap to create.
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& pt);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class PreTokenizer;
    std::vector<void*> match_data_;
    std::vector<std::pair<uint32_t, uint32_t>> a_, b_;
  };

  // Splits valid UTF-8 `text` into pre-tokens; returns [begin, end) byte ranges into text.
  // The returned reference points into `scratch` and stays valid until its next use.
  const std::vector<std::pair<uint32_t, uint32_t>>& split(std::string_view text, Scratch* scratch) const;

  size_t num_regex() const { return regexes_.size(); }

 private:
  std::vector<std::shared_ptr<const Pcre2Regex>> regexes_;
};

}  // namespace ds41::text
