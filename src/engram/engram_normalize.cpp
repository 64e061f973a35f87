// ds41 engram: the MODEL_SPEC 3.2.1 normalisation, on top of utf8proc (UTF-8 repair and
// encoding from text/utf8.h).
#include "engram/engram_normalize.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "text/utf8.h"

namespace ds41::engram {

bool contains_replacement_char(std::string_view utf8) {
  return utf8.find("\xEF\xBF\xBD") != std::string_view::npos;
}

bool is_unicode_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

void append_lower(char32_t cp, std::u32string& out) {
  // Python's str.lower uses the full lowercase mapping. The only unconditional multi-character
  // lowercase mapping in SpecialCasing.txt is U+0130 -> "i" + U+0307; Final_Sigma cannot apply
  // to a single character. Everything else is the simple mapping (checked over every code point
  // against Python in tests/unit/engram).
  if (cp == 0x130) {
    out.push_back(0x69);
    out.push_back(0x307);
    return;
  }
  out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
}

std::string engram_normalize(std::string_view input) {
  std::string valid_storage;
  std::string_view text = input;
  bool ascii = true;
  for (char ch : input) ascii = ascii && static_cast<uint8_t>(ch) < 0x80;
  if (!ascii) {
    if (!text::utf8_is_valid(input)) {
      valid_storage = text::utf8_sanitize(input);
      text = valid_storage;
    }
  }

  // Steps 1-4 (NFKC, NFD, drop marks, lower) produce code points in `cps`.
  std::u32string cps;
  cps.reserve(text.size() + 4);
  if (ascii) {
    // NFKC/NFD are the identity on ASCII, which has no marks; Python lowers only A-Z.
    for (char ch : text) cps.push_back(static_cast<char32_t>(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch));
  } else {
    utf8proc_uint8_t* nfkc = nullptr;
    const utf8proc_ssize_t nfkc_len = utf8proc_map(
        reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
        &nfkc, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
    DS41_CHECK(nfkc_len >= 0, "utf8proc NFKC failed on valid UTF-8");
    std::u32string nfd(static_cast<size_t>(nfkc_len) * 4 + 8, U'\0');
    utf8proc_ssize_t nfd_len = 0;
    for (;;) {  // NFD of the NFKC text (grows the buffer if utf8proc asks for more)
      nfd_len = utf8proc_decompose(nfkc, nfkc_len, reinterpret_cast<utf8proc_int32_t*>(nfd.data()),
                                   static_cast<utf8proc_ssize_t>(nfd.size()),
                                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
      DS41_CHECK(nfd_len >= 0, "utf8proc NFD failed on valid UTF-8");
      if (static_cast<size_t>(nfd_len) <= nfd.size()) break;
      nfd.resize(static_cast<size_t>(nfd_len));
    }
    std::free(nfkc);
    for (utf8proc_ssize_t k = 0; k < nfd_len; ++k) {
      const char32_t c = nfd[static_cast<size_t>(k)];
      const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
      append_lower(c, cps);
    }
  }

  // Step 5: collapse runs of the four ASCII characters [ \t\r\n] into one space.
  std::u32string t;
  t.reserve(cps.size());
  bool in_run = false;
  for (char32_t c : cps) {
    const bool ws = c == U' ' || c == U'\t' || c == U'\r' || c == U'\n';
    if (ws) {
      if (!in_run) t.push_back(U' ');
      in_run = true;
    } else {
      t.push_back(c);
      in_run = false;
    }
  }

  // Step 6: a text that is exactly one space stays; otherwise strip Unicode White_Space.
  if (t.size() == 1 && t[0] == U' ') return std::string(1, ' ');
  std::string out;
  size_t b = 0, e = t.size();
  while (b < e && is_unicode_white_space(t[b])) ++b;
  while (e > b && is_unicode_white_space(t[e - 1])) --e;
  out.reserve(e - b);
  for (size_t k = b; k < e; ++k) text::utf8_append(static_cast<uint32_t>(t[k]), &out);
  return out;
}

}  // namespace ds41::engram
