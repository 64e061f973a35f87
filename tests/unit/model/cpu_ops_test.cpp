// Selection rules of the CPU reference ops: the documented tie order (larger score first, equal
// scores -> lower index, -inf never selected, +inf selectable), the candidate pool's forced
// newest block, and the router's bias-for-selection-only rule.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/cpu/cpu_backend.h"

namespace ds41::backends::cpu {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

TEST(CpuOps, TopkTieOrderIsLowerIndexFirst) {
  CpuBackend be(nullptr);
  // Ties at 1.0 on indices 1, 3, 4; k = 3 takes 5.0 (idx 2), then 1 and 3.
  std::vector<float> s = {0.5f, 1.0f, 5.0f, 1.0f, 1.0f, -kInf};
  std::vector<int32_t> out(3);
  be.topk_rows(s.data(), 1, 6, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
  // -inf never selected; padding with -1; +inf selectable.
  std::vector<float> t = {-kInf, kInf, -kInf, 0.0f};
  std::vector<int32_t> o2(4);
  be.topk_rows(t.data(), 1, 4, 4, o2.data());
  EXPECT_EQ(o2, (std::vector<int32_t>{1, 3, -1, -1}));
}

TEST(CpuOps, CandidatePoolForcesTheNewestBlock) {
  CpuBackend be(nullptr);
  // 7 entries, blocks of 2; visible 5 (entries 0..4). Block 2 (entries 4,5) holds the newest
  // visible entry and is forced even though its score is lowest; keep 2 blocks.
  std::vector<float> s = {9.0f, 1.0f, 3.0f, 8.0f, -5.0f, -kInf, -kInf};
  int64_t vis = 5;
  std::vector<uint8_t> mask(7);
  be.candidate_pool(s.data(), &vis, 1, 7, 2, 2, mask.data());
  EXPECT_EQ(mask, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0}));
}

TEST(CpuOps, RouterBiasSelectsButDoesNotWeigh) {
  CpuBackend be(nullptr);
  std::vector<float> logits = {1.0f, 2.0f, 0.5f, 1.5f};
  std::vector<float> bias = {0.0f, 0.0f, 10.0f, 0.0f};
  std::vector<int32_t> e(2);
  std::vector<float> w(2);
  be.router(logits.data(), 1, 4, bias.data(), nullptr, nullptr, 2, 1.0f, 1.5f, e.data(), w.data());
  EXPECT_EQ(e[0], 2);  // selected by the bias
  EXPECT_EQ(e[1], 1);
  auto sc = [](float x) { return std::sqrt(std::log1p(std::exp(x))); };
  EXPECT_NEAR(w[0], sc(0.5f) / (sc(0.5f) + sc(2.0f)) * 1.5f, 1e-6);
}

TEST(CpuOps, QuantizedResidentLinearEqualsCached) {
  ThreadPool pool(2);
  CpuBackend cached(&pool), resident(&pool, CpuBackendOptions{false});
  // A 64 x 64 FP8 weight (all codes 0x38 = 1.0, scales 2^0 and 2^-1 per tile row).
  std::vector<uint8_t> q(64 * 64, 0x38), sc = {127, 127, 126, 126};
  ops::WeightRef w{ops::WeightFormat::kFp8Tiles, q.data(), sc.data(), 64, 64, "w"};
  std::vector<float> x(3 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  std::vector<float> y1(3 * 64), y2(3 * 64);
  cached.linear(w, x.data(), 3, y1.data());
  resident.linear(w, x.data(), 3, y2.data());
  EXPECT_EQ(y1, y2);
}

}  // namespace
}  // namespace ds41::backends::cpu
