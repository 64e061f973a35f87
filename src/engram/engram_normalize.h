// ds41 engram: the text side of Engram token compression (MODEL_SPEC 3.2.1):
//  - the ByteLevel byte <-> character map (GPT-2 "bytes_to_unicode") used to turn a vocabulary
//    string back into bytes,
//  - UTF-8 decoding with replacement that matches Python's bytes.decode("utf-8", "replace")
//    (each maximal subpart of an ill-formed sequence becomes one U+FFFD),
//  - engram_normalize: NFKC, NFD, drop general category M*, per-character lower-casing, collapse
//    runs of [ \t\r\n] to one space, then strip Unicode White_Space unless the text is exactly " ".
// The executable spec is shared/golden/tools/make_goldens.py (engram_normalize,
// _byte_level_alphabet); the unit tests compare against its output.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace ds41::engram {

// Character (code point) that the ByteLevel pre-tokenizer uses for byte b.
char32_t byte_level_char(uint8_t b);
// Inverse: the byte a ByteLevel character stands for, or -1 if cp is not in the alphabet.
int byte_level_byte(char32_t cp);

struct Utf8Decoded {
  std::string text;       // valid UTF-8; every ill-formed maximal subpart replaced by U+FFFD
  bool replaced = false;  // true iff at least one replacement was made
};
// Python-compatible bytes.decode("utf-8", errors="replace") (surrogates, overlongs and
// code points above U+10FFFF are ill-formed, as in Python).
Utf8Decoded decode_utf8_replace(std::string_view bytes);

// True iff the UTF-8 text contains U+FFFD.
bool contains_replacement_char(std::string_view utf8);

// Unicode White_Space (the set make_goldens.py lists as _UNICODE_WHITE_SPACE).
bool is_unicode_white_space(char32_t cp);

// Python str.lower() of the single character cp, appended to out (U+0130 gives two code points).
void append_lower(char32_t cp, std::u32string& out);

// MODEL_SPEC 3.2.1 normalisation of a UTF-8 text (invalid input bytes are first replaced as in
// decode_utf8_replace). May return an empty string; the caller applies the "empty -> original
// text" fallback.
std::string engram_normalize(std::string_view utf8_text);

// UTF-8 encoding of a code point sequence (code points must be valid scalar values).
void append_utf8(char32_t cp, std::string& out);

}  // namespace ds41::engram
