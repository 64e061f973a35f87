// ds41 text: UTF-8 primitives (see utf8.h for the invalid-input rule).
#include "text/utf8.h"

namespace ds41::text {

Utf8Step utf8_step(const uint8_t* p, size_t n) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {1, b0};
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7)
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {-1, 0};  // 80..C1, F5..FF never start a sequence
  }
  for (int i = 1; i <= need; ++i) {
    if (static_cast<size_t>(i) >= n) return {0, 0};  // valid so far, incomplete
    const uint8_t b = p[i];
    const uint8_t l = (i == 1) ? lo : 0x80, h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) return {-i, 0};  // maximal subpart = the i bytes before b
    cp = (cp << 6) | (b & 0x3F);
  }
  return {need + 1, cp};
}

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = utf8_step(p + i, n - i);
    if (st.len <= 0) return false;
    i += st.len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    Utf8Step st = utf8_step(p + i, n - i);
    if (st.len > 0) {
      out.append(s.data() + i, st.len);
      i += st.len;
    } else if (st.len == 0) {  // truncated at the end of input: one maximal subpart
      out += kReplacementUtf8;
      i = n;
    } else {
      out += kReplacementUtf8;
      i += static_cast<size_t>(-st.len);
    }
  }
  return out;
}

void utf8_append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last <= 3 bytes can form an incomplete sequence; scan back to its lead byte.
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  const size_t start = n > 3 ? n - 3 : 0;
  for (size_t i = n; i > start;) {
    --i;
    if ((p[i] & 0xC0) != 0x80) {  // a lead byte (or ASCII / invalid lead)
      Utf8Step st = utf8_step(p + i, n - i);
      return st.len == 0 ? i : n;
    }
  }
  return n;
}

}  // namespace ds41::text
