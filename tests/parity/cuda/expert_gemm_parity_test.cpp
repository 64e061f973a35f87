// Parity rows of the grouped FP4 expert GEMM of prefill (backends/cuda/expert_gemm_kernels.h) against the
// CPU op (each expert's linear over its routed rows):
//   - experts of 0, 1, 31, 32, 33 and 70 routed rows (units cut at 32: full, partial and one-row units),
//     output widths that are not a multiple of the block's 128 rows (clamped loads, unwritten tails), K of
//     2 and of 5 pipeline steps (fewer steps than stages, and more), the routed rows read through a row
//     index out of order;
//   - x rows of every magnitude (1e20, 1e-15, zeros, elements spread over 40 decades, plain): each routed
//     row is compared with its own largest |y| (rows are independent), tolerance 2e-5 as the tensor-core
//     prefill linears (exact products, fp32 sums in the tensor core's order);
//   - a pair (two matrices in one launch) gives each matrix the bits of its own launch, and the 8-warp block
//     layout the 4-warp layout's bits;
//   - row-count invariance: a routed row gets the same bits in a unit of 1 row and in full units;
//   - the step fold (the default): within tolerance, the same bits in both layouts and column-tile groupings,
//     the per-tile bits for a warp whose rows' scales span 16 in a step, invariant to the row count;
//   - rows of y outside the units are not written (NaN sentinel);
//   - the scale check counts the bytes outside the fast window (and none for in-window weights).
// Label gpu: skips without a device; scripts/cuda-host-emu/run.sh runs it on the host emulator.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/expert_gemm_kernels.h"
#include "parity/cuda/kernel_parity_util.h"
#include "quant/act_quant.h"
#include "quant/weight_format.h"

namespace ds41::cuda {
namespace {

using parity::Dev;
using parity::DevWeightList;
using parity::HostWeight;
using quant::WeightFormat;

constexpr double kTol = 2e-5;
const char* kWhy = "exact products (x in 3 f16 parts), fp32 sums in the tensor core's order";

// x rows of kind r % 5: plain, x 1e20, x 1e-15, zeros, each element x 10^U(-20, 20).
std::vector<float> mixed_rows(int64_t n, int64_t in, uint64_t seed) {
  parity::Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * in));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < in; ++k) {
      float v = r.sym();
      switch (i % 5) {
        case 1: v *= 1e20f; break;
        case 2: v *= 1e-15f; break;
        case 3: v = 0.f; break;
        case 4: v *= std::pow(10.f, 40.f * r.uniform() - 20.f); break;
        default: break;
      }
      x[static_cast<size_t>(i * in + k)] = v;
    }
  return x;
}

// Per routed row: max |got - want| / max |want of the row| (0 for an all-zero row that matches).
double worst_row_error(const std::vector<float>& got, const std::vector<float>& want, int64_t m, int64_t out) {
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    double mx = 0, err = 0;
    for (int64_t o = 0; o < out; ++o) mx = std::max(mx, std::fabs(static_cast<double>(want[i * out + o])));
    for (int64_t o = 0; o < out; ++o)
      err = std::max(err, std::fabs(static_cast<double>(got[i * out + o]) - want[i * out + o]));
    worst = std::max(worst, mx > 0 ? err / mx : (err > 0 ? INFINITY : 0.0));
  }
  return worst;
}

struct Problem {
  int64_t E, out, in;
  std::vector<int64_t> off;  // routed rows per expert
  std::vector<HostWeight> w1, w2;
  std::vector<float> x;     // token rows
  std::vector<int64_t> rows_of;  // routed row i = token row rows_of[i]
};

Problem problem(int64_t out, int64_t in, const std::vector<int64_t>& rows, uint64_t seed) {
  Problem p;
  p.E = static_cast<int64_t>(rows.size());
  p.out = out;
  p.in = in;
  p.off.assign(p.E + 1, 0);
  for (int64_t e = 0; e < p.E; ++e) p.off[e + 1] = p.off[e] + rows[e];
  for (int64_t e = 0; e < p.E; ++e) {
    p.w1.push_back(parity::make_weight(WeightFormat::kFp4Rows, out, in, seed + 2 * e));
    p.w2.push_back(parity::make_weight(WeightFormat::kFp4Rows, out, in, seed + 2 * e + 1));
  }
  const int64_t m = p.off[p.E], tokens = m + 3;
  p.x = mixed_rows(tokens, in, seed + 999);
  p.rows_of.resize(m);
  for (int64_t i = 0; i < m; ++i) p.rows_of[i] = (i * 7 + 2) % tokens;  // out of order, some tokens twice
  return p;
}

// The CPU op over each expert's routed rows.
std::vector<float> cpu_ref(const Problem& p, const std::vector<HostWeight>& w) {
  backends::cpu::CpuBackend cpu(&parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
  const int64_t m = p.off[p.E];
  std::vector<float> xr(static_cast<size_t>(m * p.in)), want(static_cast<size_t>(m * p.out));
  for (int64_t i = 0; i < m; ++i)
    std::copy_n(p.x.begin() + p.rows_of[i] * p.in, p.in, xr.begin() + i * p.in);
  for (int64_t e = 0; e < p.E; ++e)
    if (p.off[e + 1] > p.off[e])
      cpu.linear(parity::host_ref(w[e], w[e].data.data(), w[e].scale.data()), xr.data() + p.off[e] * p.in,
                 p.off[e + 1] - p.off[e], want.data() + p.off[e] * p.out);
  return want;
}

// p with every routed row alone in a unit (offsets of one row per "expert" slot are not expressible, so:
// each expert's rows cut into single-row experts that point at the same w1 weights).
Problem one_row_experts(const Problem& p) {
  Problem q = p;
  q.w1.clear();
  q.off.assign(1, 0);
  for (int64_t e = 0; e < p.E; ++e)
    for (int64_t i = p.off[e]; i < p.off[e + 1]; ++i) {
      q.w1.push_back(p.w1[e]);
      q.off.push_back(q.off.back() + 1);
    }
  q.E = static_cast<int64_t>(q.w1.size());
  return q;
}

// One run: the split, the units, the GEMM (a pair when w2list is set). y / y2 sized m_pad rows.
struct GemmOut {
  std::vector<float> y, y2;
};
GemmOut run_gemm(const Problem& p, const DevWeightList& w1, const DevWeightList* w2, const std::vector<int64_t>& off,
        int64_t m_pad, int n_parts = 3, ExpertGemmForm form = ExpertGemmForm::kMma) {
  const int64_t m = off[p.E];
  std::vector<ExpertGemmUnit> units(static_cast<size_t>(expert_gemm_max_units(m, p.E)));
  const int64_t n =
      expert_gemm_units(off.data(), p.E, units.data(), n_parts == 1 ? kExpertGemmRows1 : kExpertGemmRows);
  units.resize(static_cast<size_t>(n));
  Dev<ExpertGemmUnit> du(units);
  Dev<float> dx(p.x);
  Dev<int64_t> drows(p.rows_of);
  Dev<uint2> parts(static_cast<size_t>(expert_gemm_parts_bytes(m, p.in, n_parts) / 8));
  Dev<int32_t> ex(static_cast<size_t>(m));
  Dev<float> y(static_cast<size_t>(m_pad * p.out)), y2(static_cast<size_t>(m_pad * p.out));
  cudaMemset(y.p, 0xff, y.n * sizeof(float));  // NaN sentinel
  cudaMemset(y2.p, 0xff, y2.n * sizeof(float));
  Status s = run_expert_gemm_split(dx.p, p.in, drows.p, m, parts.p, ex.p, nullptr, n_parts, form);
  EXPECT_TRUE(s.ok()) << s.message();
  s = run_expert_gemm_fp4(w1.p(), w2 ? w2->p() : nullptr, du.p, n, p.out, p.in, parts.p, ex.p, y.p,
                          w2 ? y2.p : nullptr, nullptr, n_parts, form);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return GemmOut{y.get(), y2.get()};
}

// Entries of both outputs past the first m rows that a run wrote (their NaN sentinel changed).
size_t written_past_units(const GemmOut& o, int64_t m, int64_t out) {
  size_t n = 0;
  for (size_t i = static_cast<size_t>(m * out); i < o.y.size(); ++i)
    n += parity::bits_of(o.y[i]) != 0xffffffffu || parity::bits_of(o.y2[i]) != 0xffffffffu;
  return n;
}

// The first matrix with every routed row alone in a unit of one (row-count invariance's other side).
GemmOut rows_alone(const Problem& p, int64_t m_pad, int n_parts = 3, ExpertGemmForm form = ExpertGemmForm::kMma) {
  const Problem q = one_row_experts(p);
  DevWeightList wq(q.w1);
  return run_gemm(q, wq, nullptr, q.off, m_pad, n_parts, form);
}

TEST(ExpertGemmParity, MatchesTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t out, in;
    std::vector<int64_t> rows;
  };
  const std::vector<Case> cases = {
      {200, 256, {0, 1, 31, 32, 33, 70}},  // 2 K steps (< stages), a partial second row block
      {136, 640, {5, 0, 64, 2}},           // 5 K steps, 8 rows in the second block
  };
  uint64_t seed = 41000;
  for (const Case& c : cases) {
    const Problem p = problem(c.out, c.in, c.rows, seed += 100);
    const int64_t m = p.off[p.E], m_pad = m + 4;
    DevWeightList w1(p.w1), w2(p.w2);
    const GemmOut pair = run_gemm(p, w1, &w2, p.off, m_pad);
    const GemmOut single1 = run_gemm(p, w1, nullptr, p.off, m_pad);
    const GemmOut single2 = run_gemm(p, w2, nullptr, p.off, m_pad);
    const std::string shape = "fp4 " + parity::dims({c.out, c.in}) + " E=" + std::to_string(p.E) +
                              " m=" + std::to_string(m);
    // The 8-warp layout (DS41_TC_FP4_GEMM_WARPS8): the same operations per output, so the same bits.
    set_expert_gemm_warps8_for_tests(1);
    const GemmOut pair8 = run_gemm(p, w1, &w2, p.off, m_pad);
    set_expert_gemm_warps8_for_tests(-1);
    EXPECT_EQ(parity::count_bit_diffs(pair8.y, pair.y), 0u) << shape << ": 8 warps, first matrix";
    EXPECT_EQ(parity::count_bit_diffs(pair8.y2, pair.y2), 0u) << shape << ": 8 warps, second matrix";
    std::vector<float> g1(pair.y.begin(), pair.y.begin() + m * c.out), g2(pair.y2.begin(), pair.y2.begin() + m * c.out);
    const double err1 = worst_row_error(g1, cpu_ref(p, p.w1), m, c.out);
    parity::report("expert gemm", shape + " w1", err1, kTol, kWhy);
    EXPECT_LE(err1, kTol) << shape;
    EXPECT_LE(worst_row_error(g2, cpu_ref(p, p.w2), m, c.out), kTol) << shape;
    EXPECT_EQ(parity::count_bit_diffs(pair.y, single1.y), 0u) << shape << ": the pair's first matrix";
    EXPECT_EQ(parity::count_bit_diffs(pair.y2, single2.y), 0u) << shape << ": the pair's second matrix";
    EXPECT_EQ(written_past_units(pair, m, c.out), 0u) << shape << ": rows past the units were written";
    // Row-count invariance: every routed row alone in its own unit.
    const Problem q = one_row_experts(p);
    if (q.E == 0) continue;
    DevWeightList wq(q.w1);
    const GemmOut alone = run_gemm(q, wq, nullptr, q.off, m_pad);
    EXPECT_EQ(parity::count_bit_diffs(alone.y, single1.y), 0u) << shape << ": a row alone vs in full units";
  }
}

// The step fold (DS41_TC_FP4_GEMM_FOLD): a step's four tiles of a row as one mma chain when every row of the
// warp has the step's scale bytes within 15 of their least. Scales chosen per W row block of 32 (a warp's rows):
// rows 0..31 hold one row (5) whose every step spans 16 (the warp's vote sends all 32 rows to the per-tile
// products: their bits are the unfolded kernel's), rows 32..63 one row (40) spanning exactly 15 (folded at the
// bound: factors up to 2^15), rows 64..95 scales anywhere in the window (mostly wide steps), rows 96..127
// [100, 115] (always folded), the rest as made ([120, 126]).
TEST(ExpertGemmParity, StepFoldMatchesTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  Problem p = problem(200, 640, {0, 33, 1, 70}, 43000);
  const int64_t m = p.off[p.E], m_pad = m + 4, tiles = p.in / 32;
  parity::Rng r(43999);
  auto pick = [&](int lo, int hi) { return static_cast<uint8_t>(lo + static_cast<int>(r.next() % (hi - lo + 1))); };
  for (std::vector<HostWeight>* list : {&p.w1, &p.w2})
    for (HostWeight& w : *list)
      for (int64_t o = 0; o < p.out; ++o)
        for (int64_t t = 0; t < tiles; ++t) {
          uint8_t& sb = w.scale[static_cast<size_t>(o * tiles + t)];
          const int64_t j = t % 4;
          if (o == 5) sb = j == 0 ? 110 : j == 1 ? 126 : pick(110, 126);
          else if (o == 40) sb = j == 0 ? 111 : j == 1 ? 126 : pick(111, 126);
          else if (o >= 64 && o < 96) sb = pick(64, 191);
          else if (o >= 96 && o < 128) sb = pick(100, 115);
        }
  DevWeightList w1(p.w1), w2(p.w2);
  set_expert_gemm_fold_for_tests(0);
  const GemmOut plain = run_gemm(p, w1, &w2, p.off, m_pad);
  set_expert_gemm_fold_for_tests(1);
  const GemmOut fold = run_gemm(p, w1, &w2, p.off, m_pad);
  const GemmOut fold_single = run_gemm(p, w1, nullptr, p.off, m_pad);
  set_expert_gemm_warps8_for_tests(1);
  const GemmOut fold8 = run_gemm(p, w1, &w2, p.off, m_pad);
  // The column tiles in groups (DS41_TC_FP4_GEMM_CG, the default 2; units of 1, 6 and 32 rows: groups past the
  // unit's columns multiply stale fragments into accumulators nobody reads) and tile by tile (1): the same bits.
  std::vector<std::pair<int, GemmOut>> grouped;
  set_expert_gemm_group_for_tests(3);
  grouped.emplace_back(8 * 100 + 3, run_gemm(p, w1, &w2, p.off, m_pad));
  set_expert_gemm_warps8_for_tests(-1);
  for (int tiles : {1, 3, 4}) {
    set_expert_gemm_group_for_tests(tiles);
    grouped.emplace_back(4 * 100 + tiles, run_gemm(p, w1, &w2, p.off, m_pad));
  }
  set_expert_gemm_group_for_tests(0);
  const std::string shape = "fp4 " + parity::dims({p.out, p.in}) + " E=" + std::to_string(p.E) + " m=" +
                            std::to_string(m) + " step fold";
  std::vector<float> g1(fold.y.begin(), fold.y.begin() + m * p.out), g2(fold.y2.begin(), fold.y2.begin() + m * p.out);
  const double err1 = worst_row_error(g1, cpu_ref(p, p.w1), m, p.out);
  parity::report("expert gemm", shape + " w1", err1, kTol, kWhy);
  EXPECT_LE(err1, kTol) << shape;
  EXPECT_LE(worst_row_error(g2, cpu_ref(p, p.w2), m, p.out), kTol) << shape;
  EXPECT_EQ(parity::count_bit_diffs(fold8.y, fold.y), 0u) << shape << ": 8 warps, first matrix";
  EXPECT_EQ(parity::count_bit_diffs(fold8.y2, fold.y2), 0u) << shape << ": 8 warps, second matrix";
  EXPECT_EQ(parity::count_bit_diffs(fold_single.y, fold.y), 0u) << shape << ": the pair's first matrix";
  for (const auto& [layout, out] : grouped) {
    EXPECT_EQ(parity::count_bit_diffs(out.y, fold.y), 0u) << shape << ": " << layout / 100 << " warps, groups of "
                                                          << layout % 100 << " tiles, first matrix";
    EXPECT_EQ(parity::count_bit_diffs(out.y2, fold.y2), 0u) << shape << ": " << layout / 100 << " warps, groups of "
                                                            << layout % 100 << " tiles, second matrix";
  }
  // Rows 0..31: the warp's vote took the per-tile products (the unfolded bits); rows 32..63 and 96..127 folded
  // (the terms summed in another order: some outputs' bits differ).
  size_t same_wide = 0, wide = 0, differ_folded = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < p.out; ++o) {
      const size_t q = static_cast<size_t>(i * p.out + o);
      if (o < 32) {
        ++wide;
        same_wide += parity::bits_of(fold.y[q]) == parity::bits_of(plain.y[q]);
      } else if ((o >= 32 && o < 64) || (o >= 96 && o < 128)) {
        differ_folded += parity::bits_of(fold.y[q]) != parity::bits_of(plain.y[q]);
      }
    }
  EXPECT_EQ(same_wide, wide) << shape << ": a warp with a row spanning 16 must take the per-tile products";
  EXPECT_GT(differ_folded, 0u) << shape << ": the folded rows gave the per-tile bits everywhere (fold not taken?)";
  // Row-count invariance under the fold: every routed row alone in a unit of one.
  const GemmOut alone = rows_alone(p, m_pad);
  set_expert_gemm_fold_for_tests(-1);
  EXPECT_EQ(parity::count_bit_diffs(alone.y, fold_single.y), 0u) << shape << ": a row alone vs in full units";
}

// --numerics fp8-act: routed rows quantized as quant::act_quant_fp8_rows (E4M3 values times powers of two) take
// one f16 part (n_parts 1, units of kExpertGemmRows1 = 96 rows: experts of 0, 1, 95, 96, 97 and 150 rows). The
// parts a three-part split would add are zero for every element down to 2^-35 of its row's largest, so such
// rows get the three parts' bits; every row (the 40-decade ones too) within the CPU op's tolerance; pair, fold
// on and off, row-count invariance, rows past the units unwritten.
TEST(ExpertGemmParity, OnePartOnQuantizedRowsKeepsTheThreePartsBits) {
  DS41_SKIP_WITHOUT_GPU();
  for (int64_t in : {256, 640}) {
    Problem p = problem(200, in, {0, 1, 95, 96, 97, 150}, 47000 + in);
    quant::act_quant_fp8_rows(p.x.data(), static_cast<int64_t>(p.x.size()) / in, in, p.x.data());
    const int64_t m = p.off[p.E], m_pad = m + 4;
    DevWeightList w1(p.w1), w2(p.w2);
    const std::string shape = "fp4 " + parity::dims({p.out, in}) + " E=" + std::to_string(p.E) + " m=" +
                              std::to_string(m) + " one part, quantized rows";
    for (int fold : {1, 0}) {
      set_expert_gemm_fold_for_tests(fold);
      const GemmOut three = run_gemm(p, w1, &w2, p.off, m_pad, 3);
      const GemmOut one = run_gemm(p, w1, &w2, p.off, m_pad, 1);
      const GemmOut one_single = run_gemm(p, w1, nullptr, p.off, m_pad, 1);
      // Rows spanning less than 2^30 (kinds plain, x 1e20, x 1e-15, zeros): the three parts' bits.
      size_t diffs = 0, compared = 0;
      for (int64_t i = 0; i < m; ++i) {
        const float* xr = p.x.data() + p.rows_of[i] * in;
        float mx = 0, mn = INFINITY;
        for (int64_t k = 0; k < in; ++k)
          if (xr[k] != 0.f) mx = std::max(mx, std::fabs(xr[k])), mn = std::min(mn, std::fabs(xr[k]));
        if (mx > 0 && mx / mn >= 0x1p30f) continue;
        for (int64_t o = 0; o < p.out; ++o) {
          const size_t q = static_cast<size_t>(i * p.out + o);
          diffs += parity::bits_of(one.y[q]) != parity::bits_of(three.y[q]);
          diffs += parity::bits_of(one.y2[q]) != parity::bits_of(three.y2[q]);
          compared += 2;
        }
      }
      EXPECT_GT(compared, static_cast<size_t>(m * p.out));  // most rows
      EXPECT_EQ(diffs, 0u) << shape << " fold " << fold << ": one part vs three";
      EXPECT_EQ(parity::count_bit_diffs(one_single.y, one.y), 0u) << shape << ": the pair's first matrix";
      std::vector<float> g1(one.y.begin(), one.y.begin() + m * p.out), g2(one.y2.begin(), one.y2.begin() + m * p.out);
      const double err = std::max(worst_row_error(g1, cpu_ref(p, p.w1), m, p.out),
                                  worst_row_error(g2, cpu_ref(p, p.w2), m, p.out));
      parity::report("expert gemm", shape + (fold ? " folded" : ""), err, kTol, kWhy);
      EXPECT_LE(err, kTol) << shape;
      EXPECT_EQ(written_past_units(one, m, p.out), 0u) << shape << ": rows past the units were written";
      const GemmOut alone = rows_alone(p, m_pad, 1);
      EXPECT_EQ(parity::count_bit_diffs(alone.y, one_single.y), 0u) << shape << ": a row alone vs in full units";
    }
    set_expert_gemm_fold_for_tests(-1);
  }
}

TEST(ExpertGemmParity, ScaleCheckCountsBytesOutsideTheWindow) {
  DS41_SKIP_WITHOUT_GPU();
  std::vector<HostWeight> w;
  for (int e = 0; e < 3; ++e) w.push_back(parity::make_weight(WeightFormat::kFp4Rows, 40, 128, 42000 + e));
  int32_t wide = -1;  // the last call's count of (row, step)s spanning more than 15
  auto count = [&](const std::vector<HostWeight>& list) {
    DevWeightList d(list);
    Dev<int32_t> c(std::vector<int32_t>{0, 0});
    Status s = run_fp4_scales_outside_window(d.p(), static_cast<int64_t>(list.size()), 40, 128, c.p, nullptr, c.p + 1);
    EXPECT_TRUE(s.ok()) << s.message();
    const std::vector<int32_t> got = c.get();
    wide = got[1];
    return got[0];
  };
  EXPECT_EQ(count(w), 0);
  EXPECT_EQ(wide, 0);
  w[1].scale[7] = 63;   // just under the window
  w[2].scale[0] = 192;  // just over it
  w[2].scale[159] = 255;  // NaN
  EXPECT_EQ(count(w), 3);
  w[1].scale[7] = 64;
  w[2].scale[0] = 191;
  w[2].scale[159] = 120;
  EXPECT_EQ(count(w), 0);
  EXPECT_EQ(wide, 2) << "the window's bounds 64 and 191 beside bytes of 120..126 span more than 15";
  w[1].scale[7] = 122;
  w[2].scale[0] = 122;
  EXPECT_EQ(count(w), 0);
  EXPECT_EQ(wide, 0);
  // Row 3 of expert 0 (its one step: bytes 12..15) spanning 15, then 16; row 9 of expert 2 spanning 40.
  for (int i = 0; i < 4; ++i) w[0].scale[12 + i] = 100;
  w[0].scale[13] = 115;
  EXPECT_EQ(count(w), 0);
  EXPECT_EQ(wide, 0) << "a step spanning 15 folds";
  w[0].scale[13] = 116;
  for (int i = 0; i < 4; ++i) w[2].scale[36 + i] = static_cast<uint8_t>(80 + 40 * (i & 1));
  EXPECT_EQ(count(w), 0);
  EXPECT_EQ(wide, 2) << "steps spanning 16 and 40";
  // Without the wide counter: the window count alone (the mma form's callers).
  DevWeightList d(w);
  Dev<int32_t> c(std::vector<int32_t>{0});
  EXPECT_TRUE(run_fp4_scales_outside_window(d.p(), 3, 40, 128, c.p, nullptr).ok());
  EXPECT_EQ(c.get()[0], 0);
}

// The wgmma form (DS41_TC_FP4_GEMM_WGMMA: Hopper's warpgroup MMA, the folded numerics) against the CPU op and the
// folded mma form: units of 1-33 rows (N = 32 / 64 / 96 columns), output widths past the block, 2 and 5 K steps,
// three parts and one (quantized rows, units of 96), a pair, and on a device the released shapes (w1 | w3
// 2304 x 5120 and w2 5120 x 2304, experts of 0-97 rows). Every row within the CPU op's tolerance; the pair's
// matrices the single launches' bits; a routed row alone in a unit of one the same bits as in full units;
// rows past the units unwritten; bits differing from the mma form reported (0 required on the host emulator,
// whose wgmma sums as its mma.sync).
TEST(ExpertGemmParity, WgmmaFormMatchesTheMmaForm) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() { set_expert_gemm_wgmma_for_tests(-1); }
  } reset;
  set_expert_gemm_wgmma_for_tests(1);
  if (!expert_gemm_wgmma()) GTEST_SKIP() << "the wgmma form needs a compute capability 9.0 device";
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    int64_t out, in;
    std::vector<int64_t> rows;
    int parts;
  };
  std::vector<Case> cases = {
      {200, 256, {0, 1, 10, 11, 21, 22, 32, 33, 70}, 3},  // N 32 (1-10 rows), 64 (11-21), 96; 2 K steps
      {136, 640, {5, 0, 64, 2}, 3},                        // 5 K steps, 8 rows in the second block
      {200, 640, {0, 1, 32, 33, 64, 95, 96, 97, 150}, 1},  // one part: N 32 / 64 / 96 at 1-32 / 33-64 / 65-96 rows
  };
  if (!emu) {
    cases.push_back({2304, 5120, {0, 1, 17, 32, 40, 64, 3, 96}, 3});  // the released w1 | w3
    cases.push_back({5120, 2304, {2, 0, 31, 33, 96, 7}, 3});          // the released w2
    cases.push_back({2304, 5120, {0, 1, 95, 96, 97, 40}, 1});
  }
  uint64_t seed = 48000;
  for (const Case& c : cases) {
    Problem p = problem(c.out, c.in, c.rows, seed += 100);
    if (c.parts == 1) quant::act_quant_fp8_rows(p.x.data(), static_cast<int64_t>(p.x.size()) / c.in, c.in, p.x.data());
    const int64_t m = p.off[p.E], m_pad = m + 4;
    DevWeightList w1(p.w1), w2(p.w2);
    const std::string shape = "fp4 " + parity::dims({c.out, c.in}) + " E=" + std::to_string(p.E) + " m=" +
                              std::to_string(m) + (c.parts == 1 ? " one part" : "") + " wgmma";
    const GemmOut mma = run_gemm(p, w1, &w2, p.off, m_pad, c.parts, ExpertGemmForm::kMma);
    const GemmOut pair = run_gemm(p, w1, &w2, p.off, m_pad, c.parts, ExpertGemmForm::kWgmma);
    const GemmOut single1 = run_gemm(p, w1, nullptr, p.off, m_pad, c.parts, ExpertGemmForm::kWgmma);
    const GemmOut single2 = run_gemm(p, w2, nullptr, p.off, m_pad, c.parts, ExpertGemmForm::kWgmma);
    std::vector<float> g1(pair.y.begin(), pair.y.begin() + m * c.out), g2(pair.y2.begin(), pair.y2.begin() + m * c.out);
    const double err = std::max(worst_row_error(g1, cpu_ref(p, p.w1), m, c.out),
                                worst_row_error(g2, cpu_ref(p, p.w2), m, c.out));
    parity::report("expert gemm", shape, err, kTol, kWhy);
    EXPECT_LE(err, kTol) << shape;
    const size_t differ = parity::count_bit_diffs(pair.y, mma.y) + parity::count_bit_diffs(pair.y2, mma.y2);
    parity::report("expert gemm", shape + " vs the mma form: bits differing", static_cast<double>(differ),
                   emu ? 0.0 : static_cast<double>(2 * m * c.out),
                   "the same terms and order; equal where wgmma sums a k16 slice as mma.sync");
    if (emu) EXPECT_EQ(differ, 0u) << shape << ": the emulator's wgmma sums as its mma.sync";
    EXPECT_EQ(parity::count_bit_diffs(pair.y, single1.y), 0u) << shape << ": the pair's first matrix";
    EXPECT_EQ(parity::count_bit_diffs(pair.y2, single2.y), 0u) << shape << ": the pair's second matrix";
    EXPECT_EQ(written_past_units(pair, m, c.out), 0u) << shape << ": rows past the units were written";
    const GemmOut alone = rows_alone(p, m_pad, c.parts, ExpertGemmForm::kWgmma);
    EXPECT_EQ(parity::count_bit_diffs(alone.y, single1.y), 0u) << shape << ": a row alone (N = 32) vs in full units";
  }
}

TEST(ExpertGemmParity, RefusesShapesItCannotRun) {
  DS41_SKIP_WITHOUT_GPU();
  EXPECT_FALSE(expert_gemm_supported(64, 96));  // K not a multiple of 128
  EXPECT_FALSE(expert_gemm_supported(0, 128));
  EXPECT_TRUE(expert_gemm_supported(1, 128));
  const Status s = run_expert_gemm_fp4(nullptr, nullptr, nullptr, 1, 64, 96, nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("128"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ds41::cuda
