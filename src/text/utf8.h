// ds41 text: UTF-8 primitives shared by the tokenizer, the incremental decoder and the chat
// encoder. Owns the one definition of "invalid UTF-8" used in ds41: the Unicode "maximal
// subpart" rule (Unicode 15, section 3.9, Table 3-7), which is also what Rust's
// String::from_utf8_lossy (HF tokenizers' decoder) and WHATWG's TextDecoder implement. Every
// maximal invalid subpart becomes exactly one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds41::text {

inline constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";  // U+FFFD

// Result of looking at the bytes starting at p (n > 0 bytes available).
//   len > 0 : a complete well-formed sequence of `len` bytes encoding `cp`.
//   len == 0: a well-formed but incomplete prefix that uses all n bytes (more bytes may
//             complete it); `invalid_len` = n.
//   len < 0 : ill-formed; the maximal subpart is -len bytes (>= 1) and becomes one U+FFFD.
struct Utf8Step {
  int len;
  uint32_t cp;
};
Utf8Step utf8_step(const uint8_t* p, size_t n);

// True when `s` is entirely well-formed UTF-8.
bool utf8_is_valid(std::string_view s);

// Replaces every maximal ill-formed subpart (including a truncated sequence at the end) by
// U+FFFD. Returns `s` unchanged (copied) when it is valid.
std::string utf8_sanitize(std::string_view s);

// Appends the UTF-8 encoding of cp (cp <= 0x10FFFF, not a surrogate) to out.
void utf8_append(uint32_t cp, std::string* out);

// Length of the longest prefix of `s` that ends on a character boundary assuming the tail may
// still be completed by more bytes: a trailing well-formed but incomplete sequence is
// excluded; ill-formed bytes count as complete (they will be replaced).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace ds41::text
