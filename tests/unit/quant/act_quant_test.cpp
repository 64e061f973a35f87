// Tests of the official path's activation quantization (quant/act_quant.h, MODEL_SPEC 3.0 / Q3):
// bit-equal to Q_win's operator on full blocks (the same E4M3 / pow2 rule), worked values at the scale
// boundaries and E4M3 midpoints, a short last block with its own scale, aliasing, NaN / inf, and the
// mode's names and format rule.
#include "quant/act_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "quant/fake_quant.h"
#include "support/float_bits.h"

namespace ds41::quant {
namespace {

using ds41::testing::bits;

std::vector<float> quant(std::vector<float> x, int64_t rows) {
  std::vector<float> y(x.size());
  act_quant_fp8_rows(x.data(), rows, static_cast<int64_t>(x.size()) / rows, y.data());
  return y;
}

TEST(ActQuant, FullBlocksAreQwinBitForBit) {
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-30.0f, 30.0f);
  const int64_t rows = 7, k = 5120;
  std::vector<float> x(rows * k);
  for (int64_t b = 0; b < rows * k; b += 32) {
    const float mag = std::ldexp(1.0f, static_cast<int>(ex(rng)));
    for (int64_t i = b; i < b + 32; ++i) x[i] = nd(rng) * mag;
  }
  x[3] = 0.0f;
  x[100] = -0.0f;
  std::vector<float> ref = x;
  for (int64_t r = 0; r < rows; ++r) q_win_inplace(ref.data() + r * k, k);
  const std::vector<float> y = quant(x, rows);
  int64_t differing = 0, changed = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    differing += bits(y[i]) != bits(ref[i]);
    changed += bits(y[i]) != bits(x[i]);
  }
  EXPECT_EQ(differing, 0);
  EXPECT_GT(changed, static_cast<int64_t>(x.size()) / 2);  // normal values are not on the E4M3 grid
}

TEST(ActQuant, WorkedValues) {
  // amax 448: s = 1, the E4M3 grid itself. 1.0625 is the midpoint of 1 and 1.125 (ties to even: 1),
  // 1.1875 the midpoint of 1.125 and 1.25 (to 1.25), 300 lies between 288 and 320 (to 288).
  std::vector<float> x(32, 0.0f);
  x[0] = 448.0f; x[1] = 1.0625f; x[2] = 1.1875f; x[3] = -300.0f; x[4] = 0.0137f;
  std::vector<float> y = quant(x, 1);
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 1.25f);
  EXPECT_EQ(y[3], -288.0f);
  EXPECT_EQ(y[4], std::ldexp(7.0f, -9));  // 0.0137 -> subnormal step 2^-9: 7 * 2^-9 = 0.01367
  // amax 449: s = pow2ceil(449 / 448) = 2; 449 / 2 = 224.5 -> 224 (grid step 16 above 128) -> 448.
  x.assign(32, 0.0f);
  x[0] = 449.0f; x[1] = 3.0f;
  y = quant(x, 1);
  EXPECT_EQ(y[0], 448.0f);
  EXPECT_EQ(y[1], 3.0f);
  // An all-zero block keeps its zeros (A floors at 1e-4); -0 keeps its sign.
  x.assign(32, 0.0f);
  x[5] = -0.0f;
  y = quant(x, 1);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(std::signbit(y[5]));
}

TEST(ActQuant, ShortLastBlockTakesItsOwnScale) {
  // k = 40: the first 32 values are ~1000, the last 8 ~0.001. Quantized with the first block's scale
  // (4) they would all round to 0; with their own they keep E4M3's relative precision (<= 2^-4).
  std::vector<float> x(40);
  for (int i = 0; i < 32; ++i) x[i] = 1000.0f + i;
  for (int i = 32; i < 40; ++i) x[i] = 0.001f * (1.0f + 0.1f * (i - 32));
  const std::vector<float> y = quant(x, 1);
  for (int i = 32; i < 40; ++i) {
    EXPECT_NE(y[i], 0.0f) << i;
    EXPECT_LE(std::fabs(y[i] - x[i]), x[i] * 0x1p-4f) << i;
  }
  // Rows are independent: two rows of 40 give each row's result.
  std::vector<float> two = x;
  two.insert(two.end(), x.rbegin(), x.rend());
  const std::vector<float> y2 = quant(two, 2);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(bits(y2[i]), bits(y[i]));
  std::vector<float> rev(x.rbegin(), x.rend());
  const std::vector<float> yr = quant(rev, 1);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(bits(y2[40 + i]), bits(yr[i]));
}

TEST(ActQuant, InPlaceNanAndInf) {
  std::vector<float> x(64, 1.5f);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  x[41] = 2.0f;
  act_quant_fp8_rows(x.data(), 1, 64, x.data());
  EXPECT_EQ(x[0], 1.5f);  // the NaN is ignored by the block maximum: s = pow2ceil(1.5 / 448) = 2^-8
  EXPECT_TRUE(std::isnan(x[1]));
  // +inf counts as FLT_MAX: s = 2^120, +inf saturates to 448 s and 2 rounds to 0 on that grid.
  EXPECT_EQ(x[40], 448.0f * std::ldexp(1.0f, 120));
  EXPECT_EQ(x[41], 0.0f);
}

TEST(ActQuant, NamesAndFormatRule) {
  EXPECT_STREQ(act_numerics_name(ActNumerics::kExact), "exact");
  EXPECT_STREQ(act_numerics_name(ActNumerics::kFp8Block32), "fp8-act");
  auto a = parse_act_numerics("fp8-act");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, ActNumerics::kFp8Block32);
  auto e = parse_act_numerics("fp8");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("exact, fp8-act"), std::string::npos) << e.status().message();
  EXPECT_TRUE(act_quant_applies(ActNumerics::kFp8Block32, WeightFormat::kFp8Tiles));
  EXPECT_TRUE(act_quant_applies(ActNumerics::kFp8Block32, WeightFormat::kFp4Rows));
  EXPECT_FALSE(act_quant_applies(ActNumerics::kFp8Block32, WeightFormat::kBF16));
  EXPECT_FALSE(act_quant_applies(ActNumerics::kFp8Block32, WeightFormat::kF32));
  EXPECT_FALSE(act_quant_applies(ActNumerics::kExact, WeightFormat::kFp8Tiles));
}

}  // namespace
}  // namespace ds41::quant
