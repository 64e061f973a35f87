// Tests for src/engram/numpy_rng.*: bit-exact against NumPy 1.24 (fixtures/numpy_rng.json:
// 20 seeds from 0 to 2^64-1, SeedSequence pools and states, PCG64 state and raw outputs, and
// integers(0, bound, 6, int64) for 22 bounds covering rng == 0, the 32-bit Lemire path, the
// rng == 2^32-1 path and the 64-bit Lemire path; one generator shared across calls; list
// entropy), plus the MODEL_SPEC 3.2.2 multiplier table.
#include "engram/numpy_rng.h"

#include <gtest/gtest.h>

#include <string>

#include "unit/engram/engram_test_util.h"

namespace ds41::engram {
namespace {

uint64_t u64(const nlohmann::json& s) { return std::stoull(s.get<std::string>()); }
int64_t i64(const nlohmann::json& s) { return std::stoll(s.get<std::string>()); }
// Python ints beyond 64 bits in the fixture (PCG64 128-bit state) as hi/lo.
void u128(const nlohmann::json& s, uint64_t* hi, uint64_t* lo) {
  unsigned __int128 v = 0;
  for (char c : s.get<std::string>()) v = v * 10 + static_cast<unsigned>(c - '0');
  *hi = static_cast<uint64_t>(v >> 64);
  *lo = static_cast<uint64_t>(v);
}

TEST(NumpyRng, SeedSequencePcg64AndIntegersMatchNumpy) {
  const auto fx = testing::load_json(testing::fixture_path("numpy_rng.json"));
  ASSERT_EQ(fx["cases"].size(), 20u);
  size_t draws = 0;
  for (const auto& c : fx["cases"]) {
    const uint64_t seed = u64(c["seed"]);
    SCOPED_TRACE("seed " + std::to_string(seed));
    NumpySeedSequence ss({seed});
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ss.pool()[i], c["pool"][static_cast<size_t>(i)].get<uint32_t>());
    const auto s32 = ss.generate_state_u32(8);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(s32[i], c["state_u32x8"][i].get<uint32_t>());
    const auto s64 = ss.generate_state_u64(4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(s64[i], u64(c["state_u64x4"][i]));

    NumpyPcg64 pcg(ss);
    uint64_t hi, lo;
    u128(c["pcg_state"], &hi, &lo);
    EXPECT_EQ(pcg.state_hi(), hi);
    EXPECT_EQ(pcg.state_lo(), lo);
    u128(c["pcg_inc"], &hi, &lo);
    EXPECT_EQ(pcg.inc_hi(), hi);
    EXPECT_EQ(pcg.inc_lo(), lo);
    for (const auto& r : c["raw"]) EXPECT_EQ(pcg.next_uint64(), u64(r));

    for (const auto& d : c["integers"]) {
      const int64_t bound = i64(d[0]);
      auto g = NumpyGenerator::default_rng(seed);
      auto got = g.integers(0, bound, d[1].size());
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      for (size_t i = 0; i < d[1].size(); ++i) {
        EXPECT_EQ((*got)[i], i64(d[1][i])) << "bound " << bound << " draw " << i;
        ++draws;
      }
    }
  }
  EXPECT_EQ(draws, 20u * 22u * 6u);
}

TEST(NumpyRng, CallsSharingOneGeneratorMatchNumpy) {
  // The 32-bit path keeps the unused high half of a 64-bit draw for the next call.
  const auto fx = testing::load_json(testing::fixture_path("numpy_rng.json"));
  auto g = NumpyGenerator::default_rng(fx["sequence_seed"].get<uint64_t>());
  for (const auto& s : fx["sequence"]) {
    const int64_t lo = i64(s[0]), hi = i64(s[1]);
    auto got = g.integers(lo, hi, s[2].get<size_t>());
    ASSERT_TRUE(got.ok());
    for (size_t i = 0; i < s[3].size(); ++i)
      EXPECT_EQ((*got)[i], i64(s[3][i])) << "[" << lo << ", " << hi << ")";
  }
}

TEST(NumpyRng, ListEntropyMatchesNumpy) {
  const auto fx = testing::load_json(testing::fixture_path("numpy_rng.json"));
  for (const auto& e : fx["entropy_lists"]) {
    std::vector<uint64_t> ent;
    for (const auto& x : e["entropy"]) ent.push_back(u64(x));
    NumpySeedSequence ss(ent);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ss.pool()[i], e["pool"][static_cast<size_t>(i)].get<uint32_t>());
    NumpyPcg64 pcg(ss);
    for (const auto& r : e["raw"]) EXPECT_EQ(pcg.next_uint64(), u64(r));
  }
}

TEST(NumpyRng, ModelSpecMultiplierTable) {
  // MODEL_SPEC 3.2.2: a = 2u + 1, u = default_rng(10007 l).integers(0, 46539438283891, 4).
  const int64_t bound = (INT64_MAX / 99092) / 2;
  EXPECT_EQ(bound, 46539438283891);
  const int64_t want[2][4] = {{76632096046245, 4839876093313, 35959672319349, 73987337458391},
                              {67716810739261, 51510806800915, 30921347202721, 82619226485591}};
  const int layers[2] = {1, 14};
  for (int k = 0; k < 2; ++k) {
    auto g = NumpyGenerator::default_rng(10007u * static_cast<uint64_t>(layers[k]));
    auto u = g.integers(0, bound, 4);
    ASSERT_TRUE(u.ok());
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(2 * (*u)[static_cast<size_t>(j)] + 1, want[k][j]) << "layer " << layers[k];
  }
}

TEST(NumpyRng, EmptyRangeIsAnError) {
  auto g = NumpyGenerator::default_rng(1);
  EXPECT_EQ(g.integers(5, 5, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.integers(5, 4, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds41::engram
