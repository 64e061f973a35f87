// ds41 engram: the text side of Engram token compression (MODEL_SPEC 3.2.1):
// engram_normalize: NFKC, NFD, drop general category M*, per-character lower-casing, collapse
// runs of [ \t\r\n] to one space, then strip Unicode White_Space unless the text is exactly " ".
// The ByteLevel alphabet (text/byte_level.h) and UTF-8 repair (text/utf8.h: each maximal
// subpart of an ill-formed sequence becomes one U+FFFD, as Python's bytes.decode("utf-8",
// "replace")) are src/text's, shared with the tokenizer.
// The executable spec is shared/golden/tools/make_goldens.py (engram_normalize,
// _byte_level_alphabet); the unit tests compare against its output.
#pragma once

#include <string>
#include <string_view>

namespace ds41::engram {

// True iff the UTF-8 text contains U+FFFD.
bool contains_replacement_char(std::string_view utf8);

// Unicode White_Space (the set make_goldens.py lists as _UNICODE_WHITE_SPACE).
bool is_unicode_white_space(char32_t cp);

// Python str.lower() of the single character cp, appended to out (U+0130 gives two code points).
void append_lower(char32_t cp, std::u32string& out);

// MODEL_SPEC 3.2.1 normalisation of a UTF-8 text (invalid input bytes are first replaced as by
// text::utf8_sanitize). May return an empty string; the caller applies the "empty -> original
// text" fallback.
std::string engram_normalize(std::string_view utf8_text);

}  // namespace ds41::engram
