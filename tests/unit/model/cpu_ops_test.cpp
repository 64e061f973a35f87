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

// --numerics fp8-act (quant/act_quant.h): an FP8 or FP4 linear (plain and grouped) computes with its
// input quantized per 32 along K, in both weight-residency modes; a BF16 linear takes x as it is.
TEST(CpuOps, Fp8ActLinearQuantizesTheInputOfFp8AndFp4Weights) {
  ThreadPool pool(2);
  CpuBackendOptions fo;
  fo.act = quant::ActNumerics::kFp8Block32;
  CpuBackendOptions fo_res = fo;
  fo_res.cache_dequantized = false;
  CpuBackend exact(&pool), fp8(&pool, fo), fp8_res(&pool, fo_res);
  const int64_t n = 3, in = 96, out = 64;
  std::vector<uint8_t> q(out * in), sc(2 * 3, 127), bf(out * in * 2), f4(out * in / 2), s4(out * in / 32, 126);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>((i * 37 + 11) % 0x7e);  // finite E4M3
  for (size_t i = 0; i < bf.size(); i += 2) { bf[i] = 0; bf[i + 1] = static_cast<uint8_t>(0x3f - (i / 2) % 3); }
  for (size_t i = 0; i < f4.size(); ++i) f4[i] = static_cast<uint8_t>(i * 29 + 5);
  ops::WeightRef w8{ops::WeightFormat::kFp8Tiles, q.data(), sc.data(), out, in, "w8"};
  ops::WeightRef w4{ops::WeightFormat::kFp4Rows, f4.data(), s4.data(), out, in, "w4"};
  ops::WeightRef wb{ops::WeightFormat::kBF16, bf.data(), nullptr, out, in, "wb"};
  std::vector<float> x(n * in);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + i % 5);
  std::vector<float> xq(x.size());
  quant::act_quant_fp8_rows(x.data(), n, in, xq.data());
  ASSERT_NE(x, xq);
  auto lin = [&](CpuBackend& be, const ops::WeightRef& w, const std::vector<float>& in_x) {
    std::vector<float> y(n * out);
    be.linear(w, in_x.data(), n, y.data());
    return y;
  };
  for (const ops::WeightRef* w : {&w8, &w4}) {
    SCOPED_TRACE(w->name);
    EXPECT_EQ(lin(fp8, *w, x), lin(exact, *w, xq));
    EXPECT_EQ(lin(fp8_res, *w, x), lin(exact, *w, xq));
    EXPECT_NE(lin(fp8, *w, x), lin(exact, *w, x));
  }
  EXPECT_EQ(lin(fp8, wb, x), lin(exact, wb, x));
  // Grouped (wo_a): 2 groups of K = 48 each; each group's K is quantized on its own (blocks 32 + 16).
  ops::WeightRef wg{ops::WeightFormat::kFp8Tiles, q.data(), sc.data(), out, in / 2, "wg"};
  std::vector<uint8_t> scg(2 * 2, 127);
  wg.scale = scg.data();
  std::vector<float> xg(n * in), xgq(n * in);
  for (size_t i = 0; i < xg.size(); ++i) xg[i] = (i % 48 < 32 ? 100.0f : 0.01f) * std::cos(0.11f * static_cast<float>(i));
  quant::act_quant_fp8_rows(xg.data(), n * 2, in / 2, xgq.data());
  std::vector<float> ya(n * out), yb(n * out);
  fp8.grouped_linear(wg, 2, xg.data(), n, ya.data());
  exact.grouped_linear(wg, 2, xgq.data(), n, yb.data());
  EXPECT_EQ(ya, yb);
}

}  // namespace
}  // namespace ds41::backends::cpu
