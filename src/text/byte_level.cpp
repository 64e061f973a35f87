// ds41 text: GPT-2 byte-level alphabet tables (see byte_level.h).
#include "text/byte_level.h"

#include "text/utf8.h"

namespace ds41::text {

const ByteLevel& ByteLevel::instance() {
  static const ByteLevel kInstance;
  return kInstance;
}

ByteLevel::ByteLevel() {
  // Printable Latin-1 bytes map to themselves ('!'..'~', '¡'..'¬', '®'..'ÿ'); the other 68
  // bytes take 256, 257, ... in increasing byte order.
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  uint32_t next = 256;
  cp_to_byte_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
    byte_to_cp_[b] = cp;
    cp_to_byte_[cp] = static_cast<int16_t>(b);
    std::string u;
    utf8_append(cp, &u);
    byte_utf8_len_[b] = static_cast<uint8_t>(u.size());
    for (size_t i = 0; i < u.size(); ++i) byte_utf8_[b][i] = u[i];
  }
}

std::string ByteLevel::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out.append(byte_to_utf8(b));
  return out;
}

std::optional<std::string> ByteLevel::decode(std::string_view s) const {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    Utf8Step st = utf8_step(p + i, s.size() - i);
    if (st.len <= 0) return std::nullopt;
    auto b = cp_to_byte(st.cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += st.len;
  }
  return out;
}

}  // namespace ds41::text
