// Tests of the scalar formats (MODEL_SPEC 2.1, 3.9): every E4M3 / E8M0 byte and E2M1 code decoded
// against formulas written independently here, round-to-nearest-even at every midpoint, extremes,
// NaN/inf and negative zero, and pow2ceil.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/e8m0.h"
#include "support/float_bits.h"

namespace ds41::quant {
namespace {

using ds41::testing::bits;
bool same_bits(float a, float b) { return bits(a) == bits(b); }

// Independent E4M3 decode: value = (-1)^s * 2^(E-7) * (1 + M/8) for E > 0, 2^-6 * M/8 for E = 0,
// computed in double from the bit fields with pow(); (E, M) = (15, 7) is NaN.
double e4m3_formula(int b) {
  int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double mag = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1.0 + m / 8.0);
  return s ? -mag : mag;
}

TEST(E4M3, EveryByteDecodes) {
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    double want = e4m3_formula(b);
    float got = e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "byte " << b;
      ++nans;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << "byte " << b;
    EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << "byte " << b;
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff only: the FN variant has no infinities
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);      // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);  // largest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);      // smallest normal
  EXPECT_TRUE(same_bits(e4m3_to_float(0x80), -0.0f));
}

TEST(E4M3, EveryFiniteByteRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(static_cast<uint8_t>(b))), b) << "byte " << b;
  }
}

// Every midpoint between consecutive non-negative representable values (subnormals, the
// subnormal/normal boundary 7*2^-9 | 2^-6 and every binade) goes to the even code; one float
// ulp either side goes to the nearer neighbour. Mirrored for negative values.
TEST(E4M3, RoundsHalfToEvenAtEveryMidpoint) {
  int checked = 0;
  for (int c = 0; c < 0x7e; ++c) {
    float lo = e4m3_to_float(static_cast<uint8_t>(c)), hi = e4m3_to_float(static_cast<uint8_t>(c + 1));
    float mid = (lo + hi) / 2;  // exact: both have few mantissa bits
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
    int even = (c % 2 == 0) ? c : c + 1;
    for (int sgn : {0, 0x80}) {
      float m = sgn ? -mid : mid;
      EXPECT_EQ(e4m3_from_float(m), even | sgn) << "midpoint " << m;
      float toward_lo = std::nextafter(m, 0.0f), toward_hi = std::nextafter(m, sgn ? -INFINITY : INFINITY);
      EXPECT_EQ(e4m3_from_float(toward_lo), c | sgn) << toward_lo;
      EXPECT_EQ(e4m3_from_float(toward_hi), (c + 1) | sgn) << toward_hi;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 126);
  // The subnormal/normal boundary explicitly: midpoint of 7*2^-9 and 8*2^-9 = 2^-6 -> even code 8.
  EXPECT_EQ(e4m3_from_float(7.5f * 0x1p-9f), 0x08);
  // Below the smallest subnormal: 2^-10 is the tie between 0 and 2^-9 -> 0 (even).
  EXPECT_EQ(e4m3_from_float(0x1p-10f), 0x00);
  EXPECT_EQ(e4m3_from_float(std::nextafter(0x1p-10f, 1.0f)), 0x01);
}

TEST(E4M3, ExtremesNanInfAndSignedZero) {
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7e);
  EXPECT_EQ(e4m3_from_float(std::nextafter(448.0f, 1e9f)), 0x7e);  // saturates (documented)
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7e);  // the would-be tie with 480 (not representable)
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7e);
  EXPECT_EQ(e4m3_from_float(FLT_MAX), 0x7e);
  EXPECT_EQ(e4m3_from_float(-FLT_MAX), 0xfe);
  EXPECT_EQ(e4m3_from_float(INFINITY), 0x7e);
  EXPECT_EQ(e4m3_from_float(-INFINITY), 0xfe);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(e4m3_from_float(0.0f), 0x00);
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(FLT_TRUE_MIN), 0x00);
  EXPECT_EQ(e4m3_from_float(-FLT_TRUE_MIN), 0x80);  // underflow keeps the sign
  EXPECT_EQ(e4m3_from_float(-1e-20f), 0x80);
  EXPECT_EQ(e4m3_from_float(0x1p-126f), 0x00);
}

// Brute force over a dense sweep of floats: the encoder picks a nearest representable value
// (ties: even code), checked against a linear search over the decoded table.
TEST(E4M3, EncoderIsNearestOnDenseSweep) {
  std::vector<double> vals;
  for (int b = 0; b <= 0x7e; ++b) vals.push_back(e4m3_to_float(static_cast<uint8_t>(b)));
  for (uint32_t i = 0; i < (1u << 20); ++i) {
    uint32_t u = (0x2f000000u) + i * 0x1d3;  // 2^-33 .. beyond 448, varied mantissas
    float x;
    std::memcpy(&x, &u, 4);
    if (!(x < 448.0f)) break;
    uint8_t got = e4m3_from_float(x);
    double best = INFINITY;
    int best_c = -1;
    for (int c = 0; c <= 0x7e; ++c) {
      double d = std::fabs(vals[c] - x);
      if (d < best || (d == best && c % 2 == 0)) best = d, best_c = c;
    }
    ASSERT_EQ(got, best_c) << "x=" << x;
  }
}

TEST(E8M0, EveryByteDecodes) {
  for (int b = 0; b < 255; ++b) {
    // Independent: build the double from its exponent bits (bias 1023) — 2^(b-127).
    uint64_t u = static_cast<uint64_t>(b - 127 + 1023) << 52;
    double want;
    std::memcpy(&want, &u, 8);
    EXPECT_EQ(static_cast<double>(e8m0_to_float(static_cast<uint8_t>(b))), want) << "byte " << b;
    EXPECT_EQ(e8m0_exponent(static_cast<uint8_t>(b)), b - 127);
    EXPECT_EQ(e8m0_from_exponent(b - 127), b);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xff)));
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);  // a float subnormal, exact
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
}

TEST(E8M0, Pow2CeilFollowsTheBitDefinition) {
  EXPECT_EQ(pow2ceil_exponent(1.0f), 0);
  EXPECT_EQ(pow2ceil_exponent(std::nextafter(1.0f, 2.0f)), 1);
  EXPECT_EQ(pow2ceil_exponent(std::nextafter(1.0f, 0.0f)), 0);
  EXPECT_EQ(pow2ceil_exponent(0.75f), 0);
  EXPECT_EQ(pow2ceil_exponent(3.0f), 2);
  EXPECT_EQ(pow2ceil_exponent(0x1p-126f), -126);
  EXPECT_EQ(pow2ceil_exponent(0x1.000002p-126f), -125);
  EXPECT_EQ(pow2ceil_exponent(FLT_MAX), 128);
  EXPECT_EQ(pow2ceil(0.3f), 0.5f);
  for (int k = -126; k <= 127; ++k) {
    float p = std::ldexp(1.0f, k);
    EXPECT_EQ(pow2ceil_exponent(p), k);
    if (k < 127) {
      EXPECT_EQ(pow2ceil_exponent(std::nextafter(p, INFINITY)), k + 1);
    }
    if (k > -126) {
      EXPECT_EQ(pow2ceil_exponent(std::nextafter(p, 0.0f)), k);
    }
    // Agrees with 2^ceil(log2 t) computed in double.
    float t = p * 1.37f;
    EXPECT_EQ(pow2ceil_exponent(t), static_cast<int>(std::ceil(std::log2(static_cast<double>(t)))));
  }
}

TEST(E2M1, EveryCodeDecodes) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_TRUE(same_bits(e2m1_to_float(static_cast<uint8_t>(c)), want[c])) << "code " << c;
    EXPECT_EQ(e2m1_from_float(want[c]), c) << "code " << c;
    // Bits above the nibble are ignored by the decoder.
    EXPECT_TRUE(same_bits(e2m1_to_float(static_cast<uint8_t>(c | 0xf0)), want[c])) << "code " << c;
  }
}

TEST(E2M1, MidpointsRoundToEvenCode) {
  // MODEL_SPEC 3.9: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  struct Case {
    float x;
    float want;
  } cases[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}};
  for (auto [x, want] : cases) {
    EXPECT_EQ(e2m1_round(x), want) << x;
    EXPECT_TRUE(same_bits(e2m1_round(-x), -want)) << -x;
    float lo_want = e2m1_round(std::nextafter(x, 0.0f)), hi_want = e2m1_round(std::nextafter(x, 10.0f));
    EXPECT_LT(lo_want, hi_want) << x;  // one ulp either side lands on the two neighbours
    EXPECT_TRUE(lo_want == want || hi_want == want);
  }
  // Neighbours of each midpoint, explicitly.
  EXPECT_EQ(e2m1_round(std::nextafter(0.25f, 1.0f)), 0.5f);
  EXPECT_EQ(e2m1_round(std::nextafter(0.75f, 0.0f)), 0.5f);
  EXPECT_EQ(e2m1_round(std::nextafter(1.25f, 2.0f)), 1.5f);
  EXPECT_EQ(e2m1_round(std::nextafter(1.75f, 0.0f)), 1.5f);
  EXPECT_EQ(e2m1_round(std::nextafter(2.5f, 3.0f)), 3.0f);
  EXPECT_EQ(e2m1_round(std::nextafter(3.5f, 0.0f)), 3.0f);
  EXPECT_EQ(e2m1_round(std::nextafter(5.0f, 6.0f)), 6.0f);
}

TEST(E2M1, ExtremesNanInfAndSignedZero) {
  EXPECT_EQ(e2m1_from_float(6.0f), 7);
  EXPECT_EQ(e2m1_from_float(7.0f), 7);
  EXPECT_EQ(e2m1_from_float(1e30f), 7);
  EXPECT_EQ(e2m1_from_float(INFINITY), 7);
  EXPECT_EQ(e2m1_from_float(-INFINITY), 15);
  EXPECT_EQ(e2m1_from_float(std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(e2m1_from_float(-0.0f), 8);
  EXPECT_EQ(e2m1_from_float(-0.1f), 8);  // underflow keeps the sign: -0
  EXPECT_EQ(e2m1_from_float(FLT_TRUE_MIN), 0);
}

TEST(E2M1, NibbleOrderLowIsEven) {
  const uint8_t codes[6] = {1, 2, 0xf, 0x8, 7, 0};
  uint8_t packed[3];
  e2m1_pack(codes, 6, packed);
  EXPECT_EQ(packed[0], 0x21);  // element 0 (code 1) low, element 1 (code 2) high
  EXPECT_EQ(packed[1], 0x8f);
  EXPECT_EQ(packed[2], 0x07);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(e2m1_unpack_at(packed, i), codes[i]) << i;
}

}  // namespace
}  // namespace ds41::quant
