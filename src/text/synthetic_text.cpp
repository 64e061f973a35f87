// ds41 text: deterministic mixed-script text generator (see synthetic_text.h).
#include "text/synthetic_text.h"

#include <array>
#include <string_view>

#include "text/utf8.h"

namespace ds41::text {
namespace {

constexpr std::array<std::string_view, 64> kEnglishWords = {
    "the",    "of",        "and",      "to",        "in",    "is",    "that",  "for",     "it",   "as",
    "was",    "with",      "be",       "by",        "on",    "not",   "he",    "I",       "this", "are",
    "or",     "his",       "from",     "at",        "which", "but",   "have",  "an",      "had",  "they",
    "you",    "were",      "their",    "one",       "all",   "we",    "can",   "her",     "has",  "there",
    "been",   "if",        "more",     "when",      "will",  "would", "who",   "so",      "no",   "model",
    "token",  "inference", "DeepSeek", "attention", "don't", "it's",  "we'll", "they're", "I'm",  "you've",
    "O'Neil", "naïve",     "café",     "résumé"};
constexpr std::array<std::string_view, 12> kEnglishPunct = {".",  ",",  "!", "?",  ";", ":",
                                                            " -", " (", ")", "\"", "'", "..."};
constexpr std::string_view kCjkPunct = "，。！？、：；“”（）《》【】";
constexpr std::string_view kJaPunct = "。、「」ー・！？";
constexpr std::array<std::string_view, 16> kCodeSnippets = {
    "def f(x):\n    return x ** 2 + 1\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const xs = arr.map((v) => v?.id ?? null).filter(Boolean);\n",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![1, 2, 3];\n    Ok(())\n}\n",
    "func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {\n\tw.WriteHeader(200)\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;\n",
    "<div class=\"box\"><a href=\"https://example.com/?q=1&x=2\">link</a></div>\n",
    "if [ -f \"$HOME/.bashrc\" ]; then source ~/.bashrc; fi 2>&1 | tee -a log.txt\n",
    "template <typename T>\nstd::vector<T> f(const std::map<int, T>& m) noexcept;\n",
    "class Foo(Base):\n    \"\"\"Docstring.\"\"\"\n    def __init__(self, *args, **kwargs):\n        "
    "super().__init__()\n",
    "x = {'a': [1, 2.5e-3, None], \"b\": True}  # comment\r\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}\n",
    "  public static void main(String[] args) throws IOException {\n      System.out.println(\"hi\");\n  }\n",
    "let re = /^[a-z0-9_-]{3,16}$/i; // regex\n",
    "local t = {1, 2, 3} -- lua\nfor i, v in ipairs(t) do print(i, v) end\n",
    "@@ -1,4 +1,5 @@\n-old line\n+new line\n     context\n"};
constexpr std::array<std::string_view, 24> kEmoji = {"😀",
                                                     "🎉",
                                                     "👍",
                                                     "👍🏽",
                                                     "❤️",
                                                     "🇨🇳",
                                                     "🇺🇸",
                                                     "👨‍👩‍👧‍👦",
                                                     "🧑🏻‍💻",
                                                     "🏳️‍🌈",
                                                     "👩‍❤️‍💋‍👨",
                                                     "🤖",
                                                     "✨",
                                                     "🔥",
                                                     "☕",
                                                     "🙏🏿",
                                                     "😂",
                                                     "🫠",
                                                     "🐉",
                                                     "1️⃣",
                                                     "#️⃣",
                                                     "🏴‍☠️",
                                                     "🧪",
                                                     "🚀"};
constexpr std::array<std::string_view, 14> kWhitespace = {" ",      "  ",     "   ",  "\t",    "\t\t",
                                                          "\n",     "\r\n",   "\n\n", "\r",    "\u3000",
                                                          "\u00a0", "\u2028", " \n ", "\u2003"};
constexpr std::array<std::string_view, 24> kPunctClusters = {
    "!!!", "???",  "?!", "...", "…",    "---", "--->",        "<=>", "***", "«»",  "„“",  "—",
    "()",  "[]{}", "::", "=>",  "@#$%", "^_^", "¯\\_(ツ)_/¯", "§¶",  "±×÷", "™©®", "~~~", "|||"};
constexpr std::array<std::string_view, 12> kOtherScripts = {
    "Ελληνικά γράμματα", "Привет, мир",       "مرحبا بالعالم",  "שלום עולם",      "नमस्ते दुनिया",
    "สวัสดีชาวโลก",        "Xin chào thế giới", "Grüße aus Köln", "ñandú pingüino", "e\u0301te\u0301 a\u0300",
    "ǅemal ǈ",           "Ωμέγα ΣΊΣΥΦΟΣ"};

}  // namespace

const char* text_kind_name(TextKind k) {
  static const char* kNames[] = {"english", "chinese",    "japanese",    "korean",        "code", "digits",
                                 "emoji",   "whitespace", "punctuation", "other_scripts", "mixed"};
  const int i = static_cast<int>(k);
  return i >= 0 && i < static_cast<int>(TextKind::kCount) ? kNames[i] : "?";
}

uint64_t SyntheticText::next_u64() {  // splitmix64
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static std::string utf8_char_at(std::string_view s, size_t char_index) {
  size_t i = 0, k = 0;
  while (i < s.size()) {
    size_t len = 1;
    const auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0xF0)
      len = 4;
    else if (c >= 0xE0)
      len = 3;
    else if (c >= 0xC0)
      len = 2;
    if (k == char_index) return std::string(s.substr(i, len));
    i += len;
    ++k;
  }
  return "";
}
static size_t utf8_count(std::string_view s) {
  size_t k = 0;
  for (unsigned char c : s) k += (c & 0xC0) != 0x80;
  return k;
}

std::string SyntheticText::english(int n) {
  std::string s;
  bool cap = true;
  while (static_cast<int>(s.size()) < n) {
    std::string w(kEnglishWords[below(kEnglishWords.size())]);
    if (cap && !w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 32);
    cap = false;
    if (!s.empty()) s += ' ';
    if (below(12) == 0) w = std::string(below(2) ? "THE" : "McDonald's");
    s += w;
    if (below(6) == 0) {
      std::string_view p = kEnglishPunct[below(kEnglishPunct.size())];
      s += p;
      cap = (p == "." || p == "!" || p == "?");
    }
  }
  return s;
}

std::string SyntheticText::chinese(int n) {
  std::string s;
  const size_t np = utf8_count(kCjkPunct);
  for (int i = 0; i < n; ++i) {
    if (below(8) == 0) {
      s += utf8_char_at(kCjkPunct, below(np));
    } else if (below(30) == 0) {
      s += below(2) ? " AI " : "2024年";
    } else {
      // Mostly common CJK (U+4E00..U+9FA5, the pre-tokenizer's range); sometimes beyond it.
      uint32_t cp = below(40) == 0 ? 0x9FA6 + static_cast<uint32_t>(below(0x9FEF - 0x9FA6))
                                   : 0x4E00 + static_cast<uint32_t>(below(0x9FA5 - 0x4E00 + 1));
      utf8_append(cp, &s);
    }
  }
  return s;
}

std::string SyntheticText::japanese(int n) {
  std::string s;
  const size_t np = utf8_count(kJaPunct);
  for (int i = 0; i < n; ++i) {
    const uint64_t r = below(10);
    if (r < 4)
      utf8_append(0x3041 + static_cast<uint32_t>(below(0x3096 - 0x3041 + 1)), &s);  // hiragana
    else if (r < 7)
      utf8_append(0x30A1 + static_cast<uint32_t>(below(0x30FA - 0x30A1 + 1)), &s);  // katakana
    else if (r < 9)
      utf8_append(0x4E00 + static_cast<uint32_t>(below(0x5000)), &s);  // kanji
    else
      s += utf8_char_at(kJaPunct, below(np));
  }
  if (below(3) == 0) s += "ｶﾀｶﾅ１２３";  // half-width katakana, full-width digits
  return s;
}

std::string SyntheticText::korean(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0 && below(4) == 0) s += below(6) == 0 ? ". " : " ";
    utf8_append(0xAC00 + static_cast<uint32_t>(below(0xD7A3 - 0xAC00 + 1)), &s);
  }
  if (below(4) == 0) s += "ㄱㄴㄷ ㅋㅋㅋ";
  return s;
}

std::string SyntheticText::code(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) {
    std::string_view c = kCodeSnippets[below(kCodeSnippets.size())];
    if (below(3) == 0) s += std::string(below(4) * 4, ' ');
    s += c;
  }
  return s;
}

std::string SyntheticText::digits(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) {
    const uint64_t r = below(8);
    const int len = 1 + static_cast<int>(below(r == 0 ? 60 : 12));
    if (r == 1)
      s += "３．１４１５９";  // full-width
    else if (r == 2)
      s += "x² + y³ = ½ ⅔ Ⅻ ①②";  // other numerics
    else if (r == 3)
      s += "٠١٢٣٤٥٦٧٨٩ ०१२३";  // Arabic-Indic, Devanagari
    else {
      for (int i = 0; i < len; ++i) s += static_cast<char>('0' + below(10));
    }
    static constexpr std::array<std::string_view, 9> kSep = {" ", ",", ".", "-", "/", ":", "e", "%", "\n"};
    s += kSep[below(kSep.size())];
  }
  return s;
}

std::string SyntheticText::emoji(int n) {
  std::string s;
  while (static_cast<int>(utf8_count(s)) < n) {
    s += kEmoji[below(kEmoji.size())];
    if (below(3) == 0) s += below(2) ? " " : "ok";
  }
  return s;
}

std::string SyntheticText::whitespace(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) {
    s += kWhitespace[below(kWhitespace.size())];
    if (below(2) == 0) s += std::string(below(9), ' ');
    if (below(2) == 0) s += below(2) ? "word" : "字";
    if (below(5) == 0) s += ".";
  }
  return s;
}

std::string SyntheticText::punctuation(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) {
    s += kPunctClusters[below(kPunctClusters.size())];
    const uint64_t r = below(5);
    if (r == 0)
      s += " ";
    else if (r == 1)
      s += "abc";
    else if (r == 2)
      s += "\n";
  }
  return s;
}

std::string SyntheticText::other_scripts(int n) {
  std::string s;
  while (static_cast<int>(s.size()) < n) {
    if (!s.empty()) s += below(3) ? " " : ", ";
    s += kOtherScripts[below(kOtherScripts.size())];
  }
  return s;
}

std::string SyntheticText::make(TextKind kind, int n) {
  switch (kind) {
    case TextKind::kEnglish: return english(n);
    case TextKind::kChinese: return chinese(n);
    case TextKind::kJapanese: return japanese(n);
    case TextKind::kKorean: return korean(n);
    case TextKind::kCode: return code(n);
    case TextKind::kDigits: return digits(n);
    case TextKind::kEmoji: return emoji(n);
    case TextKind::kWhitespace: return whitespace(n);
    case TextKind::kPunctuation: return punctuation(n);
    case TextKind::kOtherScripts: return other_scripts(n);
    default: {
      std::string s;
      const int parts = 2 + static_cast<int>(below(4));
      for (int i = 0; i < parts; ++i) {
        s += make(static_cast<TextKind>(below(static_cast<uint64_t>(TextKind::kMixed))), n / parts + 1);
        if (below(2) == 0) s += kWhitespace[below(kWhitespace.size())];
      }
      return s;
    }
  }
}

std::string SyntheticText::corpus_line() {
  // Weighted like a multilingual chat corpus: mostly English and code, then CJK, then the rest.
  static constexpr TextKind kWeights[] = {
      TextKind::kEnglish,     TextKind::kEnglish,      TextKind::kEnglish, TextKind::kCode,
      TextKind::kCode,        TextKind::kChinese,      TextKind::kChinese, TextKind::kJapanese,
      TextKind::kKorean,      TextKind::kDigits,       TextKind::kEmoji,   TextKind::kWhitespace,
      TextKind::kPunctuation, TextKind::kOtherScripts, TextKind::kMixed};
  TextKind k = kWeights[below(sizeof(kWeights) / sizeof(kWeights[0]))];
  std::string s = make(k, 40 + static_cast<int>(below(400)));
  for (char& c : s)
    if (c == '\n') c = ' ';  // one corpus line = one string
  return s;
}

std::string make_synthetic_corpus(uint64_t seed, size_t min_bytes) {
  SyntheticText g(seed);
  std::string out;
  out.reserve(min_bytes + 4096);
  while (out.size() < min_bytes) {
    out += g.corpus_line();
    out += '\n';
  }
  return out;
}

}  // namespace ds41::text
