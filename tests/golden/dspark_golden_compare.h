// Test support: the compare rules of `make_goldens.py compare` for the DSpark set
// (../shared/golden/README.md "DSpark set", "How to check an engine"), applied to the arrays of
// engine::dspark_score / gpu::gpu_dspark_score: int32 arrays exact (router_experts as sets, row by
// row), features / main_x / hidden e_r <= 1e-3 per row, window / block KV rows Q_win values (a
// row over 2e-3 is a rounding flip; every row <= 0.5 and at most max(1, 5%) flips), base logits
// e_r <= 5e-3 per row, confidences / survival max |d| <= 2e-3, confidence logits <= 1e-2.
// Shared by the CPU golden test and the GPU engine test.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/dspark_score.h"
#include "golden/golden_arrays.h"

namespace ds41::testing {

inline constexpr double kDsparkTolRow = 1e-3;     // features, main_x, hidden: e_r per row
inline constexpr double kDsparkTolLogits = 5e-3;  // base logits: e_r per row
inline constexpr double kDsparkTolConf = 2e-3;    // confidence, survival: max |d|
inline constexpr double kDsparkTolConfLogit = 1e-2;
inline constexpr double kDsparkKvFlip = 2e-3, kDsparkKvMax = 0.5, kDsparkKvFlipFrac = 0.05;

// `got` against `want` (same name) with the rules above.
inline void expect_dspark_close(const engine::NamedArray& want, const engine::NamedArray& got) {
  SCOPED_TRACE(got.name);
  ASSERT_EQ(want.shape, got.shape);
  if (!want.i32.empty() || !got.i32.empty()) {
    ASSERT_EQ(want.i32.size(), got.i32.size());
    if (got.name.find("router_experts") != std::string::npos) {
      const int64_t k = got.shape.back();
      for (size_t r = 0; r * k < got.i32.size(); ++r)
        EXPECT_EQ(id_set(&want.i32[r * k], k), id_set(&got.i32[r * k], k)) << "row " << r;
    } else {
      EXPECT_EQ(want.i32, got.i32);
    }
    return;
  }
  ASSERT_EQ(want.f32.size(), got.f32.size());
  const int64_t w = got.shape.back(), rows = static_cast<int64_t>(got.f32.size()) / w;
  const bool conf = got.name.ends_with("confidence") || got.name.ends_with("survival");
  if (conf || got.name.ends_with("confidence_logits")) {
    double mx = 0;
    for (size_t i = 0; i < got.f32.size(); ++i)
      mx = std::max(mx, std::fabs(double(got.f32[i]) - want.f32[i]));
    EXPECT_LE(mx, conf ? kDsparkTolConf : kDsparkTolConfLogit);
    return;
  }
  double worst = 0;
  int64_t flips = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double e = row_error(&want.f32[r * w], &got.f32[r * w], w);
    worst = std::max(worst, e);
    flips += e > kDsparkKvFlip;
  }
  if (got.name.ends_with("window_kv") || got.name.ends_with("block_kv")) {
    EXPECT_LE(worst, kDsparkKvMax);
    EXPECT_LE(flips, std::max<int64_t>(1, static_cast<int64_t>(kDsparkKvFlipFrac * rows)));
  } else {
    EXPECT_LE(worst, got.name.ends_with("base_logits") ? kDsparkTolLogits : kDsparkTolRow);
  }
}

// `a` against the golden array of its name. prefix: `a` may hold only the first a.shape[0]
// entries of the golden's leading axis (a shorter input, fewer anchors or walk steps: the golden
// arrays are causal in that axis), compared with that prefix.
inline void expect_dspark_matches(const GoldenFile& g, const engine::NamedArray& a, bool prefix = false) {
  engine::NamedArray want{a.name, {}, {}, {}};
  size_t inner = 1;
  for (size_t d = 1; d < a.shape.size(); ++d) inner *= static_cast<size_t>(a.shape[d]);
  const size_t lead = a.shape.empty() ? 0 : static_cast<size_t>(a.shape[0]);
  if (!a.i32.empty()) {
    auto gv = g.get<int32_t>(a.name);
    want.shape = gv.shape;
    want.i32 = std::move(gv.v);
    if (prefix && !want.shape.empty() && static_cast<size_t>(want.shape[0]) >= lead) {
      want.shape[0] = static_cast<int64_t>(lead);
      want.i32.resize(lead * inner);
    }
  } else {
    auto gv = g.get<float>(a.name);
    want.shape = gv.shape;
    want.f32 = std::move(gv.v);
    if (prefix && !want.shape.empty() && static_cast<size_t>(want.shape[0]) >= lead) {
      want.shape[0] = static_cast<int64_t>(lead);
      want.f32.resize(lead * inner);
    }
  }
  expect_dspark_close(want, a);
}

}  // namespace ds41::testing
