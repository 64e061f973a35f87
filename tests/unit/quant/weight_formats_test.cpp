// Tests of the checkpoint weight formats (MODEL_SPEC 2.1): FP8 32x32 tiles, FP4 expert rows
// (nibble order, per-row-per-32 scales), Engram rows. Values already on a grid must survive
// quantize -> dequantize bit for bit; dequantization is checked against a double-precision formula.
#include "quant/weight_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/e8m0.h"
#include "support/float_bits.h"

namespace ds41::quant {
namespace {

using ds41::testing::bits;

uint8_t random_finite_e4m3(std::mt19937& rng) {
  for (;;) {
    uint8_t b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) != 0x7f) return b;
  }
}

// Double-precision reference: code value * 2^(scale - 127).
double e4m3_times_scale(uint8_t q, uint8_t s) {
  return static_cast<double>(e4m3_to_float(q)) * std::ldexp(1.0, s - 127);
}

TEST(Fp8Tiles, DequantMatchesFormulaOnRaggedShape) {
  const int64_t out = 70, in = 100;  // neither a multiple of 32: partial tiles on both edges
  const int64_t to = ceil_div(out, 32), ti = ceil_div(in, 32);
  std::mt19937 rng(1);
  std::vector<uint8_t> w(out * in), s(to * ti);
  for (auto& b : w) b = random_finite_e4m3(rng);
  for (auto& b : s) b = static_cast<uint8_t>(100 + rng() % 50);
  std::vector<float> got(out * in);
  fp8_tiles_dequant_rows(w.data(), s.data(), out, in, 0, out, got.data());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      ASSERT_EQ(static_cast<double>(got[o * in + i]),
                e4m3_times_scale(w[o * in + i], s[(o / 32) * ti + i / 32]))
          << o << "," << i;
  // A row range equals the same rows of the full result.
  std::vector<float> part(9 * in);
  fp8_tiles_dequant_rows(w.data(), s.data(), out, in, 31, 40, part.data());
  EXPECT_EQ(std::memcmp(part.data(), got.data() + 31 * in, part.size() * 4), 0);
}

TEST(Fp8Tiles, OnGridValuesRoundTripExactly) {
  const int64_t out = 70, in = 100, to = 3, ti = 4;
  std::mt19937 rng(2);
  // Each tile: random codes under a random power-of-two scale; even tiles hold a +-448 code so
  // their scale is determined exactly; tile (1,1) is all zero (+-0).
  std::vector<float> wf(out * in);
  std::vector<int> tile_k(to * ti);
  for (auto& k : tile_k) k = static_cast<int>(rng() % 60) - 40;
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      int64_t t = (o / 32) * ti + i / 32;
      uint8_t q = random_finite_e4m3(rng);
      if (t == 1 * ti + 1) q = (rng() & 1) ? 0x80 : 0x00;
      wf[o * in + i] = std::ldexp(e4m3_to_float(q), tile_k[t]);
    }
  for (int64_t t = 0; t < to * ti; t += 2) {
    int64_t o = (t / ti) * 32, i = (t % ti) * 32;
    wf[o * in + i] = std::ldexp(-448.0f, tile_k[t]);
  }
  std::vector<uint8_t> q(out * in), s(to * ti);
  fp8_tiles_quantize(wf.data(), out, in, q.data(), s.data());
  for (int64_t t = 0; t < to * ti; t += 2) EXPECT_EQ(s[t], tile_k[t] + 127) << "tile " << t;
  EXPECT_EQ(s[1 * ti + 1], 0) << "all-zero tile gets the smallest scale";
  std::vector<float> back(out * in);
  fp8_tiles_dequant_rows(q.data(), s.data(), out, in, 0, out, back.data());
  for (int64_t j = 0; j < out * in; ++j) ASSERT_EQ(bits(back[j]), bits(wf[j])) << j;
}

TEST(Fp8Tiles, QuantizeIsNearestUnderTheTileScale) {
  const int64_t out = 64, in = 64;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> wf(out * in);
  for (auto& v : wf) v = nd(rng);
  std::vector<uint8_t> q(out * in), s(4);
  fp8_tiles_quantize(wf.data(), out, in, q.data(), s.data());
  for (int t = 0; t < 4; ++t) {
    int64_t r0 = (t / 2) * 32, c0 = (t % 2) * 32;
    double amax = 0;
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c)
        amax = std::max(amax, std::fabs(static_cast<double>(wf[(r0 + r) * in + c0 + c])));
    int k = static_cast<int>(std::ceil(std::log2(amax / 448.0)));
    ASSERT_EQ(s[t], k + 127);
    for (int r = 0; r < 32; ++r)
      for (int c = 0; c < 32; ++c) {
        int64_t j = (r0 + r) * in + c0 + c;
        double x = wf[j] / std::ldexp(1.0, k), got = e4m3_to_float(q[j]);
        // Nearest: no finite code is strictly closer.
        for (int b = 0; b < 256; ++b) {
          if ((b & 0x7f) == 0x7f) continue;
          ASSERT_LE(std::fabs(got - x), std::fabs(e4m3_to_float(static_cast<uint8_t>(b)) - x)) << j;
        }
      }
  }
}

TEST(Fp4Rows, NibbleOrderAndPerRowScales) {
  // Row 0: bytes 0x21, 0xf8, then zeros; scale 2^0. Row 1: same bytes, scale 2^-3 in block 0,
  // 2^4 in block 1.
  const int64_t out = 2, in = 64;
  std::vector<uint8_t> packed(out * in / 2, 0), scale = {127, 127, 124, 131};
  packed[0] = 0x21;
  packed[1] = 0xf8;
  packed[32] = 0x21;
  packed[32 + 16] = 0x07;  // row 1, element 32 (first of block 1) = code 7 = 6
  std::vector<float> w(out * in);
  fp4_rows_dequant_rows(packed.data(), scale.data(), out, in, 0, out, w.data());
  EXPECT_EQ(w[0], 0.5f);               // low nibble = element 0
  EXPECT_EQ(w[1], 1.0f);               // high nibble = element 1
  EXPECT_EQ(bits(w[2]), bits(-0.0f));  // code 8
  EXPECT_EQ(w[3], -6.0f);              // code 15
  EXPECT_EQ(w[64 + 0], 0.5f / 8);
  EXPECT_EQ(w[64 + 1], 1.0f / 8);
  EXPECT_EQ(w[64 + 32], 6.0f * 16);
  EXPECT_EQ(w[64 + 33], 0.0f);
}

TEST(Fp4Rows, DequantMatchesFormulaAndOnGridRoundTrips) {
  const int64_t out = 9, in = 160;
  std::mt19937 rng(4);
  std::vector<uint8_t> packed(out * in / 2), scale(out * in / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  for (auto& b : scale) b = static_cast<uint8_t>(90 + rng() % 70);
  std::vector<float> w(out * in);
  fp4_rows_dequant_rows(packed.data(), scale.data(), out, in, 0, out, w.data());
  const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      uint8_t byte = packed[o * in / 2 + i / 2];
      int code = (i % 2) ? byte >> 4 : byte & 15;
      double want = (code & 8 ? -1 : 1) * mag[code & 7] * std::ldexp(1.0, scale[o * in / 32 + i / 32] - 127);
      ASSERT_EQ(static_cast<double>(w[o * in + i]), want) << o << "," << i;
      if (want == 0) {
        ASSERT_EQ(std::signbit(w[o * in + i]), (code & 8) != 0);
      }
    }
  std::vector<uint8_t> p2(packed.size()), s2(scale.size());
  fp4_rows_quantize(w.data(), out, in, p2.data(), s2.data());
  std::vector<float> back(w.size());
  fp4_rows_dequant_rows(p2.data(), s2.data(), out, in, 0, out, back.data());
  for (size_t j = 0; j < w.size(); ++j) ASSERT_EQ(bits(back[j]), bits(w[j])) << j;
  // Rows subset.
  std::vector<float> part(2 * in);
  fp4_rows_dequant_rows(packed.data(), scale.data(), out, in, 4, 6, part.data());
  EXPECT_EQ(std::memcmp(part.data(), w.data() + 4 * in, part.size() * 4), 0);
}

TEST(Fp4Rows, QuantizeScaleIsCeilLog2OfAmaxOver6) {
  std::vector<float> w(32, 0.0f);
  w[5] = 6.0f * 0x1p-7f;    // amax/6 = 2^-7 exactly -> k = -7
  w[6] = -0.75f * 0x1p-7f;  // /2^-7 = -0.75 -> tie -> -1 (even code 2)
  w[7] = 0.25f * 0x1p-7f;   // tie -> 0
  std::vector<uint8_t> p(16), s(1);
  fp4_rows_quantize(w.data(), 1, 32, p.data(), s.data());
  EXPECT_EQ(s[0], 120);
  EXPECT_EQ(e2m1_unpack_at(p.data(), 5), 7);
  EXPECT_EQ(e2m1_unpack_at(p.data(), 6), 8 | 2);
  EXPECT_EQ(e2m1_unpack_at(p.data(), 7), 0);
  std::vector<float> z(32, 0.0f);
  fp4_rows_quantize(z.data(), 1, 32, p.data(), s.data());
  EXPECT_EQ(s[0], 0);
}

TEST(EngramRows, DequantAndOnGridRoundTrip) {
  const int64_t rows = 5, dim = 256;
  std::mt19937 rng(5);
  std::vector<uint8_t> q(rows * dim), s(rows * dim / 32);
  for (auto& b : q) b = random_finite_e4m3(rng);
  for (auto& b : s) b = static_cast<uint8_t>(100 + rng() % 40);
  std::vector<float> w(rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    engram_row_dequant(q.data() + r * dim, s.data() + r * 8, dim, w.data() + r * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c)
      ASSERT_EQ(static_cast<double>(w[r * dim + c]), e4m3_times_scale(q[r * dim + c], s[r * 8 + c / 32]));
  std::vector<uint8_t> q2(q.size()), s2(s.size());
  engram_rows_quantize(w.data(), rows, dim, q2.data(), s2.data());
  std::vector<float> back(w.size());
  for (int64_t r = 0; r < rows; ++r)
    engram_row_dequant(q2.data() + r * dim, s2.data() + r * 8, dim, back.data() + r * dim);
  for (size_t j = 0; j < w.size(); ++j) ASSERT_EQ(bits(back[j]), bits(w[j])) << j;
}

TEST(WeightFormats, CeilLog2Clamped) {
  EXPECT_EQ(ceil_log2_clamped(1.0), 0);
  EXPECT_EQ(ceil_log2_clamped(1.0000001), 1);
  EXPECT_EQ(ceil_log2_clamped(0.5), -1);
  EXPECT_EQ(ceil_log2_clamped(0.3), -1);
  EXPECT_EQ(ceil_log2_clamped(1e-60), -127);
  EXPECT_EQ(ceil_log2_clamped(1e60), 127);
}

}  // namespace
}  // namespace ds41::quant
