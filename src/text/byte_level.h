// ds41 text: the GPT-2 byte-level alphabet used by the DeepSeek BPE (MODEL_SPEC 6.1): every
// byte 0..255 is shown as one printable code point (e.g. space -> U+0120 'Ġ'). Owns the
// byte <-> code point tables and the conversions between raw bytes and vocabulary strings.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds41::text {

class ByteLevel {
 public:
  // The process-wide immutable tables.
  static const ByteLevel& instance();

  // Code point that represents byte b.
  uint32_t byte_to_cp(uint8_t b) const { return byte_to_cp_[b]; }
  // UTF-8 of the code point that represents byte b.
  std::string_view byte_to_utf8(uint8_t b) const { return {byte_utf8_[b].data(), byte_utf8_len_[b]}; }
  // Byte represented by code point cp, or nullopt when cp is not in the alphabet.
  std::optional<uint8_t> cp_to_byte(uint32_t cp) const {
    if (cp >= cp_to_byte_.size() || cp_to_byte_[cp] < 0) return std::nullopt;
    return static_cast<uint8_t>(cp_to_byte_[cp]);
  }

  // Raw bytes -> byte-level string (each byte becomes its code point, UTF-8 encoded).
  std::string encode(std::string_view bytes) const;
  // Byte-level string -> raw bytes. Returns nullopt when the string is not valid UTF-8 or has a
  // code point outside the alphabet (HF's ByteLevel decoder then keeps the string's own bytes).
  std::optional<std::string> decode(std::string_view s) const;

 private:
  ByteLevel();
  std::array<uint32_t, 256> byte_to_cp_{};
  std::array<std::array<char, 2>, 256> byte_utf8_{};
  std::array<uint8_t, 256> byte_utf8_len_{};
  std::array<int16_t, 324> cp_to_byte_{};  // alphabet code points are all < 324
};

}  // namespace ds41::text
