// ds41 engram tests: shared helpers — fixture paths and JSON loading, a small SHA-256 (FIPS
// 180-4) for map checksums, a minimal safetensors reader for the goldens (the real loader lives
// in src/model/loader; these tests deliberately do not depend on it), and a cached compressed
// map of the V4.1 tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engram/compressed_vocab.h"

namespace ds41::engram::testing {

inline std::string shared_path(const std::string& rel) { return std::string(DS41_SHARED_DIR) + "/" + rel; }
inline std::string fixture_path(const std::string& name) {
  return std::string(DS41_SOURCE_DIR) + "/tests/unit/engram/fixtures/" + name;
}
inline std::string tokenizer_path() { return shared_path("tokenizer-v41/tokenizer.json"); }

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline nlohmann::json load_json(const std::string& path) {
  const std::string text = read_file(path);
  EXPECT_FALSE(text.empty()) << "cannot read " << path;
  return nlohmann::json::parse(text);
}

// SHA-256 of a byte buffer, lower-case hex.
inline std::string sha256_hex(const void* data, size_t len) {
  static constexpr uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  // Message plus padding: 0x80, zeros, 64-bit big-endian bit length, to a multiple of 64 bytes.
  std::vector<uint8_t> m(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
  m.push_back(0x80);
  while (m.size() % 64 != 56) m.push_back(0);
  const uint64_t bits = static_cast<uint64_t>(len) * 8;
  for (int i = 7; i >= 0; --i) m.push_back(static_cast<uint8_t>(bits >> (8 * i)));
  for (size_t blk = 0; blk < m.size(); blk += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const uint8_t* p = &m[blk + 4 * static_cast<size_t>(i)];
      w[i] = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
  return std::string(out, 64);
}

// Little-endian int32 bytes of a vector (the layout NumPy's astype("<i4").tobytes() gives).
inline std::string int32_le_bytes(const int32_t* v, size_t n) {
  std::string b(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    const auto u = static_cast<uint32_t>(v[i]);
    for (int k = 0; k < 4; ++k) b[4 * i + static_cast<size_t>(k)] = static_cast<char>(u >> (8 * k));
  }
  return b;
}

// Minimal safetensors reader: 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}}, then the data (offsets relative to it).
struct MiniSafetensors {
  std::string bytes;
  nlohmann::json header;
  size_t data_start = 0;

  bool open(const std::string& path) {
    bytes = read_file(path);
    if (bytes.size() < 8) return false;
    uint64_t n = 0;
    for (int k = 0; k < 8; ++k)
      n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[static_cast<size_t>(k)])) << (8 * k);
    if (8 + n > bytes.size()) return false;
    header = nlohmann::json::parse(bytes.substr(8, n));
    data_start = 8 + n;
    return true;
  }
  // int32 tensor as a flat vector plus its shape; fails the test on any mismatch.
  std::vector<int32_t> i32(const std::string& name, std::vector<int64_t>* shape = nullptr) const {
    std::vector<int32_t> out;
    if (!header.contains(name)) {
      ADD_FAILURE() << "tensor " << name << " not in safetensors header";
      return out;
    }
    const auto& e = header[name];
    EXPECT_EQ(e["dtype"], "I32") << name;
    const size_t b = e["data_offsets"][0].get<size_t>(), en = e["data_offsets"][1].get<size_t>();
    size_t count = 1;
    if (shape) shape->clear();
    for (const auto& d : e["shape"]) {
      count *= d.get<size_t>();
      if (shape) shape->push_back(d.get<int64_t>());
    }
    EXPECT_EQ(en - b, count * 4) << name;
    EXPECT_LE(data_start + en, bytes.size()) << name;
    if (en - b != count * 4 || data_start + en > bytes.size()) return out;
    out.resize(count);
    std::memcpy(out.data(), bytes.data() + data_start + b, count * 4);  // data may be unaligned
    return out;
  }
};

// The V4.1 compressed map, built once per test process.
inline const CompressedVocab& v41_compressed_vocab() {
  static const CompressedVocab cv = [] {
    auto r = load_compressed_vocab(tokenizer_path(), 99092);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? std::move(r).value() : CompressedVocab{};
  }();
  return cv;
}

}  // namespace ds41::engram::testing
