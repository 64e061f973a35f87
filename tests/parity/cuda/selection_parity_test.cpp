// Parity of the selection launchers (backends/cuda/topk_kernels.h) with the CPU reference, bit for
// bit: top-k index sets in the house tie order (ties from ReLU zeros and small value sets, -0 vs +0,
// +inf picks, rows with fewer than k selectable scores, rows of -inf only), k = 512 and 2048, rows
// up to 2^20 + 3 scores; the candidate pool past 2048 blocks of 8 (t > 16,384) with the forced
// newest block and block-score ties; the candidate-mask restriction. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/argmax_kernels.h"
#include "backends/cuda/topk_kernels.h"
#include "model/dspark.h"
#include "parity/cuda/kc_parity_util.h"

namespace ds41::cuda {
namespace {

using namespace kc_test;

enum class Gen { kGauss, kTies, kSparse, kSpecial, kIndexerLike, kBandTies, kUlpBand };

const char* gen_name(Gen g) {
  switch (g) {
    case Gen::kGauss: return "gauss";
    case Gen::kTies: return "ties";
    case Gen::kSparse: return "sparse";
    case Gen::kSpecial: return "special";
    case Gen::kIndexerLike: return "indexer-like";
    case Gen::kBandTies: return "band-ties";
    case Gen::kUlpBand: return "ulp-band";
  }
  return "?";
}

// Scores of one row. kTies: 70% zeros (ReLU; +0 and -0 mixed, equal for the tie order), the rest
// from 6 values; kSparse: mostly -inf, about 1 in 300 finite; kSpecial: ties, +-0, +inf, -inf,
// subnormals; kIndexerLike: -inf past a visible prefix, ReLU zeros and gaussian tails; kBandTies:
// half the row from 64 values of one 11-bit key bin, the rest below; kUlpBand: every score within
// 4,096 ulps of 1 (one 11-bit bin; the k-th best decided in the key's lowest bits).
void fill_row(Gen g, std::mt19937& rng, float* x, int64_t t, int64_t row) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float vals[6] = {0.5f, 1.0f, 1.5f, 2.0f, -1.0f, 3.0f};
  const int64_t visible = t - static_cast<int64_t>(rng() % (t / 3 + 1));
  for (int64_t i = 0; i < t; ++i) {
    float v = 0.0f;
    switch (g) {
      case Gen::kGauss: v = nd(rng); break;
      case Gen::kTies: v = (rng() % 10 < 7) ? ((rng() & 1) ? 0.0f : -0.0f) : vals[rng() % 6]; break;
      case Gen::kSparse: v = (rng() % 300 == 0) ? nd(rng) : -INFINITY; break;
      case Gen::kSpecial: {
        const uint32_t k = rng() % 12;
        v = k == 0   ? -0.0f
            : k == 1 ? 0.0f
            : k == 2 ? INFINITY
            : k == 3 ? -INFINITY
            : k == 4 ? 1e-45f * static_cast<float>(rng() % 4)
            : k == 5 ? -1e-45f
                     : vals[rng() % 6];
        if (k == 2 && rng() % 50) v = 2.0f;  // keep +inf rare enough that k is not all +inf
        break;
      }
      case Gen::kBandTies:  // half the row in [1, 1.25) (one first-digit bin of the wide select) from
                            // 64 values, so the k-th best is decided among ties inside that bin
        v = (rng() & 1) ? 1.0f + static_cast<float>(rng() % 64) / 256.0f : std::min(0.9f, nd(rng) - 1.0f);
        break;
      case Gen::kUlpBand:  // 1 + (0..4095) ulps: one 11-bit key bin, the k-th decided in the low key bits
        v = 1.0f + static_cast<float>(rng() % 4096) * 0x1p-23f;
        break;
      case Gen::kIndexerLike:
        v = i >= visible ? -INFINITY : std::max(0.0f, nd(rng)) * (rng() % 4 == 0 ? 0.0f : 1.0f);
        break;
    }
    x[i] = v;
  }
  if (row % 5 == 4)  // an all -inf row
    for (int64_t i = 0; i < t; ++i) x[i] = -INFINITY;
}

struct TopkCase {
  int64_t n, t, k;
  Gen gen;
};

// One top-k case against the CPU op with each select (the wide one, then the four passes) and each emit
// (select_emit's chunks, then select_emit_runs' one barrier): the rows generated and the CPU's sets computed
// once, one report line and one assertion per select and emit.
void check_topk_both_selects(backends::cpu::CpuBackend& cpu, const TopkCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> sc(c.n * c.t);
  for (int64_t r = 0; r < c.n; ++r) fill_row(c.gen, rng, &sc[r * c.t], c.t, r);
  std::vector<int32_t> want(c.n * c.k);
  cpu.topk_rows(sc.data(), c.n, c.t, c.k, want.data());
  auto dsc = upload(sc);
  for (int mode : {4, 5, 2, 0, 3, 1}) {  // 4 / 5: the register select at 256 / 512 threads; else bit 1: wide
                                         // select, bit 0: one-barrier emit
    const int wide = (mode >> 1) & 1, runs = mode & 1, reg = mode == 4 ? 1 : (mode == 5 ? 2 : 0);
    set_topk_reg_for_tests(reg);
    set_topk_wide_for_tests(wide);
    set_topk_emit_runs_for_tests(runs);
    DevBuf<int32_t> dout(want.size());
    DevBuf<uint8_t> ws(topk_workspace_bytes(c.n, c.t, c.k));
    ASSERT_TRUE(dsc->p && dout.p && ws.p);
    KC_OK(run_topk_rows(dsc->p, c.n, c.t, c.k, dout.p, ws.p, nullptr));
    auto got = from_dev(dout.p, want.size());
    int64_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
    static const char* const kNames[6] = {"topk_rows (four-pass select)",
                                          "topk_rows (four-pass select, one-barrier emit)",
                                          "topk_rows (wide select)", "topk_rows (wide select, one-barrier emit)",
                                          "topk_rows (register select; radix past 10,240 scores)",
                                          "topk_rows (register select, 512 threads; radix past 10,240 scores)"};
    report(kNames[mode],
           std::string(gen_name(c.gen)) + " n=" + std::to_string(c.n) + " t=" + std::to_string(c.t) +
               " k=" + std::to_string(c.k),
           static_cast<double>(bad), 0, "index sets in the tie order: exact");
    EXPECT_EQ(bad, 0) << gen_name(c.gen) << " n=" << c.n << " t=" << c.t << " k=" << c.k << " wide=" << wide
                      << " runs=" << runs << " reg=" << reg;
  }
  set_topk_reg_for_tests(-1);
  set_topk_wide_for_tests(-1);
  set_topk_emit_runs_for_tests(-1);
}

TEST(SelectionParity, TopkRows) {
  KC_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(nullptr);
  const TopkCase cases[] = {
      {6, 40000, 512, Gen::kGauss},
      {6, 33000, 512, Gen::kTies},
      {6, 70000, 512, Gen::kSparse},
      {6, 20000, 512, Gen::kSpecial},
      {10, 32768, 512, Gen::kIndexerLike},  // released index top-512
      {5, 20000, 2048, Gen::kTies},         // candidate-pool width
      {5, 2500, 2048, Gen::kIndexerLike},
      {2, (1 << 20) + 3, 512, Gen::kIndexerLike},
      {9, 300, 512, Gen::kGauss},  // t < k: every selectable entry
      {7, 777, 1, Gen::kTies},
      {3, 1, 4, Gen::kGauss},
      {6, 3000, 2048, Gen::kTies},     // the k-th score is a zero: +-0 ties by index
      {6, 2000, 1500, Gen::kSpecial},  // the k-th among +-0 / subnormals
      {4, 9000, 512, Gen::kTies},      // cached in shared memory with 1024 threads (8192 <= t <= 10240)
      // Two launches (chunks' k best, then the k best of the candidates): decode-sized calls of long
      // rows, up to the released 128K context's ratio-1 scores; ties across chunk borders, +-0,
      // NaN / inf, all -inf rows, rows with fewer than k selectable entries (sparse, indexer-like).
      {1, 131073, 512, Gen::kTies},
      {3, 131073, 512, Gen::kIndexerLike},
      {5, 65537, 512, Gen::kSpecial},
      {2, 12289, 512, Gen::kSparse},
      {64, 16385, 512, Gen::kTies},  // the most rows the chunked path takes
      {65, 16385, 512, Gen::kGauss},  // one more: one launch
      {3, 40000, 2048, Gen::kTies},   // k = 2048: 5 chunks
  };
  for (const TopkCase& c : cases)
    check_topk_both_selects(cpu, c, static_cast<uint32_t>(c.t * 3 + c.k + static_cast<int>(c.gen)));
}

// The wide select (radix_select.cuh: 11 bits over the row, the chosen bin's keys copied, 11 + 10 bits
// over them) against the CPU op, bit for bit, on the shapes of its branches and of decode steps: the
// chosen bin resolved in shared memory with ties at the k-th key (band-ties at t <= 4096: about t / 2
// keys in the bin), the fallback (band-ties at t = 9000: more than 2048 keys in the bin; ties:
// the zeros), the k-th key decided in its lowest bits (ulp-band) on both branches, take-all rows (all
// -inf, sparse, t < k), 256 and 1024 threads (t >= 8192), the global
// (uncached) row of a wide call, the two-launch path; and the decode shapes of the slice (t = 2048 and
// 4096 at k = 512). Small enough for the host emulator.
TEST(SelectionParity, TopkWideSelect) {
  KC_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(nullptr);
  const TopkCase cases[] = {
      {5, 3800, 512, Gen::kBandTies},    // ~1,900 keys in the chosen bin: resolved in shared memory
      {5, 2000, 512, Gen::kBandTies},    {5, 9000, 512, Gen::kBandTies},  // ~4,500: the fallback
      {5, 4096, 512, Gen::kIndexerLike}, {5, 2048, 512, Gen::kGauss},     {5, 3000, 2048, Gen::kTies},
      {5, 700, 512, Gen::kSparse},       {5, 300, 512, Gen::kGauss},      {5, 2500, 600, Gen::kSpecial},
      {2, 8500, 512, Gen::kGauss},       // 1024 threads
      {2, 10300, 16, Gen::kGauss},       // past the cached size, one launch: the row read from global memory
      {1, 12000, 4, Gen::kBandTies},     // the same with the fallback
      {2, 12289, 512, Gen::kBandTies},   // two launches: chunks resolved in shared memory, the merge falls back
      {3, 1500, 512, Gen::kUlpBand},     // bits 9..0 decide, in shared memory
      {3, 6000, 512, Gen::kUlpBand},     // bits 4..0 decide, in the fallback's last pass over the row
      // The register select's sizes (256 threads x 4, 8, 16, 24, 40 keys) at and past their edges.
      {3, 1024, 512, Gen::kTies},        {3, 1025, 512, Gen::kUlpBand},   {3, 6145, 512, Gen::kBandTies},
      {3, 10240, 512, Gen::kGauss},      {2, 10241, 512, Gen::kTies},
  };
  for (const TopkCase& c : cases)
    check_topk_both_selects(cpu, c, static_cast<uint32_t>(c.t * 5 + c.k + static_cast<int>(c.gen)));
}

// The multi-CTA greedy choice against model::argmax_lowest (the DSpark draft's c_k) bit for bit:
// vocabulary-wide rows (slices of 4096: the maximum in the first, a middle and the last slice, ties
// across slices), +-0 and small value-set ties, NaNs (a NaN first entry gives 0; NaNs never win),
// all -inf and all NaN rows, +inf, and rows shorter than one slice.
TEST(SelectionParity, ArgmaxRows) {
  KC_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t n, t;
    Gen gen;
    const char* twist;
  };
  const Case cases[] = {
      {8, 129280, Gen::kGauss, "vocab"},       {8, 129280, Gen::kTies, "vocab ties"},
      {6, 129280, Gen::kSpecial, "special"},   {5, 70000, Gen::kSparse, "sparse"},
      {6, 8193, Gen::kTies, "cross-slice tie"}, {6, 100, Gen::kGauss, "nan"},
      {4, 1, Gen::kGauss, "t=1"},              {6, 4097, Gen::kGauss, "last slice max"},
  };
  std::mt19937 rng(41);
  for (const Case& c : cases) {
    std::vector<float> x(c.n * c.t);
    for (int64_t r = 0; r < c.n; ++r) fill_row(c.gen, rng, &x[r * c.t], c.t, r);
    const std::string tw = c.twist;
    for (int64_t r = 0; r < c.n; ++r) {
      float* row = &x[r * c.t];
      if (tw == "cross-slice tie" && c.t > 8192) {  // the same maximum in slices 0 and 2 (+0 / -0 too)
        row[8190] = 7.0f;
        row[4000] = 7.0f;
        row[8192] = 7.0f;
      }
      if (tw == "nan") {
        if (r == 0) row[0] = NAN;                               // first entry NaN: 0
        if (r == 1) row[37] = NAN;                              // NaN elsewhere never wins
        if (r == 2) for (int64_t i = 0; i < c.t; ++i) row[i] = NAN;  // all NaN: 0
        if (r == 3) for (int64_t i = 0; i < c.t; ++i) row[i] = (i % 2) ? -0.0f : 0.0f;  // all zeros: 0
        if (r == 4) for (int64_t i = 1; i < c.t; ++i) row[i] = NAN;  // only the first is a number
      }
      if (tw == "last slice max") row[c.t - 1] = 1e30f;
      if (tw == "vocab" && r == 1) row[c.t - 1] = INFINITY;
    }
    std::vector<int32_t> want(c.n);
    for (int64_t r = 0; r < c.n; ++r)
      want[r] = model::argmax_lowest(std::span<const float>(&x[r * c.t], static_cast<size_t>(c.t)));
    auto dx = upload(x);
    DevBuf<int32_t> dout(static_cast<size_t>(c.n));
    DevBuf<uint8_t> ws(argmax_workspace_bytes(c.n, c.t));
    ASSERT_TRUE(dx->p && dout.p && ws.p);
    KC_OK(run_argmax_rows(dx->p, c.n, c.t, dout.p, ws.p, nullptr));
    const std::vector<int32_t> got = from_dev(dout.p, static_cast<size_t>(c.n));
    int64_t bad = 0;
    for (int64_t r = 0; r < c.n; ++r) bad += got[r] != want[r];
    report("argmax_rows", std::to_string(c.n) + "x" + std::to_string(c.t) + " " + gen_name(c.gen) + " " + tw,
           static_cast<double>(bad), 0.0, "an index choice: exact (model::argmax_lowest)");
    EXPECT_EQ(got, want) << c.twist;
    // The checked mode (a served greedy draw): engine::Sampler's refusals (NaN or +inf anywhere,
    // every entry -inf) as kArgmaxInvalidRow, else engine::argmax_token's index (src/engine/sampler.cpp).
    std::vector<int32_t> want_checked(c.n);
    for (int64_t r = 0; r < c.n; ++r) {
      const float* row = &x[r * c.t];
      bool bad = false, live = false;
      for (int64_t i = 0; i < c.t; ++i) {
        bad = bad || !(row[i] < INFINITY);
        live = live || row[i] > -INFINITY;
      }
      // engine::argmax_token: std::max_element, the first of equal maxima.
      want_checked[r] = (bad || !live) ? kArgmaxInvalidRow : static_cast<int32_t>(std::max_element(row, row + c.t) - row);
    }
    KC_OK(run_argmax_rows(dx->p, c.n, c.t, dout.p, ws.p, nullptr, true));
    const std::vector<int32_t> got_checked = from_dev(dout.p, static_cast<size_t>(c.n));
    int64_t bad_checked = 0;
    for (int64_t r = 0; r < c.n; ++r) bad_checked += got_checked[r] != want_checked[r];
    report("argmax_rows checked", std::to_string(c.n) + "x" + std::to_string(c.t) + " " + gen_name(c.gen) + " " + tw,
           static_cast<double>(bad_checked), 0.0, "the sampler's greedy draw and refusals: exact");
    EXPECT_EQ(got_checked, want_checked) << c.twist << " (checked)";
  }
  EXPECT_FALSE(run_argmax_rows(nullptr, 1, 0, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(run_argmax_rows(nullptr, -1, 10, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(run_argmax_rows(nullptr, 0, 10, nullptr, nullptr, nullptr).ok());
}

TEST(SelectionParity, CandidatePool) {
  KC_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(nullptr);
  struct Case {
    int64_t n, t, block, keep;
    Gen gen;
  };
  const Case cases[] = {
      {6, 20000, 8, 2048, Gen::kIndexerLike},  // 2500 blocks > 2048
      {4, 40003, 8, 2048, Gen::kTies},         // ragged last block
      {4, 17000, 8, 2048, Gen::kSparse},       // fewer finite blocks than keep
      {5, 1000, 8, 2048, Gen::kGauss},         // below the limit: every finite block
      {6, 5000, 8, 5, Gen::kTies},             // heavy block-score ties
      {3, 3000, 3, 100, Gen::kSpecial},
      // Past 12,288 scores in calls of <= 64 rows (the first three too) the block scores come from a
      // launch of their own: 128K keys with ties across its CTAs' borders.
      {2, 131073, 8, 2048, Gen::kTies},
      {3, 4097, 8, 2048, Gen::kIndexerLike},   // the slice's 4K decode: 513 blocks, all kept
      {3, 32769, 8, 2048, Gen::kIndexerLike},  // 32K: 4,097 blocks from launch 1, 2,048 kept
      {2, 81920, 8, 2048, Gen::kGauss},        // 10,240 blocks: the register select's largest
      {2, 81928, 8, 2048, Gen::kGauss},        // 10,241: the radix select
      {3, 2000, 8, 0, Gen::kGauss},            // keep 0: no block
  };
  for (const Case& c : cases) {
    std::mt19937 rng(static_cast<uint32_t>(c.t + c.keep));
    std::vector<float> sc(c.n * c.t);
    std::vector<int64_t> vis(c.n);
    for (int64_t r = 0; r < c.n; ++r) {
      fill_row(c.gen, rng, &sc[r * c.t], c.t, r);
      // visible: all, none, a block boundary, just past one, random.
      const int64_t choice = r % 5;
      vis[r] = choice == 0   ? c.t
               : choice == 1 ? 0
               : choice == 2 ? (c.t / 2) / c.block * c.block
               : choice == 3 ? (c.t / 3) / c.block * c.block + 1
                             : 1 + static_cast<int64_t>(rng() % c.t);
    }
    std::vector<uint8_t> want(c.n * c.t);
    cpu.candidate_pool(sc.data(), vis.data(), c.n, c.t, c.block, c.keep, want.data());
    auto dsc = upload(sc);
    auto dvis = upload(vis);
    for (int reg : {1, 2, 0}) {  // the register select at 256 / 512 threads (blocks <= 10,240), the radix select
      set_topk_reg_for_tests(reg);
      DevBuf<uint8_t> dmask(want.size());
      DevBuf<uint8_t> ws(candidate_pool_workspace_bytes(c.n, c.t, c.block, c.keep));
      ASSERT_TRUE(dsc->p && dvis->p && dmask.p && ws.p);
      ASSERT_EQ(cudaMemset(dmask.p, 0x77, want.size()), cudaSuccess);
      KC_OK(run_candidate_pool(dsc->p, dvis->p, c.n, c.t, c.block, c.keep, dmask.p, ws.p, nullptr));
      auto got = from_dev(dmask.p, want.size());
      int64_t bad = 0;
      for (size_t i = 0; i < want.size(); ++i) bad += got[i] != want[i];
      report(reg == 1 ? "candidate_pool (register select)"
             : reg == 2 ? "candidate_pool (register select, 512 threads)"
                        : "candidate_pool (radix select)",
             std::string(gen_name(c.gen)) + " n=" + std::to_string(c.n) + " t=" + std::to_string(c.t) +
                 " block=" + std::to_string(c.block) + " keep=" + std::to_string(c.keep),
             static_cast<double>(bad), 0, "mask bytes: exact");
      EXPECT_EQ(bad, 0) << gen_name(c.gen) << " t=" << c.t << " reg=" << reg;
    }
    set_topk_reg_for_tests(-1);
  }
}

TEST(SelectionParity, MaskRestrict) {
  KC_SKIP_WITHOUT_GPU();
  // The reference is the loop of model/attention_layer.cpp (index(), candidate_restricted).
  const int64_t n = 7, t = 20000, tc = 19000;
  std::mt19937 rng(5);
  std::vector<float> sc(n * t);
  std::vector<uint8_t> mask(n * tc);
  std::vector<int64_t> t_mask(n);
  for (int64_t r = 0; r < n; ++r) {
    fill_row(Gen::kIndexerLike, rng, &sc[r * t], t, r);
    for (int64_t j = 0; j < tc; ++j) mask[r * tc + j] = (rng() % 3) != 0;
    t_mask[r] = r == 0 ? 0 : r == 1 ? tc : static_cast<int64_t>(rng() % (tc + 1));
  }
  std::vector<float> want = sc;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < t; ++j)
      if (j >= t_mask[r] || !mask[r * tc + j]) want[r * t + j] = -INFINITY;
  auto dsc = upload(sc);
  auto dmask = upload(mask);
  auto dtm = upload(t_mask);
  ASSERT_TRUE(dsc->p && dmask->p && dtm->p);
  KC_OK(run_mask_restrict(dsc->p, n, t, dmask->p, tc, dtm->p, nullptr));
  auto got = from_dev(dsc->p, sc.size());
  const int64_t bad = bit_mismatches(got, want);
  report("mask_restrict", "n=7 t=20000 mask_stride=19000", static_cast<double>(bad), 0, "elementwise: exact");
  EXPECT_EQ(bad, 0);
}

TEST(SelectionParity, LaunchersRejectBadShapes) {
  EXPECT_FALSE(run_topk_rows(nullptr, 1, 10, -1, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(run_topk_rows(nullptr, 1, int64_t{1} << 32, 4, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(run_topk_rows(nullptr, 0, 10, 4, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(run_candidate_pool(nullptr, nullptr, 1, 10, 0, 4, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(run_mask_restrict(nullptr, -1, 10, nullptr, 10, nullptr, nullptr).ok());
  EXPECT_EQ(candidate_pool_workspace_bytes(2, 17, 8, 2048), 2u * 3u * sizeof(float));
}

}  // namespace
}  // namespace ds41::cuda
