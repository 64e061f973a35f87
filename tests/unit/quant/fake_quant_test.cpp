// Tests of Q_win / Q_kv / Q_idx (MODEL_SPEC 3.9) and their packed rows (MODEL_SPEC 5.2): byte
// layouts of the released row sizes (528 / 288 / 68 B), floors, midpoints, NaN/inf behaviour,
// and lossless pack_on_grid of values that already lie on the grids. Bit-exact agreement with an
// independent implementation is in golden_vectors_test.cpp.
#include "quant/fake_quant.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/e8m0.h"
#include "support/float_bits.h"

namespace ds41::quant {
namespace {

using ds41::testing::bits;

// Random row: each block of 16 gets its own magnitude 10^U(-9, 4), with sprinkled zeros/-0.
std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-9.0f, 4.0f);
  std::vector<float> x(n);
  for (int64_t b = 0; b < n; b += 16) {
    float scale = std::pow(10.0f, ex(rng));
    for (int64_t i = b; i < b + 16; ++i) x[i] = nd(rng) * scale;
  }
  for (int k = 0; k < 4; ++k) x[rng() % n] = (k % 2) ? -0.0f : 0.0f;
  return x;
}

TEST(FakeQuantRows, ReleasedRowSizes) {
  EXPECT_EQ(window_row_bytes(512), 528);
  EXPECT_EQ(kv_row_bytes(512), 288);
  EXPECT_EQ(idx_row_bytes(128), 68);
  EXPECT_EQ(kv_row_bytes(512) + idx_row_bytes(128), 356);  // one compressed entry, MODEL_SPEC 5.2
}

TEST(QWin, RowLayoutValuesThenExponents) {
  std::vector<float> x(512, 0.0f);
  x[0] = 300.0f;   // block 0: A/448 in (0.5, 1] -> s = 1, exponent byte 127
  x[1] = -2.5f;    // exact e4m3 (1.25 * 2)
  x[32] = 0.001f;  // block 1: A = 1e-3 -> s = pow2ceil(1e-3/448) = 2^-18
  std::vector<uint8_t> row(528);
  q_win_encode(x.data(), 512, row.data());
  EXPECT_EQ(row[512], 127);
  EXPECT_EQ(row[0], e4m3_from_float(300.0f));
  EXPECT_EQ(row[1], e4m3_from_float(-2.5f));
  EXPECT_EQ(row[2], 0x00);
  EXPECT_EQ(row[513], 127 - 18);
  EXPECT_EQ(row[32], e4m3_from_float(0.001f * 0x1p18f));
  for (int b = 2; b < 16; ++b) EXPECT_EQ(row[512 + b], 127 - 22) << "floor 1e-4 -> s = 2^-22, block " << b;
  std::vector<float> y(512);
  q_win_decode(row.data(), 512, y.data());
  EXPECT_EQ(y[0], 288.0f);  // 300 -> nearest e4m3 is 288 (step 32 in [256, 448])
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[32], e4m3_round(0.001f * 0x1p18f) * 0x1p-18f);
}

TEST(QWin, MidpointsAfterScalingTieToEven) {
  // s = 2^3 (A = 448*8 gives A*f32(1/448) rounding to 8 or just above; pin A = 400*8 instead).
  std::vector<float> x(32, 0.0f);
  x[0] = 400.0f * 8;
  x[1] = 17.0f * 8;            // midpoint of 16 and 18 -> 16 (even mantissa)
  x[2] = 19.0f * 8;            // midpoint of 18 and 20 -> 20
  x[3] = 7.5f * 0x1p-9f * 8;   // subnormal/normal boundary midpoint -> 2^-6
  x[4] = 0.5f * 0x1p-9f * 8;   // half the smallest subnormal -> 0
  x[5] = -1.5f * 0x1p-9f * 8;  // midpoint of 1 and 2 subnormal units -> 2 units
  std::vector<uint8_t> row(33);
  q_win_encode(x.data(), 32, row.data());
  EXPECT_EQ(row[32], 130);
  std::vector<float> y(32);
  q_win_decode(row.data(), 32, y.data());
  EXPECT_EQ(y[1], 16.0f * 8);
  EXPECT_EQ(y[2], 20.0f * 8);
  EXPECT_EQ(y[3], 0x1p-6f * 8);
  EXPECT_EQ(y[4], 0.0f);
  EXPECT_EQ(y[5], -2.0f * 0x1p-9f * 8);
}

TEST(QKv, RowLayoutCodesThenE4m3Scales) {
  std::vector<float> x(512, 0.0f);
  x[0] = 6.0f;    // block 0: A/6 = 1 -> s = 1 (E4M3 0x38)
  x[1] = -1.25f;  // -> -1 (tie to even code)
  x[2] = 5.0f;    // -> 4
  x[3] = 2.5f;    // -> 2
  x[16] = 0.0f;   // block 1 all zero: A = 6*2^-9, s = 2^-9 (E4M3 0x01)
  x[17] = -0.0f;
  x[32] = 13.0f;  // block 2: A/6 = 2.1666.. -> e4m3 2.25 -> x/s = 5.77 -> 6
  std::vector<uint8_t> row(288);
  q_kv_encode(x.data(), 512, row.data());
  EXPECT_EQ(row[256], 0x38);
  EXPECT_EQ(row[257], 0x01);
  EXPECT_EQ(row[258], e4m3_from_float(13.0f / 6.0f));
  EXPECT_EQ(e4m3_to_float(row[258]), 2.25f);
  EXPECT_EQ(row[0], (8 | 2) << 4 | 7);  // element 0 = code 7 (low), element 1 = -1 (high)
  EXPECT_EQ(row[1], 4 << 4 | 6);        // element 2 = 4 (code 6), element 3 = 2 (code 4)
  EXPECT_EQ(row[8], 8 << 4 | 0);        // block 1: +0 then -0
  std::vector<float> y(512);
  q_kv_decode(row.data(), 512, y.data());
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(y[1], -1.0f);
  EXPECT_EQ(y[2], 4.0f);
  EXPECT_EQ(y[3], 2.0f);
  EXPECT_EQ(bits(y[17]), bits(-0.0f));
  EXPECT_EQ(y[32], 6.0f * 2.25f);
}

TEST(QKv, ScaleMidpointTiesToEvenE4m3) {
  // A/6 exactly the midpoint of e4m3 1.0 (0x38) and 1.125 (0x39) -> 1.0 (even).
  std::vector<float> x(16, 0.0f);
  x[0] = 6.0f * 1.0625f;
  std::vector<uint8_t> row(kv_row_bytes(16));
  q_kv_encode(x.data(), 16, row.data());
  EXPECT_EQ(row[8], 0x38);
  // x/s = 6.375 > 6 -> clamped to 6 first.
  EXPECT_EQ(e2m1_unpack_at(row.data(), 0), 7);
}

TEST(QIdx, RowLayoutAndFloor) {
  std::vector<float> x(128, 0.0f);
  x[0] = 3.0f;     // block 0: A*f32(1/6) = 0.5 (rounded) -> s = 2^-1 -> 3/0.5 = 6
  x[1] = 0.625f;   // /0.5 = 1.25 -> 1 (tie) -> 0.5
  x[32] = 5e-38f;  // block 1: below the floor 6*2^-126 = 7.05e-38 -> s = 2^-126
  x[64] = 1e-37f;  // block 2: above it -> A*f32(1/6) = 1.67e-38 -> s = 2^-125
  std::vector<uint8_t> row(68);
  q_idx_encode(x.data(), 128, row.data());
  EXPECT_EQ(row[64], 126);
  EXPECT_EQ(row[0], 2 << 4 | 7);
  EXPECT_EQ(row[65], 1);
  EXPECT_EQ(row[66], 2);
  EXPECT_EQ(e2m1_unpack_at(row.data(), 32), 6);  // 5e-38 / 2^-126 = 4.25 -> 4
  std::vector<float> y(128);
  q_idx_decode(row.data(), 128, y.data());
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], 0.5f);
  EXPECT_EQ(y[32], 4.0f * 0x1p-126f);
  EXPECT_EQ(row[67], 1) << "all-zero block uses the floor 6*2^-126 -> s = 2^-126";
}

TEST(FakeQuant, NanAndInfInputsFollowTheDocumentedRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(32, 1.0f);
  x[3] = nan;
  std::vector<uint8_t> wrow(33);
  q_win_encode(x.data(), 32, wrow.data());
  EXPECT_EQ(wrow[3], 0x7f);
  EXPECT_EQ(wrow[32], 127 - 8);  // NaN ignored by the max: A = 1 -> s = pow2ceil(1/448) = 2^-8
  EXPECT_EQ(wrow[0], e4m3_from_float(256.0f));
  x[3] = INFINITY;
  x[4] = -INFINITY;
  q_win_encode(x.data(), 32, wrow.data());
  EXPECT_EQ(wrow[3], 0x7e);
  EXPECT_EQ(wrow[4], 0xfe);
  EXPECT_EQ(wrow[32], 127 + pow2ceil_exponent(FLT_MAX * (1.0f / 448.0f)));
  EXPECT_EQ(wrow[0], 0x00);  // 1 / 2^120 underflows to +0

  std::vector<float> k(16, 0.5f);
  k[2] = nan;
  k[3] = -INFINITY;
  std::vector<uint8_t> krow(kv_row_bytes(16));
  q_kv_encode(k.data(), 16, krow.data());
  EXPECT_EQ(krow[8], 0x7e);                          // A = FLT_MAX -> A/6 saturates to 448
  EXPECT_EQ(e2m1_unpack_at(krow.data(), 2), 0);      // NaN -> +0 (E2M1 has no NaN)
  EXPECT_EQ(e2m1_unpack_at(krow.data(), 3), 8 | 7);  // -inf -> -6
  EXPECT_EQ(e2m1_unpack_at(krow.data(), 0), 0);      // 0.5/448 -> 0

  std::vector<float> q(32, -0.0f);
  q[0] = nan;
  std::vector<uint8_t> irow(idx_row_bytes(32));
  q_idx_encode(q.data(), 32, irow.data());
  EXPECT_EQ(irow[16], 1);
  EXPECT_EQ(e2m1_unpack_at(irow.data(), 0), 0);
  EXPECT_EQ(e2m1_unpack_at(irow.data(), 1), 8);  // -0 keeps its sign
}

TEST(FakeQuant, InplaceEqualsDecodeOfEncode) {
  std::mt19937 rng(7);
  for (int rep = 0; rep < 20; ++rep) {
    auto x = random_row(rng, 512);
    std::vector<uint8_t> row(528);
    std::vector<float> a(512), b = x;
    q_win_encode(x.data(), 512, row.data());
    q_win_decode(row.data(), 512, a.data());
    q_win_inplace(b.data(), 512);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), 2048), 0);
    b = x;
    q_kv_encode(x.data(), 512, row.data());
    q_kv_decode(row.data(), 512, a.data());
    q_kv_inplace(b.data(), 512);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), 2048), 0);
    b = x;
    q_idx_encode(x.data(), 128, row.data());
    q_idx_decode(row.data(), 128, a.data());
    q_idx_inplace(b.data(), 128);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), 512), 0);
  }
}

// pack_on_grid must reproduce values that lie on the grid bit for bit (MODEL_SPEC 3.9: storing
// the fake-quantized values packed is lossless), for all three layouts at the released sizes.
TEST(FakeQuant, PackOnGridIsLosslessForQuantizedValues) {
  std::mt19937 rng(8);
  for (int rep = 0; rep < 200; ++rep) {
    auto x = random_row(rng, 512);
    std::vector<uint8_t> row(528);
    std::vector<float> y(512);

    std::vector<float> w = x;
    q_win_inplace(w.data(), 512);
    ASSERT_TRUE(q_win_pack_on_grid(w.data(), 512, row.data()).ok());
    q_win_decode(row.data(), 512, y.data());
    for (int i = 0; i < 512; ++i) ASSERT_EQ(bits(y[i]), bits(w[i])) << "Q_win rep " << rep << " i " << i;

    std::vector<float> k = x;
    q_kv_inplace(k.data(), 512);
    ASSERT_TRUE(q_kv_pack_on_grid(k.data(), 512, row.data()).ok());
    q_kv_decode(row.data(), 512, y.data());
    for (int i = 0; i < 512; ++i) ASSERT_EQ(bits(y[i]), bits(k[i])) << "Q_kv rep " << rep << " i " << i;

    std::vector<float> q(x.begin(), x.begin() + 128);
    q_idx_inplace(q.data(), 128);
    ASSERT_TRUE(q_idx_pack_on_grid(q.data(), 128, row.data()).ok());
    q_idx_decode(row.data(), 128, y.data());
    for (int i = 0; i < 128; ++i) ASSERT_EQ(bits(y[i]), bits(q[i])) << "Q_idx rep " << rep << " i " << i;
  }
}

TEST(FakeQuant, PackOnGridRejectsOffGridBlocks) {
  std::vector<float> x(512, 0.0f);
  std::vector<uint8_t> row(528);
  x[40] = 1.0f;
  x[41] = 1.0f + 0x1p-20f;  // no power-of-two scale puts both on the E4M3 grid
  Status s = q_win_pack_on_grid(x.data(), 512, row.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.message();
  x[41] = 1.1f;  // ratio 1.1 is no ratio of two E2M1 values
  s = q_kv_pack_on_grid(x.data(), 512, row.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 2"), std::string::npos) << s.message();
  std::vector<float> q(128, 0.0f);
  q[100] = 1.0f;
  q[101] = 0.7f;  // 0.7 / 1 is no ratio of two E2M1 magnitudes
  s = q_idx_pack_on_grid(q.data(), 128, row.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 3"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ds41::quant
