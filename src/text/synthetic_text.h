// ds41 text: a deterministic generator of mixed-script text for tokenizer tests and the
// tokenize benchmark. Owns the categories (English, Chinese, Japanese, Korean, code in several
// languages, digit runs, emoji / ZWJ sequences, whitespace mixes, punctuation clusters, other
// scripts) and a seeded generator that is identical on every platform (splitmix64, no <random>
// distributions).
//
// It never emits U+0085 or U+FEFF: those are the two characters on which the regex engines of
// HF tokenizers (Oniguruma) and of JavaScript disagree about `\s` (see pre_tokenizer.h), so the
// npm oracle cannot judge them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds41::text {

enum class TextKind {
  kEnglish = 0,
  kChinese,
  kJapanese,
  kKorean,
  kCode,
  kDigits,
  kEmoji,
  kWhitespace,
  kPunctuation,
  kOtherScripts,
  kMixed,
  kCount
};
const char* text_kind_name(TextKind k);

class SyntheticText {
 public:
  explicit SyntheticText(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  // Uniform in [0, n) (n > 0).
  uint64_t below(uint64_t n) { return next_u64() % n; }

  // One string of the given kind, about `approx_chars` characters long.
  std::string make(TextKind kind, int approx_chars);
  // A line of mixed content for the benchmark corpus.
  std::string corpus_line();

 private:
  std::string english(int n);
  std::string chinese(int n);
  std::string japanese(int n);
  std::string korean(int n);
  std::string code(int n);
  std::string digits(int n);
  std::string emoji(int n);
  std::string whitespace(int n);
  std::string punctuation(int n);
  std::string other_scripts(int n);
  uint64_t state_;
};

// Deterministic corpus of at least `min_bytes` bytes, lines separated by '\n'.
std::string make_synthetic_corpus(uint64_t seed, size_t min_bytes);

}  // namespace ds41::text
