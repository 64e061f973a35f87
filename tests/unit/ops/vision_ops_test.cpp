// Issue 16: the CPU references of the vision ops (src/ops/backend.h "Vision tower and aligner"),
// each against a direct float64 transcription of MODEL_SPEC 3.11, and the layout ops exactly.
// These are the rows a GPU backend's parity table will compare its kernels with.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/cpu_backend.h"

namespace ds41::backends::cpu {
namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(VisionOps, Rope2dIsSplitHalfWithRowThenColumnAngles) {
  CpuBackend be(nullptr);
  const int64_t n = 6, heads = 2, hd = 16, q = hd / 4, half = hd / 2;
  std::vector<float> x = randn(n * heads * hd, 1), y = x;
  std::vector<int32_t> row = {0, 0, 1, 2, 5, 7}, col = {0, 3, 1, 0, 4, 9};
  std::vector<float> f(q);
  for (int i = 0; i < q; ++i) f[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / half));
  be.rope_2d(y.data(), n, heads, hd, row.data(), col.data(), f.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < half; ++j) {
        const double a = (j < q ? row[r] : col[r]) * static_cast<double>(f[j % q]);
        const float* xv = &x[(r * heads + h) * hd];
        const double x1 = xv[j], x2 = xv[j + half];
        EXPECT_NEAR(y[(r * heads + h) * hd + j], x1 * std::cos(a) - x2 * std::sin(a), 1e-5);
        EXPECT_NEAR(y[(r * heads + h) * hd + j + half], x2 * std::cos(a) + x1 * std::sin(a), 1e-5);
      }
}

TEST(VisionOps, DenseAttentionStaysInsideEachSegment) {
  CpuBackend be(nullptr);
  const int64_t n = 7, heads = 2, hd = 8;
  std::vector<int64_t> segs = {0, 3, 7};
  auto q = randn(n * heads * hd, 2), k = randn(n * heads * hd, 3), v = randn(n * heads * hd, 4);
  std::vector<float> out(n * heads * hd);
  ops::DenseAttentionArgs a;
  a.n = n, a.n_heads = heads, a.head_dim = hd, a.q = q.data(), a.k = k.data(), a.v = v.data();
  a.seg_offsets = segs.data(), a.n_segs = 2, a.scale = 0.35f, a.out = out.data();
  be.dense_attention(a);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t s0 = r < 3 ? 0 : 3, s1 = r < 3 ? 3 : 7;
      std::vector<double> p;
      double mx = -1e300, den = 0;
      for (int64_t j = s0; j < s1; ++j) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += double(q[(r * heads + h) * hd + i]) * k[(j * heads + h) * hd + i];
        p.push_back(d * 0.35);
        mx = std::max(mx, p.back());
      }
      for (auto& e : p) den += (e = std::exp(e - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t j = s0; j < s1; ++j) o += p[j - s0] / den * v[(j * heads + h) * hd + i];
        EXPECT_NEAR(out[(r * heads + h) * hd + i], o, 1e-5);
      }
    }
}

TEST(VisionOps, SpaceToDepthIsChannelMajorWithZeroPadding) {
  CpuBackend be(nullptr);
  const int64_t gh = 4, gw = 5, c = 2, k = 3;  // pads to 6 x 6: 2 x 2 windows
  std::vector<float> x(gh * gw * c);
  for (int64_t i = 0; i < gh * gw * c; ++i) x[i] = static_cast<float>(i + 1);
  std::vector<float> out(4 * c * k * k, -1.0f);
  be.space_to_depth(x.data(), gh, gw, c, k, out.data());
  for (int64_t wi = 0; wi < 2; ++wi)
    for (int64_t wj = 0; wj < 2; ++wj)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t dy = 0; dy < k; ++dy)
          for (int64_t dx = 0; dx < k; ++dx) {
            const int64_t y = wi * k + dy, xx = wj * k + dx;
            const float want = (y < gh && xx < gw) ? x[(y * gw + xx) * c + ch] : 0.0f;
            EXPECT_EQ(out[(wi * 2 + wj) * c * k * k + (ch * k + dy) * k + dx], want);
          }
}

TEST(VisionOps, GeluIsExactErfAndAddsAreElementwise) {
  CpuBackend be(nullptr);
  std::vector<float> x = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
  std::vector<float> y = x;
  be.gelu_erf(y.data(), 5);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(y[i], 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0))), 1e-7);
  std::vector<float> m = {1, 2, 3, 4, 5, 6}, b = {10, 20, 30};
  be.add_bias(m.data(), 2, 3, b.data());
  EXPECT_EQ(m, (std::vector<float>{11, 22, 33, 14, 25, 36}));
  be.add_inplace(m.data(), b.data(), 3);
  EXPECT_EQ(m, (std::vector<float>{21, 42, 63, 14, 25, 36}));
}

}  // namespace
}  // namespace ds41::backends::cpu
