// Parity of the CUDA linear kernels (backends/cuda/linear_kernels.h) with the CPU reference
// (ds41_backend_cpu): run_linear over F32 / BF16 / FP8-tile / FP4-row weights on the GEMV path
// (n <= 64, or fewer than 132 tiles) and the tiled path at the released widths, the scalar fallbacks (ragged
// widths, unaligned payloads), run_grouped_linear (the 8-group o-projection of MODEL_SPEC 3.4.8)
// and run_expert_linear over 384 FP4 experts (decode and prefill routing, the tiled expert path,
// empty experts, m_max above the routed rows). Argument validation runs without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/tc_gemv_kernels.h"
#include "kernel_parity_util.h"
#include "ops/weight_ref.h"

namespace ds41::cuda::parity {
namespace {

using quant::WeightFormat;

// Linear tolerance, relative to the largest |y|: both sides sum the same float32 products
// (bit-identical dequantized weights) in a different order (CPU: 8 sequential float lanes reduced
// in float64; GPU: per-lane fmaf chains + a shuffle tree), ~sqrt(K) * 2^-24 of the output scale for
// K <= 8192.
constexpr double kLinearTol = 1e-5;
const char* kLinearWhy = "fp32 sums of identical products in another order (K<=8192)";

const char* fmt_name(WeightFormat f) { return quant::weight_format_name(f); }

struct LinearCase {
  const char* what;
  WeightFormat format;
  int64_t out, in;
  std::vector<int64_t> ns;
  int misalign = 0;
};

TEST(LinearParity, Linear) {
  DS41_SKIP_WITHOUT_GPU();
  const std::vector<LinearCase> cases = {
      {"wq_a", WeightFormat::kFp8Tiles, 1280, 5120, {1, 4, 8, 64, 300}},
      {"wq_b", WeightFormat::kFp8Tiles, 32768, 1280, {1, 8, 64, 300}},
      {"wo_b", WeightFormat::kFp8Tiles, 5120, 8192, {1, 8, 300}},
      {"expert w1 (dense)", WeightFormat::kFp4Rows, 2304, 5120, {1, 8, 64, 300}},
      {"expert w2 (dense)", WeightFormat::kFp4Rows, 5120, 2304, {1, 8, 300}},
      {"head", WeightFormat::kBF16, 129280, 5120, {1, 8, 64}},
      {"gate", WeightFormat::kBF16, 384, 5120, {1, 3, 8, 300}},
      {"f32", WeightFormat::kF32, 512, 128, {1, 2, 5, 100}},
      {"fp8 ragged tiles", WeightFormat::kFp8Tiles, 77, 102, {1, 5, 70}},
      {"bf16 odd width", WeightFormat::kBF16, 33, 130, {1, 70}},
      {"fp4 unaligned", WeightFormat::kFp4Rows, 64, 256, {1, 70}, 2},
      {"f32 unaligned", WeightFormat::kF32, 40, 64, {3, 70}, 4},
      {"fp8 unaligned", WeightFormat::kFp8Tiles, 40, 64, {3, 70}, 1},
      // Decode with 4 W rows per warp (>= 264 blocks of 32 rows), the last warp partly idle.
      {"fp8 4 rows/warp ragged", WeightFormat::kFp8Tiles, 8462, 64, {1}},
      // The tiled path needs n > 64 and at least 132 tiles of 128 x 64: one case per decoder.
      {"bf16 tiled", WeightFormat::kBF16, 4096, 256, {4200}},
      {"f32 tiled", WeightFormat::kF32, 2048, 64, {4200}},
      {"fp8 ragged tiled", WeightFormat::kFp8Tiles, 2000, 102, {5000}},
      {"bf16 odd width tiled", WeightFormat::kBF16, 4000, 130, {4200}},
      {"fp4 unaligned tiled", WeightFormat::kFp4Rows, 2048, 256, {4200}, 2},
      {"f32 unaligned tiled", WeightFormat::kF32, 2048, 64, {4200}, 4},
  };
  uint64_t seed = 1000;
  for (const LinearCase& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw, c.misalign);
    ASSERT_TRUE(dw.data->p);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : c.ns) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = run_linear(dw.dw, dx.p, n, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      report("linear",
             std::string(c.what) + " " + fmt_name(c.format) + " " + dims({c.out, c.in}) +
                 " n=" + std::to_string(n) + (c.misalign ? " +" + std::to_string(c.misalign) + "B" : ""),
             rel_to_max(dy.get(), want), kLinearTol, kLinearWhy);
    }
  }
}

TEST(LinearParity, GroupedLinear) {
  DS41_SKIP_WITHOUT_GPU();
  struct GroupedCase {
    const char* what;
    WeightFormat format;
    int64_t groups, out, in;
    std::vector<int64_t> ns;
  };
  const std::vector<GroupedCase> cases = {
      {"wo_a", WeightFormat::kFp8Tiles, 8, 8192, 4096, {1, 8, 64, 300}},
      {"tiny wo_a", WeightFormat::kFp8Tiles, 2, 128, 128, {1, 70}},
      {"partial tiles", WeightFormat::kBF16, 4, 120, 96, {3, 100, 5000}},
  };
  uint64_t seed = 2000;
  for (const GroupedCase& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool());  // per case: its weight cache is keyed by address
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : c.ns) {
      auto x = rand_floats(static_cast<size_t>(n * c.groups * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.grouped_linear(ref, c.groups, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = run_grouped_linear(dw.dw, c.groups, dx.p, n, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      report("grouped_linear",
             std::string(c.what) + " " + fmt_name(c.format) + " g=" + std::to_string(c.groups) + " " +
                 dims({c.out, c.in}) + " n=" + std::to_string(n),
             rel_to_max(dy.get(), want), kLinearTol, kLinearWhy);
    }
  }
}

// Rows per expert from a random top-k routing of n tokens (distinct experts per token); with
// skip_every > 0, experts that are multiples of it are mostly avoided (empty experts).
std::vector<int64_t> routed_offsets(int64_t n, int64_t k, int64_t E, uint64_t seed, int64_t skip_every = 0) {
  Rng r(seed);
  std::vector<int64_t> cnt(E, 0);
  std::vector<int64_t> ids(E);
  for (int64_t t = 0; t < n; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      int64_t pick;
      do {
        const int64_t q = j + static_cast<int64_t>(r.next() % static_cast<uint64_t>(E - j));
        std::swap(ids[j], ids[q]);
        pick = ids[j];
      } while (skip_every > 0 && pick % skip_every == 0 && (r.next() & 3) != 0);
      ++cnt[pick];
    }
  }
  std::vector<int64_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[e];
  return off;
}

// E experts of one format in one payload buffer (aligned slices, distinct random weights; FP8
// with random per-expert tile scales), their device structs (`shift` bytes put every expert's
// scales that far off the buffer's alignment) and the CPU op's views. Draws make_weight, then for
// FP8 rand_e8m0, from ++seed.
struct Experts {
  HostWeight all;
  std::unique_ptr<Dev<uint8_t>> ddata, dscale;
  std::vector<ops::WeightRef> refs;
  std::unique_ptr<Dev<DeviceWeight>> dweights;
};

// shift: the scales start that many bytes past an aligned address; data_shift: the payload likewise.
Experts make_experts(WeightFormat f, int64_t E, int64_t out, int64_t in, uint64_t& seed, size_t shift = 0,
                     size_t data_shift = 0) {
  Experts x;
  x.all = make_weight(f, E * out, in, ++seed);
  const size_t pb = static_cast<size_t>(quant::weight_payload_bytes(f, out, in));
  const size_t sb = static_cast<size_t>(quant::weight_scale_bytes(f, out, in));
  if (f == WeightFormat::kFp8Tiles) x.all.scale = rand_e8m0(sb * E, ++seed, 118, 124);
  std::vector<uint8_t> scales(shift, 0);
  scales.insert(scales.end(), x.all.scale.begin(), x.all.scale.end());
  std::vector<uint8_t> data(data_shift, 0);
  data.insert(data.end(), x.all.data.begin(), x.all.data.end());
  x.ddata = std::make_unique<Dev<uint8_t>>(data);
  x.dscale = std::make_unique<Dev<uint8_t>>(std::max<size_t>(scales.size(), 1));
  if (!scales.empty()) x.dscale->put(scales);
  std::vector<DeviceWeight> dws(E);
  x.refs.resize(E);
  const HostWeight one{f, out, in, {}, {}};
  for (int64_t e = 0; e < E; ++e) {
    dws[e] = DeviceWeight{f, out, in, x.ddata->p + data_shift + e * pb, sb ? x.dscale->p + shift + e * sb : nullptr};
    x.refs[e] = host_ref(one, x.all.data.data() + e * pb, sb ? x.all.scale.data() + e * sb : nullptr);
  }
  x.dweights = std::make_unique<Dev<DeviceWeight>>(dws);
  return x;
}

TEST(LinearParity, ExpertLinear) {
  DS41_SKIP_WITHOUT_GPU();
  struct ExpertCase {
    const char* what;
    WeightFormat format;
    int64_t E, out, in;
    std::vector<int64_t> ns;  // tokens; rows = n * k
    int64_t k;
    int64_t slack;  // m_max - routed rows
  };
  const std::vector<ExpertCase> cases = {
      {"w1/w3 384 experts", WeightFormat::kFp4Rows, 384, 2304, 5120, {1, 8, 300}, 6, 0},
      {"w2 384 experts", WeightFormat::kFp4Rows, 384, 5120, 2304, {1, 8, 300}, 6, 5},
      {"8 experts (tiled)", WeightFormat::kFp4Rows, 8, 2304, 5120, {300}, 2, 0},
      {"fp8 16 experts", WeightFormat::kFp8Tiles, 16, 96, 512, {1, 40, 400}, 3, 7},
      {"bf16 16 experts", WeightFormat::kBF16, 16, 100, 256, {2, 400}, 2, 0},
      {"fp4 64 experts ragged (4 rows/warp)", WeightFormat::kFp4Rows, 64, 1002, 256, {8}, 6, 3},
  };
  uint64_t seed = 3000;
  for (const ExpertCase& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    const Experts ex = make_experts(c.format, c.E, c.out, c.in, seed);
    const std::vector<ops::WeightRef>& refs = ex.refs;
    for (int64_t n : c.ns) {
      const auto off = routed_offsets(n, c.k, c.E, ++seed, c.E == 16 ? 5 : 0);
      const int64_t m = off[c.E], m_max = m + c.slack;
      auto x = rand_floats(static_cast<size_t>(m_max * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(m * c.out));
      for (int64_t e = 0; e < c.E; ++e)
        if (off[e + 1] > off[e])
          cpu.linear(refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want.data() + off[e] * c.out);
      Dev<int64_t> doff(off);
      Dev<float> dx(x), dy(static_cast<size_t>(m_max * c.out));
      cudaMemset(dy.p, 0xff, dy.n * sizeof(float));  // NaN sentinel: rows >= m stay untouched
      Status s = run_expert_linear(ex.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      auto got = dy.get();
      size_t touched = 0;
      for (size_t i = static_cast<size_t>(m * c.out); i < got.size(); ++i)
        touched += bits_of(got[i]) != 0xffffffffu;
      EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
      got.resize(want.size());
      report("expert_linear",
             std::string(c.what) + " " + fmt_name(c.format) + " " + dims({c.out, c.in}) +
                 " n=" + std::to_string(n) + " k=" + std::to_string(c.k) + " m=" + std::to_string(m),
             rel_to_max(got, want), kLinearTol, kLinearWhy);
      // With the format known, the one-row launch picks its chunks per lane (U) by the row width:
      // each lane keeps its chunk order, so the bits equal the format-blind launch's.
      set_tc_gemv_for_tests(0);
      Dev<float> dy2(static_cast<size_t>(m_max * c.out));
      s = run_expert_linear(ex.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max, dy2.p, nullptr, c.format);
      set_tc_gemv_for_tests(-1);
      ASSERT_TRUE(s.ok()) << s.message();
      auto got2 = dy2.get();
      got2.resize(want.size());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(got2[i]);
      report("expert_linear U by width",
             std::string(c.what) + " " + fmt_name(c.format) + " n=" + std::to_string(n) + " bits differing",
             static_cast<double>(differ), 0, "the same per-lane chunk order: bit-identical");
      EXPECT_EQ(differ, 0u) << c.what << " n=" << n;
    }
  }
}

// The expert GEMV's unit lookup (tc_expert_kernel: block y = unit u, the u-th (expert, <= NB of its
// rows) in expert order, found by a block-wide scan over every expert's row count): against the CPU op
// with more experts than threads per block (two experts per thread), with fewer, with experts left
// empty (skipped in the unit order), experts of many rows (several units of NB rows, the last one
// short) and units of 2 and 6 rows, 1 and 3 slots; the pair too. Sized for the host emulator.
TEST(LinearParity, ExpertUnitLookup) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_rows_per_block_for_tests(0);
      set_persist_slot_cap_for_tests(0);
    }
  } reset;
  struct Case {
    WeightFormat format;
    int64_t E, out, in, n, k, skip;
  };
  const std::vector<Case> cases = {
      {WeightFormat::kFp4Rows, 300, 32, 256, 40, 6, 3},   // 2 experts per thread, 1/3 of them mostly empty
      {WeightFormat::kFp8Tiles, 300, 32, 256, 2, 6, 0},   // 12 routed rows among 300 experts
      {WeightFormat::kFp4Rows, 24, 32, 256, 30, 2, 5},    // 1 expert per thread, ~2.5 rows each
      {WeightFormat::kFp4Rows, 5, 32, 256, 14, 3, 0},     // 5 experts, 8-9 rows each: several units
  };
  set_tc_gemv_for_tests(1);
  uint64_t seed = 18800;
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  for (const Case& c : cases) {
    const Experts w1 = make_experts(c.format, c.E, c.out, c.in, ++seed);
    const Experts w3 = make_experts(c.format, c.E, c.out, c.in, ++seed);
    const auto off = routed_offsets(c.n, c.k, c.E, ++seed, c.skip);
    const int64_t m = off[c.E], m_max = m + 3;
    const auto x = rand_floats(static_cast<size_t>(m_max * c.in), ++seed);
    std::vector<float> want1(static_cast<size_t>(m * c.out)), want3(want1.size());
    for (int64_t e = 0; e < c.E; ++e)
      if (off[e + 1] > off[e]) {
        cpu.linear(w1.refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want1.data() + off[e] * c.out);
        cpu.linear(w3.refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want3.data() + off[e] * c.out);
      }
    Dev<int64_t> doff(off);
    Dev<float> dx(x), dy1(static_cast<size_t>(m_max * c.out)), dy3(dy1.n);
    for (int nb : {2, 6})
      for (int cap : {0, 3})
        for (bool pair : {false, true}) {
          set_tc_gemv_rows_per_block_for_tests(nb);
          set_persist_slot_cap_for_tests(cap);
          cudaMemset(dy1.p, 0xff, dy1.n * sizeof(float));  // NaN sentinel: rows >= m stay untouched
          cudaMemset(dy3.p, 0xff, dy3.n * sizeof(float));
          const Status st =
              pair ? run_expert_linear_pair(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max,
                                            dy1.p, dy3.p, nullptr, c.format)
                   : run_expert_linear(w1.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max, dy1.p, nullptr, c.format);
          ASSERT_TRUE(st.ok()) << st.message();
          for (int mat = 0; mat < (pair ? 2 : 1); ++mat) {
            std::vector<float> got = (mat ? dy3 : dy1).get();
            size_t touched = 0;
            for (size_t i = static_cast<size_t>(m * c.out); i < got.size(); ++i) touched += bits_of(got[i]) != 0xffffffffu;
            EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
            got.resize(want1.size());
            report("expert unit lookup",
                   std::string(fmt_name(c.format)) + " E=" + std::to_string(c.E) + " " + dims({c.out, c.in}) +
                       " rows=" + std::to_string(m) + " NB=" + std::to_string(nb) + " slots cap " + std::to_string(cap) +
                       (pair ? (mat ? " pair w3" : " pair w1") : " single"),
                   rel_to_max(got, mat ? want3 : want1), kLinearTol, kLinearWhy);
          }
        }
  }
}

// The MoE's w1 and w3 in one launch (run_expert_linear_pair, the decode path of gpu_moe_layer.cpp):
// both outputs against the CPU op, at the released expert shape (one token's top 6 of 384, and a
// batch of 8) and small ones; rows past offsets[E] untouched; each routed row alone through the pair
// gives the bits it gets in the batch (row-count invariance: decode vs DSpark verification); an
// unknown format (two single launches) agrees too.
TEST(LinearParity, ExpertPair) {
  DS41_SKIP_WITHOUT_GPU();
  struct PairCase {
    WeightFormat format;
    int64_t E, out, in;
    int64_t n, k;
  };
  uint64_t seed = 16100;
  for (const PairCase& c : {PairCase{WeightFormat::kFp4Rows, 384, 2304, 5120, 1, 6},
                            PairCase{WeightFormat::kFp4Rows, 384, 2304, 5120, 8, 6},
                            PairCase{WeightFormat::kFp4Rows, 12, 80, 1024, 6, 3},
                            PairCase{WeightFormat::kFp8Tiles, 12, 80, 1024, 6, 3}}) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    const Experts w1 = make_experts(c.format, c.E, c.out, c.in, seed);
    const Experts w3 = make_experts(c.format, c.E, c.out, c.in, seed);
    const auto off = routed_offsets(c.n, c.k, c.E, ++seed, 0);
    const int64_t m = off[c.E], m_max = m + 2;
    auto x = rand_floats(static_cast<size_t>(m_max * c.in), ++seed);
    for (int64_t r = 0; r < m; ++r)  // rows of very different magnitudes (each its own power of two)
      for (int64_t i = 0; i < c.in; ++i) x[r * c.in + i] = std::ldexp(x[r * c.in + i], static_cast<int>(3 * (r % 12) - 9));
    std::vector<float> want1(static_cast<size_t>(m * c.out)), want3(want1.size());
    for (int64_t e = 0; e < c.E; ++e)
      if (off[e + 1] > off[e]) {
        cpu.linear(w1.refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want1.data() + off[e] * c.out);
        cpu.linear(w3.refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want3.data() + off[e] * c.out);
      }
    Dev<int64_t> doff(off);
    Dev<float> dx(x), dy1(static_cast<size_t>(m_max * c.out)), dy3(dy1.n);
    const std::string shape = std::string(fmt_name(c.format)) + " " + std::to_string(c.E) + "x" +
                              dims({c.out, c.in}) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k);
    for (WeightFormat known : {c.format, WeightFormat::kNone}) {  // one launch; two single launches
      cudaMemset(dy1.p, 0xff, dy1.n * sizeof(float));
      cudaMemset(dy3.p, 0xff, dy3.n * sizeof(float));
      const Status s = run_expert_linear_pair(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max,
                                              dy1.p, dy3.p, nullptr, known);
      ASSERT_TRUE(s.ok()) << s.message();
      auto g1 = dy1.get(), g3 = dy3.get();
      size_t touched = 0;
      for (size_t i = static_cast<size_t>(m * c.out); i < g1.size(); ++i)
        touched += (bits_of(g1[i]) != 0xffffffffu) + (bits_of(g3[i]) != 0xffffffffu);
      EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
      g1.resize(want1.size());
      g3.resize(want3.size());
      const double e1 = rel_to_max(g1, want1), e3 = rel_to_max(g3, want3);
      report(known == WeightFormat::kNone ? "expert pair (2 launches)" : "expert pair", shape + " w1 | w3",
             std::max(e1, e3), kLinearTol, kLinearWhy);
      EXPECT_LE(e1, kLinearTol) << shape;
      EXPECT_LE(e3, kLinearTol) << shape;
    }
    // The batch through the pair, then every routed row alone through it: the same bits.
    ASSERT_TRUE(run_expert_linear_pair(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p, m_max, dy1.p,
                                       dy3.p, nullptr, c.format)
                    .ok());
    const std::vector<float> all1 = dy1.get(), all3 = dy3.get();
    size_t differ = 0;
    for (int64_t e = 0; e < c.E; ++e)
      for (int64_t r = off[e]; r < off[e + 1]; ++r) {
        std::vector<int64_t> one(static_cast<size_t>(c.E + 1), 0);
        for (int64_t j = e + 1; j <= c.E; ++j) one[j] = 1;
        Dev<int64_t> done(one);
        Dev<float> o1(static_cast<size_t>(c.out)), o3(o1.n);
        ASSERT_TRUE(run_expert_linear_pair(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, done.p, dx.p + r * c.in, 1,
                                           o1.p, o3.p, nullptr, c.format)
                        .ok());
        const std::vector<float> a = o1.get(), b = o3.get();
        for (int64_t i = 0; i < c.out; ++i)
          differ += (bits_of(a[i]) != bits_of(all1[r * c.out + i])) + (bits_of(b[i]) != bits_of(all3[r * c.out + i]));
      }
    report("expert pair row-count invariance", shape + " each row alone vs the batch: bits differing",
           static_cast<double>(differ), 0, "a row's order depends on the experts' shape only");
    EXPECT_EQ(differ, 0u) << shape;
  }
  // Mismatched arguments are errors, not launches.
  Dev<float> d(16);
  EXPECT_FALSE(run_expert_linear_pair(nullptr, nullptr, 4, 16, 64, nullptr, d.p, 4, d.p, nullptr, nullptr).ok());
}

// The routed rows read through the routing permutation (run_expert_linear_pair_rows, the decode MoE of
// gpu_moe_layer.cpp): routed row r is x[rows[r]] (token rows, each used by several experts, in the
// permuted order the router writes). Bit for bit what the pair gives on the gathered rows, on the
// tensor-core GEMV (released shape, one token and a batch; small FP8 / FP4) and on a call it does not
// take (BF16 experts: the gather, then the CUDA-core pair), where `gathered` holds the rows after.
struct RowsCase {
  WeightFormat format;
  int64_t E, out, in;
  int64_t n, k;
};
void expert_pair_through_row_index(const std::vector<RowsCase>& cases, uint64_t seed) {
  for (const RowsCase& c : cases) {
    const Experts w1 = make_experts(c.format, c.E, c.out, c.in, seed);
    const Experts w3 = make_experts(c.format, c.E, c.out, c.in, ++seed);
    const auto off = routed_offsets(c.n, c.k, c.E, ++seed, 0);
    const int64_t m = off[c.E];
    ASSERT_EQ(m, c.n * c.k);
    auto x = rand_floats(static_cast<size_t>(c.n * c.in), ++seed);
    for (int64_t t = 0; t < c.n; ++t)  // token rows of different magnitudes
      for (int64_t i = 0; i < c.in; ++i) x[t * c.in + i] = std::ldexp(x[t * c.in + i], static_cast<int>(5 * (t % 5) - 8));
    // rows: each token k times, in a scrambled order (as the bucketing by expert leaves them).
    std::vector<int64_t> rows(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) rows[i] = i % c.n;
    std::mt19937_64 rng(++seed);
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<float> gathered(static_cast<size_t>(m * c.in));
    for (int64_t i = 0; i < m; ++i)
      std::copy(x.begin() + rows[i] * c.in, x.begin() + (rows[i] + 1) * c.in, gathered.begin() + i * c.in);
    Dev<int64_t> doff(off), drows(rows);
    Dev<float> dx(x), dg(gathered), dscratch(gathered.size()), a1(static_cast<size_t>(m * c.out)), a3(a1.n),
        b1(a1.n), b3(a1.n);
    ASSERT_TRUE(run_expert_linear_pair(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dg.p, m, a1.p, a3.p,
                                       nullptr, c.format)
                    .ok());
    cudaMemset(dscratch.p, 0, dscratch.n * sizeof(float));
    const Status s = run_expert_linear_pair_rows(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p,
                                                 drows.p, dscratch.p, m, b1.p, b3.p, nullptr, c.format);
    ASSERT_TRUE(s.ok()) << s.message();
    const auto ga1 = a1.get(), ga3 = a3.get(), gb1 = b1.get(), gb3 = b3.get();
    size_t differ = 0;
    for (size_t i = 0; i < ga1.size(); ++i)
      differ += (bits_of(ga1[i]) != bits_of(gb1[i])) + (bits_of(ga3[i]) != bits_of(gb3[i]));
    const std::string shape = std::string(fmt_name(c.format)) + " " + std::to_string(c.E) + "x" +
                              dims({c.out, c.in}) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k);
    report("expert pair through the row index", shape + " vs the gathered rows: bits differing",
           static_cast<double>(differ), 0, "the same floats staged: bit-identical");
    EXPECT_EQ(differ, 0u) << shape;
    // The tensor-core GEMV leaves `gathered` alone; the other path fills it with the rows.
    const auto sc = dscratch.get();
    const bool filled = std::equal(sc.begin(), sc.end(), gathered.begin(),
                                   [](float p, float q) { return bits_of(p) == bits_of(q); });
    if (c.format == WeightFormat::kBF16) EXPECT_TRUE(filled) << shape << ": the fallback gathers the rows";
  }
}
TEST(LinearParity, ExpertPairThroughRowIndex) {
  DS41_SKIP_WITHOUT_GPU();
  expert_pair_through_row_index({RowsCase{WeightFormat::kFp4Rows, 384, 2304, 5120, 1, 6},
                                 RowsCase{WeightFormat::kFp4Rows, 384, 2304, 5120, 8, 6}},
                                16900);
}
// The same at small shapes (host SIMT emulator), and the argument errors.
TEST(LinearParity, ExpertPairThroughRowIndexSmall) {
  DS41_SKIP_WITHOUT_GPU();
  expert_pair_through_row_index({RowsCase{WeightFormat::kFp4Rows, 12, 80, 1024, 6, 3},
                                 RowsCase{WeightFormat::kFp8Tiles, 12, 80, 1024, 6, 3},
                                 RowsCase{WeightFormat::kBF16, 6, 100, 256, 4, 2}},
                                16950);
  Dev<float> d(16);
  Dev<int64_t> r(4);
  EXPECT_FALSE(run_expert_linear_pair_rows(nullptr, nullptr, 4, 16, 64, nullptr, d.p, nullptr, d.p, 4, d.p, d.p,
                                           nullptr, WeightFormat::kNone)
                   .ok());
  EXPECT_FALSE(run_expert_linear_pair_rows(nullptr, nullptr, 4, 16, 64, nullptr, d.p, r.p, nullptr, 4, d.p, d.p,
                                           nullptr, WeightFormat::kNone)
                   .ok());
}

// The shared expert's w1 and w3 in one launch (run_linear_pair): both outputs against the CPU op at
// the released shape (FP8 2304 x 5120) and a small FP4 / BF16 one, for decode rows and a row-invariant
// verification width; each row alone through the pair gives its bits in the batch; weights of
// different formats run as two launches.
TEST(LinearParity, LinearPair) {
  DS41_SKIP_WITHOUT_GPU();
  struct PairCase {
    WeightFormat format;
    int64_t out, in;
  };
  uint64_t seed = 16300;
  for (const PairCase& c : {PairCase{WeightFormat::kFp8Tiles, 2304, 5120}, PairCase{WeightFormat::kFp4Rows, 208, 1024},
                            PairCase{WeightFormat::kBF16, 96, 512}}) {
    backends::cpu::CpuBackend cpu(&ref_pool());
    const HostWeight h1 = make_weight(c.format, c.out, c.in, ++seed), h3 = make_weight(c.format, c.out, c.in, ++seed);
    const DevWeight d1(h1), d3(h3);
    const ops::WeightRef r1 = host_ref(h1, h1.data.data(), h1.scale.data()),
                         r3 = host_ref(h3, h3.data.data(), h3.scale.data());
    for (int64_t n : {1, 8, 24}) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < c.in; ++i) x[r * c.in + i] = std::ldexp(x[r * c.in + i], static_cast<int>(2 * (r % 9) - 8));
      std::vector<float> want1(static_cast<size_t>(n * c.out)), want3(want1.size());
      cpu.linear(r1, x.data(), n, want1.data());
      cpu.linear(r3, x.data(), n, want3.data());
      Dev<float> dx(x), y1(want1.size()), y3(want1.size());
      const bool inv = c.format == WeightFormat::kBF16 || n > 16;  // BF16 and wide calls: as verifications
      ASSERT_TRUE(run_linear_pair(d1.dw, d3.dw, dx.p, n, y1.p, y3.p, nullptr, inv).ok());
      const std::vector<float> all1 = y1.get(), all3 = y3.get();
      const std::string shape = std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n);
      const double err = std::max(rel_to_max(all1, want1), rel_to_max(all3, want3));
      report("linear pair", shape + " w1 | w3", err, kLinearTol, kLinearWhy);
      EXPECT_LE(err, kLinearTol) << shape;
      size_t differ = 0;
      for (int64_t r = 0; r < n; r += (n > 8 ? 5 : 1)) {
        Dev<float> o1(static_cast<size_t>(c.out)), o3(o1.n);
        ASSERT_TRUE(run_linear_pair(d1.dw, d3.dw, dx.p + r * c.in, 1, o1.p, o3.p, nullptr, inv).ok());
        const std::vector<float> a = o1.get(), b = o3.get();
        for (int64_t i = 0; i < c.out; ++i)
          differ += (bits_of(a[i]) != bits_of(all1[r * c.out + i])) + (bits_of(b[i]) != bits_of(all3[r * c.out + i]));
      }
      report("linear pair row-count invariance", shape + " rows alone vs the batch: bits differing",
             static_cast<double>(differ), 0, "a row's order depends on the weights' shape only");
      EXPECT_EQ(differ, 0u) << shape;
    }
  }
  {  // different formats: two launches, each as run_linear
    backends::cpu::CpuBackend cpu(&ref_pool());
    const HostWeight h1 = make_weight(WeightFormat::kFp8Tiles, 64, 256, ++seed),
                     h3 = make_weight(WeightFormat::kBF16, 64, 256, ++seed);
    const DevWeight d1(h1), d3(h3);
    auto x = rand_floats(256, ++seed);
    std::vector<float> want1(64), want3(64);
    cpu.linear(host_ref(h1, h1.data.data(), h1.scale.data()), x.data(), 1, want1.data());
    cpu.linear(host_ref(h3, h3.data.data(), h3.scale.data()), x.data(), 1, want3.data());
    Dev<float> dx(x), y1(64), y3(64);
    ASSERT_TRUE(run_linear_pair(d1.dw, d3.dw, dx.p, 1, y1.p, y3.p, nullptr).ok());
    const double err = std::max(rel_to_max(y1.get(), want1), rel_to_max(y3.get(), want3));
    report("linear pair", "fp8 | bf16 64x256 n=1 (two launches)", err, kLinearTol, kLinearWhy);
    EXPECT_LE(err, kLinearTol);
  }
}

// Values no longer the 0xff.. NaN sentinel a buffer was filled with (the epilogue tests: a one-launch path
// leaves its plain outputs alone).
size_t off_sentinel(const std::vector<float>& v) {
  size_t n = 0;
  for (float f : v) n += bits_of(f) != 0xffffffffu;
  return n;
}

// Two weights of one input width with their own output widths in one launch (try_linear_dual: the
// attention's wq_a and wkv of a decode step, DS41_QKV_DUAL): each output bit for bit the output of its own
// run_linear (the same KS and slots per weight), rows of exponents 2^-8 .. 2^8, 1 / 3 / 7 rows; a pair of
// formats the launch cannot take launches nothing and leaves the outputs alone.
struct DualCase {
  WeightFormat format;
  int64_t out1, out2, in;
};
// normed: try_linear_dual_normed (an index layer's wq_b | idx_wq_b over q_r with its norm in the shared staging,
// DS41_QB_DUAL_NORMED) against run_rms_norm into a copy of x and the two row-invariant run_linear calls, x left as it
// was.
void check_linear_dual(const std::vector<DualCase>& cases, uint64_t seed, bool normed = false) {
  for (const DualCase& c : cases) {
    const HostWeight h1 = make_weight(c.format, c.out1, c.in, ++seed), h2 = make_weight(c.format, c.out2, c.in, ++seed);
    const DevWeight d1(h1), d2(h2);
    std::vector<float> nw;
    if (normed) {
      nw = rand_floats(static_cast<size_t>(c.in), ++seed, 0.5f);
      for (auto& v : nw) v += 1.0f;
    }
    Dev<float> dnw(normed ? nw : std::vector<float>(1, 1.0f));
    for (int64_t n : {1, 3, 7}) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < c.in; ++i) x[r * c.in + i] = std::ldexp(x[r * c.in + i], static_cast<int>(2 * (r % 9) - 8));
      Dev<float> dx(x), dxn(x), a1(static_cast<size_t>(n * c.out1)), a2(static_cast<size_t>(n * c.out2)), b1(a1.n),
          b2(a2.n);
      // BF16 takes the tensor cores as decode steps do; the normed launch is a decode step's
      const bool inv = normed || c.format == WeightFormat::kBF16;
      if (normed) ASSERT_TRUE(run_rms_norm(dxn.p, n, c.in, dnw.p, 1e-6f, dxn.p, nullptr).ok());
      ASSERT_TRUE(run_linear(d1.dw, dxn.p, n, a1.p, nullptr, inv).ok());
      ASSERT_TRUE(run_linear(d2.dw, dxn.p, n, a2.p, nullptr, inv).ok());
      bool took = false;
      if (normed)
        ASSERT_TRUE(try_linear_dual_normed(d1.dw, d2.dw, dx.p, n, b1.p, b2.p, dnw.p, 1e-6f, nullptr, inv, &took).ok());
      else
        ASSERT_TRUE(try_linear_dual(d1.dw, d2.dw, dx.p, n, b1.p, b2.p, nullptr, inv, &took).ok());
      const std::string shape = std::string(fmt_name(c.format)) + " " + dims({c.out1, c.in}) + " | " +
                                dims({c.out2, c.in}) + " n=" + std::to_string(n);
      EXPECT_TRUE(took) << shape << (normed ? ": the normed dual launch" : ": the dual launch")
                        << " must take a decode-sized call of one format";
      const std::vector<float> w1 = a1.get(), w2 = a2.get(), g1 = b1.get(), g2 = b2.get();
      size_t differ = 0;
      for (size_t i = 0; i < w1.size(); ++i) differ += bits_of(w1[i]) != bits_of(g1[i]);
      for (size_t i = 0; i < w2.size(); ++i) differ += bits_of(w2[i]) != bits_of(g2[i]);
      if (normed) differ += count_bit_diffs(dx.get(), x);  // x not written
      if (normed)
        report("linear dual normed", shape + ": bits differing from rms_norm + two run_linear launches",
               static_cast<double>(differ), 0, "the norm in the staging both weights share (run_rms_norm's order)");
      else
        report("linear dual", shape + ": bits differing from two run_linear launches", static_cast<double>(differ), 0,
               "each weight's slots run its own launch's KS and order");
      EXPECT_EQ(differ, 0u) << shape;
    }
  }
  if (normed) return;
  {  // two formats: nothing launched, outputs untouched
    const HostWeight h1 = make_weight(WeightFormat::kFp8Tiles, 64, 256, ++seed),
                     h2 = make_weight(WeightFormat::kBF16, 32, 256, ++seed);
    const DevWeight d1(h1), d2(h2);
    Dev<float> dx(rand_floats(256, ++seed)), y1(64), y2(32);
    ASSERT_EQ(cudaMemset(y1.p, 0xff, 64 * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemset(y2.p, 0xff, 32 * sizeof(float)), cudaSuccess);
    bool took = true;
    ASSERT_TRUE(try_linear_dual(d1.dw, d2.dw, dx.p, 1, y1.p, y2.p, nullptr, true, &took).ok());
    EXPECT_FALSE(took);
    EXPECT_EQ(off_sentinel(y1.get()) + off_sentinel(y2.get()), 0u) << "a refused dual call must write nothing";
  }
}

// try_linear_dual_normed: y, y2 bit for bit against rms_norm + two linears, x left as it was (check_linear_dual).
TEST(LinearParity, LinearDualNormed) {
  DS41_SKIP_WITHOUT_GPU();
  // The released wq_b | idx_wq_b (q rank 1280: 64 x 512 and 32 x 128 outputs).
  check_linear_dual({{WeightFormat::kFp8Tiles, 32768, 4096, 1280}, {WeightFormat::kFp8Tiles, 1024, 160, 1024}}, 17300,
                    /*normed=*/true);
}

TEST(LinearParity, LinearDualNormedSmall) {
  DS41_SKIP_WITHOUT_GPU();
  check_linear_dual({{WeightFormat::kFp8Tiles, 160, 64, 1024}, {WeightFormat::kFp8Tiles, 96, 32, 512}}, 17350,
                    /*normed=*/true);
}

TEST(LinearParity, LinearDualEqualsTwoLaunches) {
  DS41_SKIP_WITHOUT_GPU();
  // The released wq_a | wkv; then weights whose own launches take different KS (16384 rows: 1,024 row groups
  // at 2 warps each, against 32 row groups at 4), so a second weight run at the first's KS would differ.
  check_linear_dual({{WeightFormat::kFp8Tiles, 1280, 512, 5120}, {WeightFormat::kFp8Tiles, 16384, 512, 2048},
                     {WeightFormat::kFp4Rows, 2304, 208, 5120}, {WeightFormat::kBF16, 384, 512, 5120}},
                    17100);
}

TEST(LinearParity, LinearDualEqualsTwoLaunchesSmall) {
  DS41_SKIP_WITHOUT_GPU();
  check_linear_dual({{WeightFormat::kFp8Tiles, 160, 64, 1024}, {WeightFormat::kFp4Rows, 208, 48, 1024},
                     {WeightFormat::kBF16, 96, 32, 512}, {WeightFormat::kFp8Tiles, 40, 24, 256}},
                    17200);
}

// One-row dense launches of at most one block per SM with 4 or 8 steps in flight per warp (DS41_DENSE_IN_FLIGHT,
// tcg::InFlight): the same bits as the default 2, for plain linears (FP8 16-byte pieces, BF16: the released
// indexer head weights 32 x 5120 and the MoE gate 384 x 5120 on a device) and the dual wq_a | wkv launch; rows
// of x spread over binades; the InFlight kernel must be taken (its launch counter), and a launch of more blocks
// than SMs must not take it.
TEST(LinearParity, TensorCoreGemvInFlightKeepsTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_fp8_wide_for_tests(-1);
      tcg::set_dense_in_flight_for_tests(-1);
    }
  } reset;
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  set_tc_gemv_for_tests(1);
  set_tc_gemv_fp8_wide_for_tests(1);
  struct C {
    WeightFormat f;
    int64_t out, out2, in;  // out2 > 0: the dual launch of (out, in) and (out2, in)
  };
  std::vector<C> cases = {{WeightFormat::kFp8Tiles, 96, 0, 1024}, {WeightFormat::kBF16, 32, 0, 512},
                          {WeightFormat::kFp8Tiles, 160, 64, 1024}};
  if (!emu) {
    cases.push_back({WeightFormat::kBF16, 32, 0, 5120});
    cases.push_back({WeightFormat::kBF16, 384, 0, 5120});
    cases.push_back({WeightFormat::kFp8Tiles, 1280, 512, 5120});
  }
  uint64_t seed = 17400;
  for (const C& c : cases) {
    const HostWeight h1 = make_weight(c.f, c.out, c.in, ++seed);
    const HostWeight h2 = make_weight(c.f, c.out2 > 0 ? c.out2 : 16, c.in, ++seed);
    const DevWeight d1(h1), d2(h2);
    const int64_t n = 1;
    auto x = rand_floats(static_cast<size_t>(c.in), ++seed);
    for (int64_t i = 0; i < c.in; ++i) x[i] = std::ldexp(x[i], static_cast<int>(i % 13) - 6);
    Dev<float> dx(x);
    auto run = [&](int u) {
      tcg::set_dense_in_flight_for_tests(u);
      Dev<float> y1(static_cast<size_t>(c.out)), y2(static_cast<size_t>(h2.out));
      if (c.out2 > 0) {
        bool took = false;
        EXPECT_TRUE(try_linear_dual(d1.dw, d2.dw, dx.p, n, y1.p, y2.p, nullptr, true, &took).ok());
        EXPECT_TRUE(took);
      } else {
        EXPECT_TRUE(run_linear(d1.dw, dx.p, n, y1.p, nullptr, true).ok());
      }
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> o = y1.get();
      if (c.out2 > 0) {
        const std::vector<float> o2 = y2.get();
        o.insert(o.end(), o2.begin(), o2.end());
      }
      return o;
    };
    const std::vector<float> want = run(0);
    for (int u : {4, 8}) {
      const uint64_t before = tcg::dense_in_flight_launches();
      const std::vector<float> got = run(u);
      const uint64_t took = tcg::dense_in_flight_launches() - before;
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(want[i]);
      const std::string shape = std::string(fmt_name(c.f)) + " " + dims({c.out, c.in}) +
                                (c.out2 > 0 ? " | " + dims({c.out2, c.in}) + " (dual)" : "") + " n=1, " +
                                std::to_string(u) + " steps in flight";
      report("linear tc-gemv in flight", shape + ": bits differing from 2 in flight", static_cast<double>(differ), 0,
             "the same loads and arithmetic, more of them in flight");
      EXPECT_EQ(differ, 0u) << shape;
      EXPECT_EQ(took, 1u) << shape << ": a launch of at most one block per SM takes the InFlight kernel";
    }
  }
  if (!emu) {  // more blocks than SMs (the released wq_b, 32768 x 1280 FP8: two blocks per SM): not taken. (The host
              // emulator's occupancy query answers one block per SM, so every grid there is at most the SMs.)
    const HostWeight h = make_weight(WeightFormat::kFp8Tiles, 32768, 1280, ++seed);
    const DevWeight d(h);
    Dev<float> dx(rand_floats(static_cast<size_t>(h.in), ++seed)), dy(static_cast<size_t>(h.out));
    tcg::set_dense_in_flight_for_tests(8);
    const uint64_t before = tcg::dense_in_flight_launches();
    ASSERT_TRUE(run_linear(d.dw, dx.p, 1, dy.p, nullptr, true).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(tcg::dense_in_flight_launches(), before) << "a grid wider than the SMs keeps the default kernel";
  }
}

// A pair with its SwiGLU as the launch's epilogue (run_expert_linear_pair_swiglu: the decode MoE's routed
// w1 / w3 then act; run_linear_pair_swiglu with the opt-in dense switch: the shared expert's): against the CPU ops (linear, linear, swiglu), and
// bit for bit against the two-launch path (the pair, then run_swiglu) where the pair's warps per row
// group are <= 4 (the small shapes; the released shared shape takes 4 instead of 8 when fused, so there
// the tolerance only); each row alone gives the batch's bits (row-count invariance: decode vs DSpark
// verification). The limit clamps a good share of g and u (set from the data); routing weights per row.
TEST(LinearParity, PairSwigluEpilogue) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_dense_swiglu_for_tests(-1);
    }
  } reset;
  set_tc_gemv_for_tests(1);
  set_tc_gemv_dense_swiglu_for_tests(1);  // the dense pair's epilogue (opt-in in the engine)
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  uint64_t seed = 19900;
  auto limit_of = [](const std::vector<float>& g, const std::vector<float>& u) {
    float m = 0.f;
    for (size_t i = 0; i < g.size(); ++i) m = std::max({m, std::fabs(g[i]), std::fabs(u[i])});
    return 0.3f * m;  // clamps the largest values of both
  };
  auto bits_differ = [](const std::vector<float>& a, const std::vector<float>& b) {
    size_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += bits_of(a[i]) != bits_of(b[i]);
    return d;
  };
  struct DenseCase {
    WeightFormat format;
    int64_t out, in;
    bool bits;  // the pair's KS <= 4: the same bits as the two launches
  };
  std::vector<DenseCase> dense = {{WeightFormat::kFp8Tiles, 80, 1024, true}, {WeightFormat::kBF16, 96, 512, true}};
  if (!emu) {
    dense.push_back({WeightFormat::kFp4Rows, 208, 1024, true});
    dense.push_back({WeightFormat::kFp8Tiles, 2304, 5120, false});  // the released shared expert
  }
  for (const DenseCase& c : dense) {
    const HostWeight h1 = make_weight(c.format, c.out, c.in, ++seed), h3 = make_weight(c.format, c.out, c.in, ++seed);
    const DevWeight d1(h1), d3(h3);
    const ops::WeightRef r1 = host_ref(h1, h1.data.data(), h1.scale.data()),
                         r3 = host_ref(h3, h3.data.data(), h3.scale.data());
    const bool inv = c.format == WeightFormat::kBF16;  // BF16 pairs reach the tensor cores as verifications
    for (int64_t n : emu ? std::vector<int64_t>{3} : std::vector<int64_t>{1, 3, 8}) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < c.in; ++i) x[r * c.in + i] = std::ldexp(x[r * c.in + i], static_cast<int>(2 * (r % 5) - 4));
      std::vector<float> g(static_cast<size_t>(n * c.out)), u(g.size()), want(g.size());
      cpu.linear(r1, x.data(), n, g.data());
      cpu.linear(r3, x.data(), n, u.data());
      const float limit = limit_of(g, u);
      const auto scale = rand_floats(static_cast<size_t>(n), ++seed);
      for (bool scaled : {false, true}) {
        if (emu && !scaled) continue;
        cpu.swiglu(g.data(), u.data(), n, c.out, limit, scaled ? scale.data() : nullptr, want.data());
        Dev<float> dx(x), dscale(scale), dg(g.size()), du(g.size()), ref(g.size()), act(g.size());
        const float* rs = scaled ? dscale.p : nullptr;
        ASSERT_TRUE(run_linear_pair(d1.dw, d3.dw, dx.p, n, dg.p, du.p, nullptr, inv).ok());
        ASSERT_TRUE(run_swiglu(dg.p, du.p, n, c.out, limit, rs, ref.p, nullptr).ok());
        cudaMemset(dg.p, 0xff, dg.n * sizeof(float));  // NaN sentinel: the one-launch path leaves g and u alone
        cudaMemset(du.p, 0xff, du.n * sizeof(float));
        const Status st = run_linear_pair_swiglu(d1.dw, d3.dw, dx.p, n, dg.p, du.p, SwigluEpilogue{act.p, rs, limit},
                                                 nullptr, inv);
        ASSERT_TRUE(st.ok()) << st.message();
        const std::vector<float> got = act.get(), two = ref.get();
        const size_t written = off_sentinel(dg.get()) + off_sentinel(du.get());
        EXPECT_EQ(written, 0u) << "g / u written: the pair and its SwiGLU did not run as one launch";
        const std::string shape = std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " n=" +
                                  std::to_string(n) + (scaled ? " row scales" : "");
        report("pair swiglu", shape + " vs CPU linear, linear, swiglu", rel_to_max(got, want), 2 * kLinearTol,
               "the pair's sums in another order, then the same SwiGLU");
        if (c.bits) {
          const size_t d = bits_differ(got, two);
          report("pair swiglu", shape + " vs the pair then run_swiglu: bits differing", static_cast<double>(d), 0,
                 "the same sums and the same SwiGLU operations");
          EXPECT_EQ(d, 0u) << shape;
        }
        size_t alone = 0;
        for (int64_t r = 0; r < n; r += emu ? 2 : 1) {
          Dev<float> o(static_cast<size_t>(c.out));
          ASSERT_TRUE(run_linear_pair_swiglu(d1.dw, d3.dw, dx.p + r * c.in, 1, dg.p, du.p,
                                             SwigluEpilogue{o.p, rs ? rs + r : nullptr, limit}, nullptr, inv)
                          .ok());
          const std::vector<float> a = o.get();
          for (int64_t i = 0; i < c.out; ++i) alone += bits_of(a[i]) != bits_of(got[r * c.out + i]);
        }
        report("pair swiglu row-count invariance", shape + " rows alone vs the batch: bits differing",
               static_cast<double>(alone), 0, "a row's sums depend on the weights' shape only");
        EXPECT_EQ(alone, 0u) << shape;
      }
    }
  }
  struct ExpertCase {
    WeightFormat format;
    int64_t E, out, in, n, k;
  };
  std::vector<ExpertCase> experts = {{WeightFormat::kFp4Rows, 12, 80, 1024, 6, 3}};
  if (!emu) {
    experts.push_back({WeightFormat::kFp8Tiles, 12, 80, 1024, 6, 3});
    experts.push_back({WeightFormat::kFp4Rows, 384, 2304, 5120, 1, 6});
    experts.push_back({WeightFormat::kFp4Rows, 384, 2304, 5120, 8, 6});
  }
  for (const ExpertCase& c : experts) {
    const Experts w1 = make_experts(c.format, c.E, c.out, c.in, ++seed);
    const Experts w3 = make_experts(c.format, c.E, c.out, c.in, ++seed);
    const auto off = routed_offsets(c.n, c.k, c.E, ++seed, 0);
    const int64_t m = off[c.E];
    ASSERT_EQ(m, c.n * c.k);
    auto x = rand_floats(static_cast<size_t>(c.n * c.in), ++seed);
    std::vector<int64_t> rows(static_cast<size_t>(m));  // routed row r reads token row (r * 5) % n
    for (int64_t r = 0; r < m; ++r) rows[r] = (r * 5) % c.n;
    std::vector<float> xr(static_cast<size_t>(m * c.in));
    for (int64_t r = 0; r < m; ++r) std::copy_n(x.begin() + rows[r] * c.in, c.in, xr.begin() + r * c.in);
    std::vector<float> g(static_cast<size_t>(m * c.out)), u(g.size()), want(g.size());
    for (int64_t e = 0; e < c.E; ++e)
      if (off[e + 1] > off[e]) {
        cpu.linear(w1.refs[e], xr.data() + off[e] * c.in, off[e + 1] - off[e], g.data() + off[e] * c.out);
        cpu.linear(w3.refs[e], xr.data() + off[e] * c.in, off[e + 1] - off[e], u.data() + off[e] * c.out);
      }
    const float limit = limit_of(g, u);
    const auto scale = rand_floats(static_cast<size_t>(m), ++seed);
    cpu.swiglu(g.data(), u.data(), m, c.out, limit, scale.data(), want.data());
    Dev<int64_t> doff(off), drows(rows);
    Dev<float> dx(x), dscale(scale), gathered(xr.size()), dg(g.size()), du(g.size()), ref(g.size()), act(g.size());
    ASSERT_TRUE(run_expert_linear_pair_rows(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p, drows.p,
                                            gathered.p, m, dg.p, du.p, nullptr, c.format)
                    .ok());
    ASSERT_TRUE(run_swiglu(dg.p, du.p, m, c.out, limit, dscale.p, ref.p, nullptr).ok());
    cudaMemset(dg.p, 0xff, dg.n * sizeof(float));  // NaN sentinel: the one-launch path leaves g and u alone
    cudaMemset(du.p, 0xff, du.n * sizeof(float));
    const Status st = run_expert_linear_pair_swiglu(w1.dweights->p, w3.dweights->p, c.E, c.out, c.in, doff.p, dx.p,
                                                    drows.p, gathered.p, m, dg.p, du.p,
                                                    SwigluEpilogue{act.p, dscale.p, limit}, nullptr, c.format);
    ASSERT_TRUE(st.ok()) << st.message();
    const std::vector<float> got = act.get();
    const size_t written = off_sentinel(dg.get()) + off_sentinel(du.get());
    EXPECT_EQ(written, 0u) << "g / u written: the pair and its SwiGLU did not run as one launch";
    const std::string shape = std::string(fmt_name(c.format)) + " " + std::to_string(c.E) + "x" +
                              dims({c.out, c.in}) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                              " through the row index, routing weights";
    report("expert pair swiglu", shape + " vs CPU", rel_to_max(got, want), 2 * kLinearTol,
           "the pair's sums in another order, then the same SwiGLU");
    const size_t d = bits_differ(got, ref.get());
    report("expert pair swiglu", shape + " vs the pair then run_swiglu: bits differing", static_cast<double>(d), 0,
           "the same sums (one warp per row group either way) and the same SwiGLU operations");
    EXPECT_EQ(d, 0u) << shape;
  }
}

// An mHC site of n rows of 4 streams of h floats with random map weights (the carried-map tests): the inputs,
// drawn from ++seed (streams, fn, base); MapSiteOut: one form's outputs (pre filled with the NaN sentinel), its
// workspace and zeroed counters, and the site's arguments over them.
struct MapSite {
  int64_t n, h;
  Dev<float> streams, fn, base, scale, cw, x;
  MapSite(int64_t rows, int64_t width, uint64_t& seed)
      : n(rows),
        h(width),
        streams(rand_floats(static_cast<size_t>(rows * 4 * width), ++seed, 4.0f)),
        fn(rand_floats(static_cast<size_t>(24 * 4 * width), ++seed,
                       1.7f / std::sqrt(static_cast<float>(4 * width) / 3.0f))),
        base(rand_floats(24, ++seed)),
        scale(std::vector<float>{0.8f, 1.3f, 2.0f}),
        cw(static_cast<size_t>(rows * 4)),
        x(static_cast<size_t>(rows * width)) {}
};
struct MapSiteOut {
  Dev<float> pre, post, comb;
  Dev<uint8_t> ws;
  Dev<uint32_t> counters;
  HcSiteArgs args;
  explicit MapSiteOut(MapSite& s)
      : pre(static_cast<size_t>(s.n * 4)),
        post(static_cast<size_t>(s.n * 4)),
        comb(static_cast<size_t>(s.n * 16)),
        ws(hc_map_workspace_bytes(s.n, 4, s.h)),
        counters(std::vector<uint32_t>(static_cast<size_t>(hc_site_counter_count(s.n)), 0u)) {
    cudaMemset(pre.p, 0xff, pre.n * sizeof(float));
    HcMapDeviceArgs& m = args.map;
    m.n = s.n;
    m.c = 4;
    m.h = s.h;
    m.sinkhorn_iters = 20;
    m.streams = s.streams.p;
    m.fn = s.fn.p;
    m.scale = s.scale.p;
    m.base = s.base.p;
    m.pre = pre.p;
    m.post = post.p;
    m.comb = comb.p;
    m.workspace = ws.p;
    m.workspace_bytes = hc_map_workspace_bytes(s.n, 4, s.h);
    args.collapse_w = s.cw.p;
    args.x = s.x.p;
    args.counters = counters.p;
    args.counters_size = hc_site_counter_count(s.n);
  }
  size_t counters_left() {
    size_t left = 0;
    for (uint32_t v : counters.get()) left += v != 0;
    return left;
  }
};

// The shared expert as extra units of the routed launches (DS41_MOE_SHARED_FOLD; SharedUnits): the routed pair
// with its SwiGLU carrying the shared w1 / w3 pair (act, no row scale), the routed w2 carrying the shared w2.
// Bit for bit against the launches it replaces (the routed call alone; the shared pair's fused dense launch,
// the shared w2's dense launch), the routed outputs too; the shared outputs against the CPU ops. 1-8 token rows
// (1-8 x k routed rows, every row's exponent different), the released widths on a device (384 FP4 experts of
// 2304 x 5120, the FP8 shared expert); slot caps so that a shared unit's blocks loop over many row-group
// batches. A shared weight the launch cannot take (FP4) leaves it to the caller (folded false, nothing written).
// The pair's launch also carries an mHC site's map (DS41_HC_MAP_FOLD: HcMapFold, the FFN site's at C = 4 over the
// same token rows): pre / post / comb bit for bit against run_hc_site's map part, its counters zero after.
TEST(LinearParity, SharedUnitsFoldKeepTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_moe_shared_fold_for_tests(-1);
      set_hc_map_fold_for_tests(-1);
      tcg::set_slot_cap_for_tests(0);
    }
  } reset;
  set_hc_map_fold_for_tests(1);
  set_tc_gemv_for_tests(1);
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  uint64_t seed = 31700;
  auto bits_differ = [](const std::vector<float>& a, const std::vector<float>& b) {
    size_t d = 0;
    for (size_t i = 0; i < a.size(); ++i) d += bits_of(a[i]) != bits_of(b[i]);
    return d;
  };
  struct Case {
    int64_t E, k, inter, hidden;
    std::vector<int64_t> ns;
    std::vector<int> caps;
  };
  std::vector<Case> cases = {{24, 4, 256, 512, emu ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 3, 8},
                              emu ? std::vector<int>{0} : std::vector<int>{0, 2}}};
  if (!emu) cases.push_back({384, 6, 2304, 5120, {1, 8}, {0}});
  for (const Case& c : cases) {
    const Experts w1 = make_experts(WeightFormat::kFp4Rows, c.E, c.inter, c.hidden, seed);
    const Experts w3 = make_experts(WeightFormat::kFp4Rows, c.E, c.inter, c.hidden, seed);
    const Experts w2 = make_experts(WeightFormat::kFp4Rows, c.E, c.hidden, c.inter, seed);
    const HostWeight hs1 = make_weight(WeightFormat::kFp8Tiles, c.inter, c.hidden, ++seed),
                     hs3 = make_weight(WeightFormat::kFp8Tiles, c.inter, c.hidden, ++seed),
                     hs2 = make_weight(WeightFormat::kFp8Tiles, c.hidden, c.inter, ++seed);
    const DevWeight ds1(hs1), ds3(hs3), ds2(hs2);
    for (int64_t n : c.ns) {
      for (int cap : c.caps) {
        tcg::set_slot_cap_for_tests(cap);
        const auto off = routed_offsets(n, c.k, c.E, ++seed, 0);
        const int64_t m = off[c.E];
        auto x = rand_floats(static_cast<size_t>(n * c.hidden), ++seed);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t i = 0; i < c.hidden; ++i)
            x[r * c.hidden + i] = std::ldexp(x[r * c.hidden + i], static_cast<int>(3 * (r % 5) - 6));
        std::vector<int64_t> rows(static_cast<size_t>(m));
        for (int64_t r = 0; r < m; ++r) rows[r] = (r * 5) % n;
        const auto scale = rand_floats(static_cast<size_t>(m), ++seed);
        // The CPU's shared expert, for the tolerance row and the clamp.
        std::vector<float> g(static_cast<size_t>(n * c.inter)), u(g.size()), sa_want(g.size());
        cpu.linear(host_ref(hs1, hs1.data.data(), hs1.scale.data()), x.data(), n, g.data());
        cpu.linear(host_ref(hs3, hs3.data.data(), hs3.scale.data()), x.data(), n, u.data());
        float lim = 0.f;
        for (size_t i = 0; i < g.size(); ++i) lim = std::max({lim, std::fabs(g[i]), std::fabs(u[i])});
        lim *= 0.3f;
        cpu.swiglu(g.data(), u.data(), n, c.inter, lim, nullptr, sa_want.data());
        const std::string shape = std::to_string(c.E) + "x" + dims({c.inter, c.hidden}) + " n=" + std::to_string(n) +
                                  " k=" + std::to_string(c.k) + (cap ? " slot cap " + std::to_string(cap) : "");
        Dev<int64_t> doff(off), drows(rows);
        Dev<float> dx(x), dscale(scale), gathered(static_cast<size_t>(m * c.hidden)),
            dg(static_cast<size_t>(std::max(m, n) * c.inter)), du(dg.n);
        MapSite site(n, c.hidden, seed);  // the FFN site the pair's launch carries
        std::vector<float> pre[2], post[2], comb[2];
        size_t counters_left = 0;
        // Both forms: 0 the separate launches (the fold's switch on for the dense pair's fused form, no
        // SharedUnits passed), 1 the fold.
        std::vector<float> act[2], sa[2], out[2], sout[2];
        for (int form : {0, 1}) {
          set_moe_shared_fold_for_tests(1);
          Dev<float> dact(static_cast<size_t>(m * c.inter)), dsa(static_cast<size_t>(n * c.inter)),
              dout(static_cast<size_t>(m * c.hidden)), dsout(static_cast<size_t>(n * c.hidden));
          cudaMemset(dsa.p, 0xff, dsa.n * sizeof(float));
          cudaMemset(dsout.p, 0xff, dsout.n * sizeof(float));
          MapSiteOut so(site);
          HcMapFold mf;
          SharedUnits sp{&ds1.dw, &ds3.dw, dx.p, n, dsa.p};
          if (form == 1) {
            ASSERT_TRUE(hc_site_map_fold(so.args, &mf)) << shape;
            sp.map = &mf;
          } else {
            ASSERT_TRUE(run_hc_site(so.args, nullptr, HcSitePart::kMap).ok());
          }
          const uint64_t before = tcg::moe_shared_fold_launches(), maps_before = tcg::map_fold_launches();
          Status st = run_expert_linear_pair_swiglu(w1.dweights->p, w3.dweights->p, c.E, c.inter, c.hidden, doff.p,
                                                    dx.p, drows.p, gathered.p, m, dg.p, du.p,
                                                    SwigluEpilogue{dact.p, dscale.p, lim}, nullptr,
                                                    WeightFormat::kFp4Rows, form ? &sp : nullptr);
          ASSERT_TRUE(st.ok()) << st.message();
          if (form == 0) {
            EXPECT_EQ(off_sentinel(dsa.get()), 0u) << "no SharedUnits: the shared rows are the caller's";
            ASSERT_TRUE(run_linear_pair_swiglu(ds1.dw, ds3.dw, dx.p, n, dg.p, du.p, SwigluEpilogue{dsa.p, nullptr, lim},
                                               nullptr, false)
                            .ok());
          } else {
            EXPECT_TRUE(sp.folded) << shape;
            EXPECT_TRUE(mf.folded) << shape;
            EXPECT_EQ(tcg::map_fold_launches(), maps_before + 1) << shape;
          }
          SharedUnits s2{&ds2.dw, nullptr, dsa.p, n, dsout.p};
          st = run_expert_linear(w2.dweights->p, c.E, c.hidden, c.inter, doff.p, dact.p, m, dout.p, nullptr,
                                 WeightFormat::kFp4Rows, true, form ? &s2 : nullptr);
          ASSERT_TRUE(st.ok()) << st.message();
          if (form == 0) {
            ASSERT_TRUE(run_linear(ds2.dw, dsa.p, n, dsout.p, nullptr, false).ok());
          } else {
            EXPECT_TRUE(s2.folded) << shape;
            EXPECT_EQ(tcg::moe_shared_fold_launches(), before + 2) << shape;
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          act[form] = dact.get();
          sa[form] = dsa.get();
          out[form] = dout.get();
          sout[form] = dsout.get();
          pre[form] = so.pre.get();
          post[form] = so.post.get();
          comb[form] = so.comb.get();
          counters_left += so.counters_left();
        }
        const size_t dm = bits_differ(pre[1], pre[0]) + bits_differ(post[1], post[0]) + bits_differ(comb[1], comb[0]);
        report("shared fold", shape + " carried site map (pre, post, comb) vs its own launch: bits differing",
               static_cast<double>(dm + counters_left), 0, "the same map blocks, counters zero after");
        EXPECT_EQ(dm + counters_left, 0u) << shape;
        report("shared fold", shape + " shared act vs CPU linear, linear, swiglu", rel_to_max(sa[1], sa_want),
               2 * kLinearTol, "the pair's sums in another order, then the same SwiGLU");
        EXPECT_LE(rel_to_max(sa[1], sa_want), 2 * kLinearTol) << shape;
        const size_t d = bits_differ(act[1], act[0]) + bits_differ(sa[1], sa[0]) + bits_differ(out[1], out[0]) +
                         bits_differ(sout[1], sout[0]);
        report("shared fold", shape + " routed and shared outputs vs the separate launches: bits differing",
               static_cast<double>(d), 0, "the same warps per row group and operations in each unit");
        EXPECT_EQ(d, 0u) << shape;
      }
    }
  }
  // A shared weight the fold cannot take (FP4, not the dense FP8 kernel): the routed launch alone, folded false.
  set_moe_shared_fold_for_tests(1);
  const Experts w1 = make_experts(WeightFormat::kFp4Rows, 8, 256, 512, seed);
  const Experts w3 = make_experts(WeightFormat::kFp4Rows, 8, 256, 512, seed);
  const HostWeight h4 = make_weight(WeightFormat::kFp4Rows, 256, 512, ++seed);
  const DevWeight d4(h4);
  const auto off = routed_offsets(1, 2, 8, ++seed, 0);
  std::vector<int64_t> rows = {0, 0};
  Dev<int64_t> doff(off), drows(rows);
  Dev<float> dx(rand_floats(512, ++seed)), dscale(rand_floats(2, ++seed)), gathered(1024), dg(512), du(512), dact(512),
      dsa(256);
  cudaMemset(dsa.p, 0xff, dsa.n * sizeof(float));
  SharedUnits sp{&d4.dw, &d4.dw, dx.p, 1, dsa.p};
  sp.folded = true;
  ASSERT_TRUE(run_expert_linear_pair_swiglu(w1.dweights->p, w3.dweights->p, 8, 256, 512, doff.p, dx.p, drows.p,
                                            gathered.p, 2, dg.p, du.p, SwigluEpilogue{dact.p, dscale.p, 1.f}, nullptr,
                                            WeightFormat::kFp4Rows, &sp)
                  .ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_FALSE(sp.folded);
  EXPECT_EQ(off_sentinel(dsa.get()), 0u) << "a refused shared weight must not be written";
}

// A site's map carried by a normed dense GEMV (DS41_HC_MAP_FOLD: the attention site's map in wq_b's launch):
// y bit for bit against run_linear_normed alone, pre / post / comb against run_hc_site's map part, counters zero
// after; 1-8 rows (emulator: 1 and 3), slot caps so the GEMV's blocks loop. A call the carrying kernel does not
// take (BF16) leaves the map to the caller (folded false, nothing written).
TEST(LinearParity, NormedGemvCarriesSiteMap) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_hc_map_fold_for_tests(-1);
      tcg::set_slot_cap_for_tests(0);
    }
  } reset;
  set_tc_gemv_for_tests(1);
  set_hc_map_fold_for_tests(1);
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  uint64_t seed = 32900;
  struct Case {
    WeightFormat format;
    int64_t out, in, h;
  };
  std::vector<Case> cases = {{WeightFormat::kFp8Tiles, 256, 512, 1024}, {WeightFormat::kBF16, 64, 512, 1024}};
  if (!emu) cases.push_back({WeightFormat::kFp8Tiles, 32768, 1536, 5120});  // the released wq_b, the site's h
  for (const Case& c : cases) {
    const HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    const DevWeight dw(hw);
    for (int64_t n : emu ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 3, 8}) {
      for (int cap : emu ? std::vector<int>{0} : std::vector<int>{0, 3}) {
        tcg::set_slot_cap_for_tests(cap);
        const std::string shape = std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " n=" +
                                  std::to_string(n) + " site h=" + std::to_string(c.h) +
                                  (cap ? " slot cap " + std::to_string(cap) : "");
        const auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
        const auto nw = rand_floats(static_cast<size_t>(c.in), ++seed, 1.5f);
        Dev<float> dnw(nw);
        MapSite site(n, c.h, seed);
        std::vector<float> y[2], pre[2], post[2], comb[2];
        size_t left = 0;
        bool folded = false;
        for (int form : {0, 1}) {
          Dev<float> dx(x), dy(static_cast<size_t>(n * c.out));
          MapSiteOut so(site);
          HcMapFold mf;
          ASSERT_TRUE(hc_site_map_fold(so.args, &mf)) << shape;
          const uint64_t before = tcg::map_fold_launches();
          ASSERT_TRUE(run_linear_normed(dw.dw, dx.p, n, dy.p, dnw.p, 1e-6f, nullptr, false, form ? &mf : nullptr).ok());
          if (form == 1) {
            folded = mf.folded;
            EXPECT_EQ(tcg::map_fold_launches(), before + (mf.folded ? 1 : 0)) << shape;
            if (!mf.folded) {
              EXPECT_EQ(off_sentinel(so.pre.get()), 0u) << shape << ": a map not carried must not be written";
              ASSERT_TRUE(run_hc_site(so.args, nullptr, HcSitePart::kMap).ok());
            }
          } else {
            ASSERT_TRUE(run_hc_site(so.args, nullptr, HcSitePart::kMap).ok());
          }
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          y[form] = dy.get();
          pre[form] = so.pre.get();
          post[form] = so.post.get();
          comb[form] = so.comb.get();
          left += so.counters_left();
        }
        // The carrying kernel runs at two rows per block: up to 4 rows always (tc_gemv_kernels.cu pick_nb); past
        // that a weight of many row groups (the released wq_b) takes more rows per block and the map stays its own
        // launch (folded false; measured on an H100 at 8 rows).
        if (n <= 4 || c.out < 4096)
          EXPECT_EQ(folded, c.format == WeightFormat::kFp8Tiles) << shape << ": the FP8 GEMV carries the map, BF16's not";
        else
          EXPECT_FALSE(folded) << shape << ": more rows per block than the carrying kernel's two";
        const size_t d = count_bit_diffs(y[1], y[0]) + count_bit_diffs(pre[1], pre[0]) +
                         count_bit_diffs(post[1], post[0]) + count_bit_diffs(comb[1], comb[0]);
        report("normed gemv + site map", shape + " y, pre, post, comb vs the two launches: bits differing",
               static_cast<double>(d + left), 0, "the same GEMV blocks and map blocks, counters zero after");
        EXPECT_EQ(d + left, 0u) << shape;
      }
    }
  }
}

// The output projection with the mHC expand as its epilogue (run_linear_expand: the attention's wo_b
// writing the residual streams): bit for bit against run_linear then run_hc_expand, C = 4 (the released
// C, the unrolled path) and C = 3 (the general loop), FP8 / FP4 decode-sized and BF16 row-invariant
// calls, 1-5 rows; y left alone (the one-launch path ran); every row alone gives the batch's streams.
TEST(LinearParity, LinearExpandEpilogue) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() { set_tc_gemv_for_tests(-1); }
  } reset;
  set_tc_gemv_for_tests(1);
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    WeightFormat format;
    int64_t out, in, c;
  };
  std::vector<Case> cases = {{WeightFormat::kFp8Tiles, 80, 1024, 4}, {WeightFormat::kBF16, 96, 512, 3}};
  if (!emu) {
    cases.push_back({WeightFormat::kFp4Rows, 208, 1024, 4});
    cases.push_back({WeightFormat::kFp8Tiles, 5120, 8192, 4});  // the released wo_b
  }
  uint64_t seed = 21100;
  for (const Case& c : cases) {
    const HostWeight h = make_weight(c.format, c.out, c.in, ++seed);
    const DevWeight d(h);
    const bool inv = c.format == WeightFormat::kBF16;
    for (int64_t n : emu ? std::vector<int64_t>{3} : std::vector<int64_t>{1, 5}) {
      const auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      const auto streams = rand_floats(static_cast<size_t>(n * c.c * c.out), ++seed);
      const auto post = rand_floats(static_cast<size_t>(n * c.c), ++seed);
      const auto comb = rand_floats(static_cast<size_t>(n * c.c * c.c), ++seed);
      Dev<float> dx(x), dpost(post), dcomb(comb), want(streams), got(streams), y(static_cast<size_t>(n * c.out));
      ASSERT_TRUE(run_linear(d.dw, dx.p, n, y.p, nullptr, inv).ok());
      ASSERT_TRUE(run_hc_expand(want.p, y.p, dpost.p, dcomb.p, n, c.c, c.out, nullptr).ok());
      cudaMemset(y.p, 0xff, y.n * sizeof(float));  // NaN sentinel: the one-launch path leaves y alone
      const Status st =
          run_linear_expand(d.dw, dx.p, n, y.p, HcExpandEpilogue{got.p, dpost.p, dcomb.p, c.c}, nullptr, inv);
      ASSERT_TRUE(st.ok()) << st.message();
      const size_t written = off_sentinel(y.get());
      EXPECT_EQ(written, 0u) << "y written: the linear and its expand did not run as one launch";
      const std::vector<float> a = got.get(), b = want.get();
      size_t differ = 0;
      for (size_t i = 0; i < a.size(); ++i) differ += bits_of(a[i]) != bits_of(b[i]);
      const std::string shape = std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " C=" +
                                std::to_string(c.c) + " n=" + std::to_string(n);
      report("linear expand", shape + " vs linear then hc_expand: bits differing", static_cast<double>(differ), 0,
             "the same sums and the same expand operations");
      EXPECT_EQ(differ, 0u) << shape;
      size_t alone = 0;
      for (int64_t r = 0; r < n; r += emu ? 2 : 1) {
        Dev<float> s1(std::vector<float>(streams.begin() + r * c.c * c.out, streams.begin() + (r + 1) * c.c * c.out));
        ASSERT_TRUE(run_linear_expand(d.dw, dx.p + r * c.in, 1, y.p,
                                      HcExpandEpilogue{s1.p, dpost.p + r * c.c, dcomb.p + r * c.c * c.c, c.c}, nullptr,
                                      inv)
                        .ok());
        const std::vector<float> o = s1.get();
        for (int64_t i = 0; i < c.c * c.out; ++i) alone += bits_of(o[i]) != bits_of(a[r * c.c * c.out + i]);
      }
      report("linear expand row-count invariance", shape + " rows alone vs the batch: bits differing",
             static_cast<double>(alone), 0, "a row's sums depend on the weight's shape only");
      EXPECT_EQ(alone, 0u) << shape;
    }
  }
}

// Small shapes for every decoder on the streaming GEMV (rows 16-byte aligned) and its fallbacks:
// x rows n in {1, 2, 3, 5, 8, 13, 64} (every NB, partial x-row blocks), chunk counts that leave
// lanes / batches partly empty (K tails), warps split along K (few rows, long K: KS 2..8), ragged
// last row groups, grouped launches and experts with empty experts, one row each (decode) or
// several. Small enough for the host SIMT emulator (scripts/cuda-host-emu/run.sh).
TEST(LinearParity, SmallStreaming) {
  DS41_SKIP_WITHOUT_GPU();
  // The CUDA-core kernels' table: the tensor-core GEMV (which takes FP8 / FP4 decode shapes when it
  // is on) has its own rows (TensorCoreGemv, DecodeGemvRowCountInvariance).
  struct Reset {
    ~Reset() { set_tc_gemv_for_tests(-1); }
  } reset;
  set_tc_gemv_for_tests(0);
  const std::vector<int64_t> ns = {1, 2, 3, 5, 8, 13, 64};
  const std::vector<LinearCase> cases = {
      {"fp8 K tail", WeightFormat::kFp8Tiles, 37, 592, ns},      // 37 chunks per row
      {"fp8 split K", WeightFormat::kFp8Tiles, 40, 4096, {1, 5}},  // KS = 8
      {"fp4 K tail", WeightFormat::kFp4Rows, 21, 1184, ns},
      {"fp4 split K", WeightFormat::kFp4Rows, 9, 4096, {1, 3}},
      {"bf16 K tail", WeightFormat::kBF16, 19, 328, ns},
      {"bf16 split K", WeightFormat::kBF16, 6, 2048, {1, 8}},
      {"f32 K tail", WeightFormat::kF32, 11, 164, ns},
      {"f32 split K", WeightFormat::kF32, 5, 1024, {2}},
      {"fp8 not 16-byte rows", WeightFormat::kFp8Tiles, 9, 36, {1, 5}},
      {"fp4 payload +4B", WeightFormat::kFp4Rows, 9, 64, {1, 5}, 4},
  };
  uint64_t seed = 4000;
  for (const LinearCase& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw, c.misalign);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : c.ns) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = run_linear(dw.dw, dx.p, n, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      auto got = dy.get();
      report("linear small",
             std::string(c.what) + " " + fmt_name(c.format) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n),
             rel_to_max(got, want), kLinearTol, kLinearWhy);
      auto again = dy.get();
      Status s2 = run_linear(dw.dw, dx.p, n, dy.p, nullptr);
      ASSERT_TRUE(s2.ok()) << s2.message();
      again = dy.get();
      EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0) << c.what << " not deterministic";
    }
  }
  // Every E8M0 range of the decoders (FP4: 2^14 * scale a float up to 240, the f16 pre-multiply
  // above; the subnormal scale 0): one scale for the whole matrix, x scaled by its inverse.
  for (WeightFormat f : {WeightFormat::kFp4Rows, WeightFormat::kFp8Tiles})
    for (int e : {0, 1, 2, 100, 127, 200, 240, 241, 250, 254}) {
      backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
      HostWeight hw = make_weight(f, 3, 256, ++seed);
      std::fill(hw.scale.begin(), hw.scale.end(), static_cast<uint8_t>(e));
      DevWeight dw(hw);
      const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
      auto x = rand_floats(256, ++seed);
      for (float& v : x) v = std::ldexp(v, 127 - e);
      std::vector<float> want(3);
      cpu.linear(ref, x.data(), 1, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = run_linear(dw.dw, dx.p, 1, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      report("linear small", std::string(fmt_name(f)) + " 3x256 e8m0=" + std::to_string(e), rel_to_max(dy.get(), want),
             kLinearTol, kLinearWhy);
    }
  for (int64_t n : {1, 3, 8}) {  // x not 16-byte aligned: the per-float staging of x
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, 37, 592, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    auto x = rand_floats(static_cast<size_t>(n * 592 + 1), ++seed);
    std::vector<float> want(static_cast<size_t>(n * 37));
    cpu.linear(ref, x.data() + 1, n, want.data());
    Dev<float> dx(x), dy(want.size());
    Status s = run_linear(dw.dw, dx.p + 1, n, dy.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    report("linear small", "fp8 37x592 x+4B n=" + std::to_string(n), rel_to_max(dy.get(), want), kLinearTol,
           kLinearWhy);
  }
  {  // grouped: 4 groups of 24 rows, K 512 (FP8), n 1 / 3 / 8
    backends::cpu::CpuBackend cpu(&ref_pool());
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, 96, 512, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : {1, 3, 8}) {
      auto x = rand_floats(static_cast<size_t>(n * 4 * 512), ++seed);
      std::vector<float> want(static_cast<size_t>(n * 96));
      cpu.grouped_linear(ref, 4, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = run_grouped_linear(dw.dw, 4, dx.p, n, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      report("grouped_linear small", "fp8 g=4 96x512 n=" + std::to_string(n), rel_to_max(dy.get(), want), kLinearTol,
             kLinearWhy);
    }
  }
  // Experts: 12 experts (every third mostly empty), one row each or up to 5; FP4 / FP8 / BF16 / F32,
  // plus BF16 rows of 24 bytes (the V = 4 body inside the streaming expert kernel).
  struct SmallExpert {
    WeightFormat format;
    int64_t out, in;
  };
  for (const SmallExpert& c : {SmallExpert{WeightFormat::kFp4Rows, 40, 320}, SmallExpert{WeightFormat::kFp8Tiles, 24, 272},
                               SmallExpert{WeightFormat::kBF16, 20, 136}, SmallExpert{WeightFormat::kF32, 18, 68},
                               SmallExpert{WeightFormat::kBF16, 17, 12}}) {
    const int64_t E = 12;
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    const size_t pb = static_cast<size_t>(quant::weight_payload_bytes(c.format, c.out, c.in));
    const size_t sb = static_cast<size_t>(quant::weight_scale_bytes(c.format, c.out, c.in));
    std::vector<HostWeight> hws;
    std::vector<uint8_t> data, scale;
    for (int64_t e = 0; e < E; ++e) {
      hws.push_back(make_weight(c.format, c.out, c.in, ++seed));
      data.insert(data.end(), hws.back().data.begin(), hws.back().data.end());
      scale.insert(scale.end(), hws.back().scale.begin(), hws.back().scale.end());
    }
    Dev<uint8_t> ddata(data), dscale(std::max<size_t>(scale.size(), 1));
    if (!scale.empty()) dscale.put(scale);
    std::vector<DeviceWeight> dws(E);
    std::vector<ops::WeightRef> refs(E);
    for (int64_t e = 0; e < E; ++e) {
      dws[e] = DeviceWeight{c.format, c.out, c.in, ddata.p + e * pb, sb ? dscale.p + e * sb : nullptr};
      refs[e] = host_ref(hws[e], hws[e].data.data(), sb ? hws[e].scale.data() : nullptr);
    }
    Dev<DeviceWeight> dweights(dws);
    for (int64_t n : {1, 2, 5}) {  // tokens, k = 3: m = 3n rows (n = 5: 15 > E, units of 8 rows)
      const auto off = routed_offsets(n, 3, E, ++seed, 3);
      const int64_t m = off[E], m_max = m + 2;
      auto x = rand_floats(static_cast<size_t>(m_max * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(m * c.out));
      for (int64_t e = 0; e < E; ++e)
        if (off[e + 1] > off[e])
          cpu.linear(refs[e], x.data() + off[e] * c.in, off[e + 1] - off[e], want.data() + off[e] * c.out);
      Dev<int64_t> doff(off);
      Dev<float> dx(x), dy(static_cast<size_t>(m_max * c.out));
      cudaMemset(dy.p, 0xff, dy.n * sizeof(float));
      Status s = run_expert_linear(dweights.p, E, c.out, c.in, doff.p, dx.p, m_max, dy.p, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      auto got = dy.get();
      size_t touched = 0;
      for (size_t i = static_cast<size_t>(m * c.out); i < got.size(); ++i) touched += bits_of(got[i]) != 0xffffffffu;
      EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
      got.resize(want.size());
      report("expert_linear small",
             std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n) +
                 " m=" + std::to_string(m),
             rel_to_max(got, want), kLinearTol, kLinearWhy);
    }
  }
}

// Invalid shapes come back as invalid_argument before any launch: no device needed.
// The persistent GEMV (n <= 8, x staged once per block) with its row-group slots capped at 1 and 3
// blocks: every warp loops over many row groups, batches of a row (bpr > 1, K tails) and the
// switch to the next row group's loads while the current one is decoded; ragged last row groups
// (R = 2 / 4); grouped launches; experts with several row groups per warp. Small enough for the host
// SIMT emulator.
TEST(LinearParity, PersistentLoops) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_persist_slot_cap_for_tests(0);
      set_persist_ring_for_tests(-1);
      set_tc_gemv_for_tests(-1);
    }
  } reset;
  set_tc_gemv_for_tests(0);  // the CUDA-core persistent kernel's table
  const std::vector<LinearCase> cases = {
      {"fp8 2 batches/row", WeightFormat::kFp8Tiles, 203, 4096, {1, 2, 4, 7}},  // 256 chunks per row
      {"fp8 K tail", WeightFormat::kFp8Tiles, 131, 592, {1, 3, 8}},
      {"bf16 K tail", WeightFormat::kBF16, 70, 1032, {1, 2, 6}},  // 129 chunks
      {"f32", WeightFormat::kF32, 45, 516, {1, 5}},
      {"fp4", WeightFormat::kFp4Rows, 77, 4160, {1}},  // 130 chunks: 2 batches, a 2-chunk tail
  };
  uint64_t seed = 9000;
  // Both pipelines: the register double buffer (ring 0) and the cp.async shared-memory ring (1).
  for (int mode : {0, 2, 3}) {
    const int cap = mode == 0 ? 1 : mode - 1;  // (regs, 1 slot), (ring, 1 slot), (ring, 2 slots)
    set_persist_ring_for_tests(mode == 0 ? 0 : 1);
    set_persist_slot_cap_for_tests(cap);
    for (const LinearCase& c : cases) {
      backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
      HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
      DevWeight dw(hw);
      const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
      for (int64_t n : c.ns) {
        auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
        std::vector<float> want(static_cast<size_t>(n * c.out));
        cpu.linear(ref, x.data(), n, want.data());
        Dev<float> dx(x), dy(want.size());
        ASSERT_TRUE(run_linear(dw.dw, dx.p, n, dy.p, nullptr).ok());
        auto got = dy.get();
        report("linear persistent",
               std::string(c.what) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n) +
                   " slots<=" + std::to_string(cap) + (mode ? " ring" : " regs"),
               rel_to_max(got, want), kLinearTol, kLinearWhy);
        ASSERT_TRUE(run_linear(dw.dw, dx.p, n, dy.p, nullptr).ok());
        auto again = dy.get();
        EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0) << c.what << " not deterministic";
      }
    }
    {  // grouped: 3 groups of 50 rows, K 1024
      backends::cpu::CpuBackend cpu(&ref_pool());
      HostWeight hw = make_weight(WeightFormat::kFp8Tiles, 150, 1024, ++seed);
      DevWeight dw(hw);
      const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
      for (int64_t n : {1, 4}) {
        auto x = rand_floats(static_cast<size_t>(n * 3 * 1024), ++seed);
        std::vector<float> want(static_cast<size_t>(n * 150));
        cpu.grouped_linear(ref, 3, x.data(), n, want.data());
        Dev<float> dx(x), dy(want.size());
        ASSERT_TRUE(run_grouped_linear(dw.dw, 3, dx.p, n, dy.p, nullptr).ok());
        report("grouped_linear persistent",
               "fp8 g=3 150x1024 n=" + std::to_string(n) + " slots<=" + std::to_string(cap) + (mode ? " ring" : " regs"),
               rel_to_max(dy.get(), want), kLinearTol, kLinearWhy);
      }
    }
    {  // experts: 6 of 10 used, one row each, 90 rows of K 2048 (FP4: 64 chunks)
      const int64_t E = 10, out = 90, in = 2048;
      backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
      const Experts ex = make_experts(WeightFormat::kFp4Rows, E, out, in, seed);
      const std::vector<ops::WeightRef>& refs = ex.refs;
      const std::vector<int64_t> off = {0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 6};
      auto x = rand_floats(static_cast<size_t>(6 * in), ++seed);
      std::vector<float> want(static_cast<size_t>(6 * out));
      for (int64_t e = 0; e < E; ++e)
        if (off[e + 1] > off[e]) cpu.linear(refs[e], x.data() + off[e] * in, 1, want.data() + off[e] * out);
      Dev<int64_t> doff(off);
      Dev<float> dx(x), dy(want.size());
      ASSERT_TRUE(run_expert_linear(ex.dweights->p, E, out, in, doff.p, dx.p, 6, dy.p, nullptr).ok());
      report("expert_linear persistent", "fp4 10 experts 90x2048 m=6 slots<=" + std::to_string(cap) + (mode ? " ring" : " regs"),
             rel_to_max(dy.get(), want), kLinearTol, kLinearWhy);
    }
  }
}

// The tensor-core GEMV of decode (tc_gemv_kernels.h): n = 1, 2 over FP8 tiles and FP4 rows, forced
// on and off on the same inputs (both against the CPU op): ragged last row groups (out % 16 != 0),
// K splits across warps (few rows, long K) and none (many rows), grouped launches (out % 16 == 0),
// rows of x with magnitudes far from 1 and mixed within a row (the per-row power of two and the
// three f16 parts), experts with one or two rows (units of 2), empty experts and m_max above the
// routed rows. Small enough for the host SIMT emulator.
TEST(LinearParity, TensorCoreGemv) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_persist_slot_cap_for_tests(0);
      set_tc_gemv_rows_per_block_for_tests(0);
    }
  } reset;
  struct Case {
    const char* what;
    WeightFormat format;
    int64_t out, in;
    float xscale;
    bool mixed;  // every 7th element of x times 2^20
  };
  const std::vector<Case> cases = {
      {"fp8 ragged, split K", WeightFormat::kFp8Tiles, 77, 2048, 1.0f, false},
      {"fp8 many rows", WeightFormat::kFp8Tiles, 1040, 256, 1.0f, false},
      {"fp8 x ~1e30", WeightFormat::kFp8Tiles, 48, 512, 1e30f, false},
      {"fp8 x ~1e-30, mixed", WeightFormat::kFp8Tiles, 40, 1024, 1e-30f, true},
      {"fp4 ragged, split K", WeightFormat::kFp4Rows, 45, 4096, 1.0f, false},
      {"fp4 mixed", WeightFormat::kFp4Rows, 300, 512, 3.0f, true},
      {"fp4 K % 128 != 0 (cuda cores)", WeightFormat::kFp4Rows, 40, 2080, 1.0f, false},
      // BF16 (the head, the MoE gate, the compressor): bf16 parts of x, no scales.
      {"bf16 ragged, split K", WeightFormat::kBF16, 77, 2048, 1.0f, false},
      {"bf16 x ~1e30", WeightFormat::kBF16, 48, 512, 1e30f, false},
      {"bf16 x ~1e-30, mixed", WeightFormat::kBF16, 40, 1024, 1e-30f, true},
      {"bf16 K % 32 != 0 (cuda cores)", WeightFormat::kBF16, 24, 1048, 1.0f, false},
  };
  uint64_t seed = 12000;
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : {1, 2, 7}) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed, c.xscale);
      if (c.mixed)
        for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1048576.0f;
      if (n == 7)  // rows of different magnitudes in one block (each row its own power of two)
        for (int64_t r = 0; r < n; ++r)
          for (int64_t k = 0; k < c.in; ++k) x[r * c.in + k] = std::ldexp(x[r * c.in + k], static_cast<int>(5 * r - 12));
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      // Tensor cores with the device's fill of blocks and with 1 or 3 blocks (each loops over many
      // row-group batches, the next batch's loads issued before the reduction); CUDA cores. 7 rows:
      // also x rows per block forced to 3, 4 and 6 (the launcher's pick is 2 for weights this small):
      // the column tiles of one decoded A fragment, ragged last units.
      std::vector<int> modes = {1, 2, 3, 0};
      if (n == 7) modes = {1, 2, 0, 4, 5, 6};
      for (int mode : modes) {
        set_tc_gemv_for_tests(mode == 0 ? 0 : 1);
        set_persist_slot_cap_for_tests(mode == 2 ? 1 : (mode == 3 ? 3 : 0));
        set_tc_gemv_rows_per_block_for_tests(mode == 4 ? 3 : mode == 5 ? 4 : mode == 6 ? 6 : 0);
        // row_invariant: BF16 takes the tensor cores only for such calls (decode steps, verifications).
        ASSERT_TRUE(run_linear(dw.dw, dx.p, n, dy.p, nullptr, true).ok());
        report("linear tc-gemv",
               std::string(c.what) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n) +
                   (mode == 0   ? " cuda cores"
                    : mode == 1 ? " tensor cores"
                    : mode == 2 ? " tc 1 block"
                    : mode == 3 ? " tc 3 blocks"
                                : " tc " + std::to_string(mode == 4 ? 3 : mode == 5 ? 4 : 6) + " rows per block"),
               rel_to_max(dy.get(), want), kLinearTol, kLinearWhy);
      }
      set_persist_slot_cap_for_tests(0);
      set_tc_gemv_rows_per_block_for_tests(0);
    }
  }
  {  // grouped: 4 groups of 32 rows (FP8), K 512
    backends::cpu::CpuBackend cpu(&ref_pool());
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, 128, 512, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : {1, 2}) {
      auto x = rand_floats(static_cast<size_t>(n * 4 * 512), ++seed);
      std::vector<float> want(static_cast<size_t>(n * 128));
      cpu.grouped_linear(ref, 4, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      set_tc_gemv_for_tests(1);
      ASSERT_TRUE(run_grouped_linear(dw.dw, 4, dx.p, n, dy.p, nullptr).ok());
      report("grouped_linear tc-gemv", "fp8 g=4 128x512 n=" + std::to_string(n), rel_to_max(dy.get(), want),
             kLinearTol, kLinearWhy);
    }
  }
  for (int variant = 0; variant < 5; ++variant) {
    // 9 experts, 5 used: rows 2, 1, 0, 0, 3 (two units), 1, 0, 0, 2; m_max 11 (2 past the rows).
    // Variant 2: FP4 with every expert's scales one byte off 4-byte alignment (byte loads).
    // Variants 3 (FP4, 3 x rows per block forced) and 4 (FP8, 6 forced): 3 of 9 experts used with 7,
    // 5 and 17 rows (units of more than two rows, ragged last units).
    const WeightFormat f = (variant == 1 || variant == 4) ? WeightFormat::kFp8Tiles : WeightFormat::kFp4Rows;
    const size_t shift = variant == 2 ? 1 : 0;
    const int64_t E = 9, out = 80, in = 1024;
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    const Experts ex = make_experts(f, E, out, in, seed, shift);
    const std::vector<ops::WeightRef>& refs = ex.refs;
    const std::vector<int64_t> off = variant >= 3 ? std::vector<int64_t>{0, 7, 7, 7, 12, 12, 12, 12, 29, 29}
                                                  : std::vector<int64_t>{0, 2, 3, 3, 3, 6, 7, 7, 7, 9};
    set_tc_gemv_rows_per_block_for_tests(variant == 4 ? 6 : variant == 3 ? 3 : 0);
    const int64_t m = off[E], m_max = m + 2;
    auto x = rand_floats(static_cast<size_t>(m_max * in), ++seed);
    std::vector<float> want(static_cast<size_t>(m * out));
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        cpu.linear(refs[e], x.data() + off[e] * in, off[e + 1] - off[e], want.data() + off[e] * out);
    Dev<int64_t> doff(off);
    Dev<float> dx(x), dy(static_cast<size_t>(m_max * out));
    set_tc_gemv_for_tests(1);
    cudaMemset(dy.p, 0xff, dy.n * sizeof(float));
    ASSERT_TRUE(run_expert_linear(ex.dweights->p, E, out, in, doff.p, dx.p, m_max, dy.p, nullptr, f).ok());
    auto got = dy.get();
    size_t touched = 0;
    for (size_t i = static_cast<size_t>(m * out); i < got.size(); ++i) touched += bits_of(got[i]) != 0xffffffffu;
    EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
    got.resize(want.size());
    set_tc_gemv_rows_per_block_for_tests(0);
    report("expert_linear tc-gemv", std::string(fmt_name(f)) + " 9 experts 80x1024 m=" + std::to_string(m) +
                                        (variant >= 3 ? (variant == 4 ? " units of <= 6" : " units of <= 3")
                                                      : " units of <= 2") +
                                        (shift ? " scales +1B" : ""),
           rel_to_max(got, want), kLinearTol, kLinearWhy);
  }
}

// Row-count invariance of the decode GEMV (tc_gemv_kernels.h): a row of x gets the same bits alone,
// in any batch (dense: up to 40 rows here, past the 16 of a row-pair grid's first launches) and in
// any routing of about one row per expert (experts) —
// what DSpark's bit-exact rollback (a verification forward of B + 1 rows leaves the state a one-row
// decode leaves) and batch-invariant decode rely on. Shapes with K split across warps and without,
// ragged row groups, and grouped FP8; rows of very different magnitudes in one batch (each row's
// own power of two).
TEST(LinearParity, DecodeGemvRowCountInvariance) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_rows_per_block_for_tests(0);
    }
  } reset;
  set_tc_gemv_for_tests(1);
  uint64_t seed = 13000;
  struct Case {
    WeightFormat format;
    int64_t out, in, groups;
  };
  for (const Case& c : {Case{WeightFormat::kFp8Tiles, 77, 2048, 1}, Case{WeightFormat::kFp8Tiles, 1040, 256, 1},
                        Case{WeightFormat::kFp4Rows, 45, 4096, 1}, Case{WeightFormat::kFp4Rows, 300, 512, 1},
                        Case{WeightFormat::kFp8Tiles, 128, 512, 4}}) {
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const int64_t N = 40, ldx = c.in * c.groups;
    auto x = rand_floats(static_cast<size_t>(N * ldx), ++seed);
    for (int64_t r = 0; r < N; ++r)  // row r scaled by 2^(3 (r % 16) - 20): rows of many exponents
      for (int64_t k = 0; k < ldx; ++k)
        x[r * ldx + k] = std::ldexp(x[r * ldx + k], static_cast<int>(3 * (r % 16) - 20));
    Dev<float> dx(x);
    auto run = [&](int64_t r0, int64_t n) {
      Dev<float> dy(static_cast<size_t>(n * c.out));
      // row_invariant: what decode steps and verification forwards ask for (any n on these kernels).
      const Status st = c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, dx.p + r0 * ldx, n, dy.p, nullptr, true)
                                     : run_linear(dw.dw, dx.p + r0 * ldx, n, dy.p, nullptr, true);
      EXPECT_TRUE(st.ok()) << st.message();
      return dy.get();
    };
    const std::vector<float> all = run(0, N);
    size_t differ = 0;
    for (const auto& [r0, n] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {5, 1}, {15, 1}, {39, 1}, {1, 2}, {3, 3}, {6, 6}, {2, 8}, {4, 12}, {0, 16}, {7, 18}, {1, 36}}) {
      const std::vector<float> part = run(r0, n);
      for (int64_t i = 0; i < n * c.out; ++i) differ += bits_of(part[i]) != bits_of(all[r0 * c.out + i]);
    }
    // Every x-rows-per-block choice (a row lands in another column of another column tile): the
    // same bits as the launcher's pick.
    for (int nb : {2, 3, 4, 6}) {
      set_tc_gemv_rows_per_block_for_tests(nb);
      for (const auto& [r0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, N}, {3, 5}, {9, 1}}) {
        const std::vector<float> part = run(r0, n);
        for (int64_t i = 0; i < n * c.out; ++i) differ += bits_of(part[i]) != bits_of(all[r0 * c.out + i]);
      }
    }
    set_tc_gemv_rows_per_block_for_tests(0);
    report("linear row-count invariance",
           std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " g=" + std::to_string(c.groups) +
               " rows alone / in batches of 1-36 vs 40: bits differing",
           static_cast<double>(differ), 0, "a row's order depends on the weight's shape only");
    EXPECT_EQ(differ, 0u);
  }
  for (WeightFormat f : {WeightFormat::kFp4Rows, WeightFormat::kFp8Tiles})
    for (int nb : {0, 3, 6}) {  // x rows per block: the launcher's pick (2 here), 3, 6
    // 12 experts; a batch of 6 tokens routed to 3 experts each (m = 18, some experts with 3 rows),
    // then every row routed alone to its expert: the same bits.
    const int64_t E = 12, out = 80, in = 1024;
    const Experts ex = make_experts(f, E, out, in, seed);
    const std::vector<int64_t> off = {0, 2, 3, 6, 6, 8, 9, 11, 11, 13, 15, 16, 18};
    const int64_t m = off[E];
    auto x = rand_floats(static_cast<size_t>(m * in), ++seed);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t k = 0; k < in; ++k) x[r * in + k] = std::ldexp(x[r * in + k], static_cast<int>(2 * r - 15));
    Dev<float> dx(x);
    Dev<int64_t> doff(off);
    Dev<float> dy(static_cast<size_t>(m * out));
    set_tc_gemv_rows_per_block_for_tests(nb);  // the batch; each row alone with the launcher's pick
    ASSERT_TRUE(run_expert_linear(ex.dweights->p, E, out, in, doff.p, dx.p, m, dy.p, nullptr, f).ok());
    set_tc_gemv_rows_per_block_for_tests(0);
    const std::vector<float> all = dy.get();
    size_t differ = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t r = off[e]; r < off[e + 1]; ++r) {
        std::vector<int64_t> one(static_cast<size_t>(E + 1), 0);
        for (int64_t j = e + 1; j <= E; ++j) one[j] = 1;
        Dev<int64_t> done(one);
        Dev<float> dy1(static_cast<size_t>(out));
        ASSERT_TRUE(run_expert_linear(ex.dweights->p, E, out, in, done.p, dx.p + r * in, 1, dy1.p, nullptr, f).ok());
        const std::vector<float> got = dy1.get();
        for (int64_t i = 0; i < out; ++i) differ += bits_of(got[i]) != bits_of(all[r * out + i]);
      }
    report("expert_linear row-count invariance",
           std::string(fmt_name(f)) + " 12 experts 80x1024 m=18 (" + (nb ? std::to_string(nb) : std::string("auto")) +
               " rows per block) vs each row alone: bits differing",
           static_cast<double>(differ), 0, "a row's order depends on the expert's shape only");
    EXPECT_EQ(differ, 0u);
  }
}

// The balanced KS rule's picks (host only, no device): the released shapes on 264 reference blocks (132
// SMs x 2), docs/perf/README.md (session of 2026-12-06 08:47 UTC) for the measurements behind them.
TEST(LinearParity, BalancedKsRule) {
  using cuda::tcg::balanced_ks_log2;
  // wo_b 5120 x 8192: KS 8 leaves 320 batches on 264 slots (two rounds) -> KS 4, 160 blocks, one round.
  EXPECT_EQ(balanced_ks_log2(3, 320, 1, 1, false, 264), 2);
  // wo_a 8 groups of 64 row groups: 64 batches on 33 slots per group -> KS 4, 32 per group.
  EXPECT_EQ(balanced_ks_log2(3, 64, 8, 1, false, 264), 2);
  // wq_a 1280 rows: one round at KS 8 already; fewer warps would halve the launch.
  EXPECT_EQ(balanced_ks_log2(3, 80, 1, 1, false, 264), 3);
  // wq_b 32768 rows at the old rule's KS 2: 512 batches on 264 slots -> KS 1, 256 blocks, one round.
  EXPECT_EQ(balanced_ks_log2(1, 2048, 1, 1, false, 264), 0);
  // the shared expert's w1 / w3 pair: 144 row groups per matrix on 132 slots each -> KS 4.
  EXPECT_EQ(balanced_ks_log2(3, 144, 1, 2, false, 264), 2);
  // 600 row groups: three rounds at KS 8, two at 4, one at 2 (150 blocks >= half); KS 1 (75 blocks) is not
  // considered, though also one round.
  EXPECT_EQ(balanced_ks_log2(3, 600, 1, 1, false, 264), 1);
  // the head (8,080 row groups, old rule KS 1): nothing below.
  EXPECT_EQ(balanced_ks_log2(0, 8080, 1, 1, false, 264), 0);
  // the gate (24 row groups): one round, small launch: unchanged.
  EXPECT_EQ(balanced_ks_log2(3, 24, 1, 1, false, 264), 3);
  // a fused pair (both matrices in each block, KS <= 4): 144 row groups, 2 per block at KS 4 -> 72
  // blocks (< half): stays.
  EXPECT_EQ(balanced_ks_log2(2, 144, 1, 2, true, 264), 2);
}

// Row-count invariance where the balanced rule changes KS (wo_b and wo_a at the released widths, both
// rules): a row alone, in 5 and in 9 rows, the same bits; and within the parity tolerance of the CPU op.
TEST(LinearParity, BalancedKsRowCountInvariance) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      cuda::tcg::set_ks_balance_for_tests(-1);
    }
  } reset;
  set_tc_gemv_for_tests(1);
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    const char* what;
    int64_t out, in, groups;  // out over all groups, in per group (run_grouped_linear's shapes)
  };
  const std::vector<Case> cases = emu ? std::vector<Case>{{"small", 1280, 512, 1}, {"small grouped", 1024, 256, 4}}
                                      : std::vector<Case>{{"wo_b", 5120, 8192, 1}, {"wo_a", 8192, 4096, 8}};
  uint64_t seed = 13500;
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool());
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    const int64_t N = 9, ldx = c.in * c.groups;
    auto x = rand_floats(static_cast<size_t>(N * ldx), ++seed);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < ldx; ++k) x[r * ldx + k] = std::ldexp(x[r * ldx + k], static_cast<int>(5 * r - 20));
    std::vector<float> want(static_cast<size_t>(N * c.out));
    if (c.groups > 1)
      cpu.grouped_linear(ref, c.groups, x.data(), N, want.data());
    else
      cpu.linear(ref, x.data(), N, want.data());
    Dev<float> dx(x);
    auto run = [&](int64_t r0, int64_t n) {
      Dev<float> dy(static_cast<size_t>(n * c.out));
      const Status st = c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, dx.p + r0 * ldx, n, dy.p, nullptr, true)
                                     : run_linear(dw.dw, dx.p + r0 * ldx, n, dy.p, nullptr, true);
      EXPECT_TRUE(st.ok()) << st.message();
      return dy.get();
    };
    for (int balance : {1, 0}) {
      cuda::tcg::set_ks_balance_for_tests(balance);
      const std::vector<float> all = run(0, N);
      size_t differ = 0;
      for (const auto& [r0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {4, 1}, {8, 1}, {2, 5}}) {
        const std::vector<float> part = run(r0, n);
        for (int64_t i = 0; i < n * c.out; ++i) differ += bits_of(part[i]) != bits_of(all[r0 * c.out + i]);
      }
      const std::string name = std::string(c.what) + " fp8 " + dims({c.out, c.in}) + " g=" +
                               std::to_string(c.groups) + (balance ? " balanced KS" : " old KS rule");
      report("linear row-count invariance", name + ": rows alone / in 5 vs 9: bits differing",
             static_cast<double>(differ), 0, "KS from the weight's shape only");
      EXPECT_EQ(differ, 0u) << name;
      report("linear (KS rule)", name + " n=9 vs the CPU op", rel_to_max(all, want), kLinearTol, kLinearWhy);
    }
  }
}

// The FP8 16-byte pieces (Fp8x2, DS41_TCG_FP8_WIDE=1): within the parity tolerance of the CPU op (ragged
// rows, split K, x ~1e30 and ~1e-30 with mixed magnitudes, rows of different powers of two, 1 and 3
// blocks, grouped FP8; wq_b and wo_b at the released widths on a device), a row's bits the same alone
// and in a call of 7 rows, and a tile whose scale byte leaves the fast window (the exact path of the
// pair's second tile); K % 64 != 0 keeps the 8-byte pieces.
TEST(LinearParity, TensorCoreGemvFp8WidePieces) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_fp8_wide_for_tests(-1);
      set_persist_slot_cap_for_tests(0);
    }
  } reset;
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    const char* what;
    int64_t out, in, groups;
    float xscale;
    bool mixed, bad_scale;
  };
  std::vector<Case> cases = {{"ragged, split K", 77, 2048, 1, 1.0f, false, false},
                             {"many rows", 1040, 256, 1, 1.0f, false, false},
                             {"x ~1e30", 48, 512, 1, 1e30f, false, false},
                             {"x ~1e-30, mixed", 40, 1024, 1, 1e-30f, true, false},
                             {"scale 200 in tile 3 (exact path)", 32, 256, 1, 1.0f, false, true},
                             {"K % 64 != 0 (8-byte pieces)", 40, 224, 1, 1.0f, false, false},
                             {"grouped 4 x 32", 128, 512, 4, 1.0f, false, false}};
  if (!emu) {
    cases.push_back({"wq_b", 32768, 1280, 1, 1.0f, false, false});
    cases.push_back({"wo_b", 5120, 8192, 1, 1.0f, false, false});
  }
  uint64_t seed = 16000;
  set_tc_gemv_for_tests(1);
  set_tc_gemv_fp8_wide_for_tests(1);
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, c.out, c.in, ++seed);
    if (c.bad_scale) hw.scale[3] = 200;  // 2^73 x max E4M3 still finite in float: the exact path's arithmetic
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    const int64_t ldx = c.in * c.groups;
    for (int64_t n : {1, 3, 7}) {
      auto x = rand_floats(static_cast<size_t>(n * ldx), ++seed, c.xscale);
      if (c.mixed)
        for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1048576.0f;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < ldx; ++k) x[r * ldx + k] = std::ldexp(x[r * ldx + k], static_cast<int>(5 * r - 12));
      std::vector<float> want(static_cast<size_t>(n * c.out));
      if (c.groups > 1)
        cpu.grouped_linear(ref, c.groups, x.data(), n, want.data());
      else
        cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      for (int cap : {0, 1, 3}) {
        set_persist_slot_cap_for_tests(cap);
        const Status st = c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, dx.p, n, dy.p, nullptr, true)
                                       : run_linear(dw.dw, dx.p, n, dy.p, nullptr, true);
        ASSERT_TRUE(st.ok()) << st.message();
        const std::vector<float> got = dy.get();
        report("linear fp8 wide", std::string(c.what) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n) +
                                      (cap ? " " + std::to_string(cap) + " blocks" : std::string()),
               rel_to_max(got, want), kLinearTol, kLinearWhy);
        if (n == 7 && cap == 0) {  // each row alone: the same bits
          size_t differ = 0;
          for (int64_t r = 0; r < n; ++r) {
            Dev<float> d1(std::vector<float>(x.begin() + r * ldx, x.begin() + (r + 1) * ldx)), y1(c.out);
            ASSERT_TRUE((c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, d1.p, 1, y1.p, nullptr, true)
                                      : run_linear(dw.dw, d1.p, 1, y1.p, nullptr, true))
                            .ok());
            const std::vector<float> one = y1.get();
            for (int64_t i = 0; i < c.out; ++i) differ += bits_of(one[i]) != bits_of(got[r * c.out + i]);
          }
          report("linear fp8 wide", std::string(c.what) + " rows alone vs n=7: bits differing",
                 static_cast<double>(differ), 0, "KS and the pieces from the weight's shape only");
        }
      }
      set_persist_slot_cap_for_tests(0);
    }
  }
}

// FP4 steps whose four tiles do not all pass the scale window (DS41_TCG_STEP_FAST: such a step leaves the
// straight fast path and tests each tile): rows with one tile's scale at 200 (2^73: the exact path) in the
// first, a middle and the last step of a row, a row whose every tile is outside, beside rows wholly inside;
// within the parity tolerance of the CPU op, and each row's bits the same alone and in a call of 3 rows.
TEST(LinearParity, TensorCoreGemvFp4StepsOutsideTheWindow) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() { set_tc_gemv_for_tests(-1); }
  } reset;
  set_tc_gemv_for_tests(1);
  const int64_t out = 40, in = 1024, tiles = in / 32;  // 8 steps of four tiles per row
  HostWeight hw = make_weight(WeightFormat::kFp4Rows, out, in, 17001);
  for (int64_t t : {1, 14, 31}) hw.scale[3 * tiles + t] = 200;
  for (int64_t t = 0; t < tiles; ++t) hw.scale[17 * tiles + t] = 200;
  hw.scale[39 * tiles + 5] = 200;
  DevWeight dw(hw);
  const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  const int64_t n = 3;
  const auto x = rand_floats(static_cast<size_t>(n * in), 17002, 1.0f);
  std::vector<float> want(static_cast<size_t>(n * out));
  cpu.linear(ref, x.data(), n, want.data());
  Dev<float> dx(x), dy(want.size());
  ASSERT_TRUE(run_linear(dw.dw, dx.p, n, dy.p, nullptr, true).ok());
  const std::vector<float> got = dy.get();
  // Per output (rows 3, 17 and 39 are ~2^73 times the others: one maximum over all would hide the others' errors).
  double err = 0;
  for (int64_t o = 0; o < out; ++o) {
    std::vector<float> g, w;
    for (int64_t r = 0; r < n; ++r) {
      g.push_back(got[r * out + o]);
      w.push_back(want[r * out + o]);
    }
    err = std::max(err, rel_to_max(g, w));
  }
  report("linear fp4 tc-gemv", "steps outside the scale window " + dims({out, in}) + " n=3, worst output", err,
         kLinearTol, kLinearWhy);
  size_t differ = 0;
  for (int64_t r = 0; r < n; ++r) {
    Dev<float> d1(std::vector<float>(x.begin() + r * in, x.begin() + (r + 1) * in)), y1(out);
    ASSERT_TRUE(run_linear(dw.dw, d1.p, 1, y1.p, nullptr, true).ok());
    const std::vector<float> one = y1.get();
    for (int64_t i = 0; i < out; ++i) differ += bits_of(one[i]) != bits_of(got[r * out + i]);
  }
  report("linear fp4 tc-gemv", "steps outside the window: rows alone vs n=3, bits differing",
         static_cast<double>(differ), 0, "KS from the weight's shape only");
}

// run_linear_normed (the query path's RMSNorm inside wq_b's staging of x): the bits of run_rms_norm
// followed by run_linear, on the fused path (decode-sized calls and row_invariant ones, FP8 / FP4 /
// BF16; x left as it was) and on the fallback (the norm in place, then the plain call: 40 rows without
// row invariance); rows whose magnitudes differ by 2^40 (each row its own 1 / rms and power of two),
// a zero row, the two sums-of-squares layouts (n < 128 and a 130-row row_invariant call).
TEST(LinearParity, LinearNormedEqualsNormThenLinear) {
  DS41_SKIP_WITHOUT_GPU();
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct NormCase {
    WeightFormat f;
    int64_t out, in;
    std::vector<int64_t> ns;
    bool row_invariant;
  };
  std::vector<NormCase> cases = {{WeightFormat::kFp8Tiles, 48, 256, {1, 3, 7}, false},
                                 {WeightFormat::kFp4Rows, 40, 512, {1, 2}, false},
                                 {WeightFormat::kBF16, 24, 256, {1, 5}, true},
                                 {WeightFormat::kFp8Tiles, 32, 256, {40}, false}};
  if (!emu) {
    cases.push_back({WeightFormat::kFp8Tiles, 32768, 1280, {1, 6}, true});  // wq_b at the released width
    cases.push_back({WeightFormat::kFp8Tiles, 64, 1280, {130}, true});
  }
  uint64_t seed = 15000;
  set_tc_gemv_for_tests(1);
  for (const NormCase& c : cases) {
    const HostWeight hw = make_weight(c.f, c.out, c.in, ++seed);
    DevWeight dw(hw);
    std::vector<float> nw = rand_floats(static_cast<size_t>(c.in), ++seed);
    for (float& v : nw) v = 1.0f + 0.25f * v;
    Dev<float> dnw(nw);
    for (int64_t n : c.ns) {
      auto x = rand_floats(static_cast<size_t>(n * c.in), ++seed);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < c.in; ++k)
          x[r * c.in + k] = r == 1 ? 0.0f : std::ldexp(x[r * c.in + k], static_cast<int>(40 * (r % 3) - 40));
      const float eps = 1e-6f;
      Dev<float> dref_x(x), dx(x), dref(static_cast<size_t>(n * c.out)), dy(static_cast<size_t>(n * c.out));
      ASSERT_TRUE(run_rms_norm(dref_x.p, n, c.in, dnw.p, eps, dref_x.p, nullptr).ok());
      ASSERT_TRUE(run_linear(dw.dw, dref_x.p, n, dref.p, nullptr, c.row_invariant).ok());
      const Status st = run_linear_normed(dw.dw, dx.p, n, dy.p, dnw.p, eps, nullptr, c.row_invariant);
      ASSERT_TRUE(st.ok()) << st.message();
      const std::vector<float> want = dref.get(), got = dy.get();
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(want[i]);
      const bool fused = c.row_invariant || n <= 16;
      size_t x_changed = 0;
      if (fused) {
        const std::vector<float> xa = dx.get();
        for (size_t i = 0; i < xa.size(); ++i) x_changed += bits_of(xa[i]) != bits_of(x[i]);
      }
      report("linear_normed", std::string(fmt_name(c.f)) + " " + dims({c.out, c.in}) + " n=" + std::to_string(n) +
                                  (c.row_invariant ? " row_invariant" : "") + (fused ? " fused" : " fallback") +
                                  ": bits differing from rms_norm + linear",
             static_cast<double>(differ), 0, "run_rms_norm's sums and products inside the staging");
      EXPECT_EQ(differ, 0u);
      EXPECT_EQ(x_changed, 0u) << "the fused path leaves x as it was";
      // The one-launch form alone (an index source's wq_b and idx_wq_b both read the raw row): the same
      // bits where it takes the call, and where it does not, nothing written and x left raw.
      Dev<float> dx2(x), dy2(std::vector<float>(static_cast<size_t>(n * c.out), 7.0f));
      bool took = !fused;
      const Status st2 = try_linear_normed(dw.dw, dx2.p, n, dy2.p, dnw.p, eps, nullptr, c.row_invariant, &took);
      ASSERT_TRUE(st2.ok()) << st2.message();
      EXPECT_EQ(took, fused);
      const std::vector<float> got2 = dy2.get(), x2 = dx2.get();
      size_t differ2 = 0, x2_changed = 0;
      for (size_t i = 0; i < got2.size(); ++i) differ2 += bits_of(got2[i]) != bits_of(took ? want[i] : 7.0f);
      for (size_t i = 0; i < x2.size(); ++i) x2_changed += bits_of(x2[i]) != bits_of(x[i]);
      EXPECT_EQ(differ2, 0u);
      EXPECT_EQ(x2_changed, 0u);
    }
  }
  set_tc_gemv_for_tests(-1);
  Dev<float> dx(16), dy(16);
  const HostWeight hw = make_weight(WeightFormat::kFp8Tiles, 16, 32, 1);
  DevWeight dw(hw);
  const Status st = run_linear_normed(dw.dw, dx.p, 1, dy.p, nullptr, 1e-6f, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("norm_weight"), std::string::npos) << st.message();
}

// The tensor-core GEMV's shared-memory weight ring (tc_gemv_kernels.cu, DS41_TCG_RING): the weights
// reach the same arithmetic through stages filled by the bulk copy engine (rows) and cp.async (scale
// words) instead of registers, so every row's bits equal the register ring's. Ring depths forced and
// the launcher's rule (1); tasks shorter than one stage (K 256 / 512: fewer steps per warp than a
// stage holds, the last stage partial), long ones (K 2048 / 4096: stages refilled around the ring,
// split across warps), many row groups per block (1 and 3 blocks: the next task's stages issued
// before the reduction, the barriers' phases carried across tasks), rows past the end (77, 45: the
// clamped rows' copies), scales one byte off alignment (FP4: the rows' extra scale words; FP8: the
// byte's place in its word), grouped FP8, experts and expert pairs.
struct RingDense {
  WeightFormat format;
  int64_t out, in, groups;
};
struct RingPlan {
  std::vector<RingDense> dense;
  std::vector<int64_t> ns;
  std::vector<int> rings, caps, nbs;
  int64_t expert_in;
  std::vector<int> expert_rings;
};

void check_tc_gemv_ring(const RingPlan& plan, uint64_t seed) {
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_ring_for_tests(-1);
      set_tc_gemv_fp8_wide_for_tests(-1);
      set_persist_slot_cap_for_tests(0);
      set_tc_gemv_rows_per_block_for_tests(0);
    }
  } reset;
  set_tc_gemv_for_tests(1);
  set_tc_gemv_fp8_wide_for_tests(0);  // the ring serves the 8-byte FP8 pieces only
  for (const RingDense& c : plan.dense) {
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const int64_t ldx = c.in * c.groups;
    for (int64_t n : plan.ns) {
      auto x = rand_floats(static_cast<size_t>(n * ldx), ++seed);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < ldx; ++k) x[r * ldx + k] = std::ldexp(x[r * ldx + k], static_cast<int>(4 * r - 9));
      Dev<float> dx(x);
      auto run = [&](int ring, int cap, int nb) {
        set_tc_gemv_ring_for_tests(ring);
        set_persist_slot_cap_for_tests(cap);
        set_tc_gemv_rows_per_block_for_tests(nb);
        Dev<float> dy(static_cast<size_t>(n * c.out));
        const Status st = c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, dx.p, n, dy.p, nullptr, true)
                                       : run_linear(dw.dw, dx.p, n, dy.p, nullptr, true);
        EXPECT_TRUE(st.ok()) << st.message();
        return dy.get();
      };
      const std::vector<float> regs = run(0, 0, 0);
      size_t differ = 0;
      for (int ring : plan.rings)
        for (int cap : plan.caps)
          for (int nb : plan.nbs) {
            const std::vector<float> got = run(ring, cap, nb);
            for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(regs[i]);
          }
      report("linear tc-gemv ring",
             std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) + " g=" + std::to_string(c.groups) +
                 " n=" + std::to_string(n) + " rings x blocks x rows per block vs registers: bits differing",
             static_cast<double>(differ), 0, "the same bytes reach the same arithmetic");
      EXPECT_EQ(differ, 0u);
    }
  }
  set_persist_slot_cap_for_tests(0);
  set_tc_gemv_rows_per_block_for_tests(0);
  for (WeightFormat f : {WeightFormat::kFp4Rows, WeightFormat::kFp8Tiles})
    for (size_t shift : {size_t{0}, size_t{1}, size_t{2}}) {
      if (shift == 2 && f != WeightFormat::kFp8Tiles) continue;
      // shift 2: FP8 payload 8 bytes past 16-byte alignment (the ring copies those rows itself).
      const int64_t E = 9, out = 80, in = plan.expert_in;
      const size_t data_shift = shift == 2 ? 8 : 0, scale_shift = shift == 1 ? 1 : 0;
      const Experts w1 = make_experts(f, E, out, in, seed, scale_shift, data_shift);
      const Experts w3 = make_experts(f, E, out, in, seed, scale_shift, data_shift);
      const std::vector<int64_t> off = {0, 2, 3, 3, 3, 6, 7, 7, 7, 9};
      const int64_t m = off[E];
      auto x = rand_floats(static_cast<size_t>(m * in), ++seed);
      Dev<int64_t> doff(off);
      Dev<float> dx(x);
      auto run = [&](int ring, bool pair) {
        set_tc_gemv_ring_for_tests(ring);
        Dev<float> dy(static_cast<size_t>(m * out)), dy3(static_cast<size_t>(m * out));
        const Status st = pair ? run_expert_linear_pair(w1.dweights->p, w3.dweights->p, E, out, in, doff.p, dx.p, m,
                                                        dy.p, dy3.p, nullptr, f)
                               : run_expert_linear(w1.dweights->p, E, out, in, doff.p, dx.p, m, dy.p, nullptr, f);
        EXPECT_TRUE(st.ok()) << st.message();
        std::vector<float> got = dy.get();
        if (pair) {
          const std::vector<float> g3 = dy3.get();
          got.insert(got.end(), g3.begin(), g3.end());
        }
        return got;
      };
      size_t differ = 0;
      for (bool pair : {false, true}) {
        const std::vector<float> regs = run(0, pair);
        for (int ring : plan.expert_rings) {
          const std::vector<float> got = run(ring, pair);
          for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(regs[i]);
        }
      }
      report("expert_linear tc-gemv ring",
             std::string(fmt_name(f)) + " 9 experts 80x" + std::to_string(in) + " m=9" +
                 (shift == 1 ? " scales +1B" : shift == 2 ? " payload +8B" : "") +
                 " single and pair, rings vs registers: bits differing",
             static_cast<double>(differ), 0, "the same bytes reach the same arithmetic");
      EXPECT_EQ(differ, 0u);
    }
}

TEST(LinearParity, TensorCoreGemvRingKeepsTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  RingPlan plan;
  plan.dense = {{WeightFormat::kFp8Tiles, 77, 2048, 1}, {WeightFormat::kFp8Tiles, 1040, 256, 1},
                {WeightFormat::kFp4Rows, 45, 4096, 1}, {WeightFormat::kFp4Rows, 300, 512, 1},
                {WeightFormat::kFp8Tiles, 128, 512, 4}};
  plan.ns = {1, 3, 7};
  plan.rings = {1, 2, 3, 4};
  plan.caps = {0, 1, 3};
  plan.nbs = {0, 3};
  plan.expert_in = 1024;
  plan.expert_rings = {1, 2, 3, 4};
  check_tc_gemv_ring(plan, 14000);
}

// Cheap enough for the host emulator: short tasks (one partial stage) and long ones (stages refilled
// around rings of 2 and 3), one and several row groups per block.
TEST(LinearParity, TensorCoreGemvRingKeepsTheBitsSmall) {
  DS41_SKIP_WITHOUT_GPU();
  RingPlan plan;
  plan.dense = {{WeightFormat::kFp8Tiles, 40, 256, 1}, {WeightFormat::kFp4Rows, 24, 512, 1},
                {WeightFormat::kFp8Tiles, 20, 2048, 1}, {WeightFormat::kFp4Rows, 18, 2048, 1}};
  plan.ns = {1, 3};
  plan.rings = {2, 3};
  plan.caps = {0, 1};
  plan.nbs = {0};
  plan.expert_in = 1024;
  plan.expert_rings = {3};
  check_tc_gemv_ring(plan, 14500);
}

// The tensor-core GEMV's early start (DS41_TCG_EARLY): the dense kernel's first weight loads before
// its PDL wait. Every row's bits equal those without it (FP8 through 8- and 16-byte pieces, FP4,
// BF16, grouped, many row groups per block through 1 and 3 blocks), and x written by the kernel just
// before on the same stream (a slow one: x at the end of a 128 MB buffer it doubles) is the x the GEMV
// reads: a load of x before the wait would see the old values.
TEST(LinearParity, TensorCoreGemvEarlyStartKeepsTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_early_for_tests(-1);
      set_tc_gemv_fp8_wide_for_tests(-1);
      set_persist_slot_cap_for_tests(0);
    }
  } reset;
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  set_tc_gemv_for_tests(1);
  uint64_t seed = 17000;
  cudaStream_t stream = nullptr;  // our own: launch() asks for PDL only there (never on the legacy stream)
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamGone {
    cudaStream_t s;
    ~StreamGone() { cudaStreamDestroy(s); }
  } stream_gone{stream};
  for (const RingDense& c : std::vector<RingDense>{{WeightFormat::kFp8Tiles, 77, 2048, 1},
                                                   {WeightFormat::kFp8Tiles, 1040, 256, 1},
                                                   {WeightFormat::kFp4Rows, 45, 4096, 1},
                                                   {WeightFormat::kBF16, 300, 512, 1},
                                                   {WeightFormat::kFp8Tiles, 128, 512, 4}}) {
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const int64_t ldx = c.in * c.groups;
    for (int64_t n : {1, 3}) {
      auto x = rand_floats(static_cast<size_t>(n * ldx), ++seed);
      // The producer's buffer: x / 2 at its end, the whole doubled on the stream right before the GEMV.
      const size_t big = emu ? size_t{1} << 16 : size_t{32} << 20;
      std::vector<float> half(big + x.size(), 0.25f);
      for (size_t i = 0; i < x.size(); ++i) half[big + i] = x[i] * 0.5f;
      Dev<float> dx(x), dhalf(half);
      auto run = [&](const float* px, int cap) {
        set_persist_slot_cap_for_tests(cap);
        Dev<float> dy(static_cast<size_t>(n * c.out));
        const Status st = c.groups > 1 ? run_grouped_linear(dw.dw, c.groups, px, n, dy.p, stream, true)
                                       : run_linear(dw.dw, px, n, dy.p, stream, true);
        EXPECT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        return dy.get();
      };
      for (int wide : {0, 1}) {
        if (wide == 1 && c.format != WeightFormat::kFp8Tiles) continue;
        set_tc_gemv_fp8_wide_for_tests(wide);
        for (int cap : {0, 1, 3}) {
          set_tc_gemv_early_for_tests(0);
          const std::vector<float> want = run(dx.p, cap);
          set_tc_gemv_early_for_tests(1);
          const std::vector<float> got = run(dx.p, cap);
          size_t differ = 0, differ_chained = 0;
          for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(want[i]);
          ASSERT_TRUE(run_scale(dhalf.p, static_cast<int64_t>(half.size()), 2.0f, stream).ok());
          const std::vector<float> chained = run(dhalf.p + big, cap);
          for (size_t i = 0; i < chained.size(); ++i) differ_chained += bits_of(chained[i]) != bits_of(want[i]);
          ASSERT_TRUE(run_scale(dhalf.p, static_cast<int64_t>(half.size()), 0.5f, stream).ok());
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          report("linear tc-gemv early start",
                 std::string(fmt_name(c.format)) + (wide ? " (16-byte pieces)" : "") + " " + dims({c.out, c.in}) +
                     " g=" + std::to_string(c.groups) + " n=" + std::to_string(n) + " cap=" + std::to_string(cap) +
                     " early vs not: bits differing (plain, x written just before)",
                 static_cast<double>(differ + differ_chained), 0, "loads issued earlier; x read after the wait");
          EXPECT_EQ(differ, 0u);
          EXPECT_EQ(differ_chained, 0u);
        }
      }
    }
  }
}

// The expert GEMV's x staging before its first weight loads (DS41_TCG_EXPERT_STAGE_FIRST, opt-in): the
// same bits as the default order, for single calls and pairs, routed rows read through a row index
// (the decode's path) and contiguous ones, FP4 and FP8 experts, x rows per block 2 and 6 (a 6-row
// unit), 1 and 3 slots (persistent blocks); the released expert shape on a device.
// Routed experts of one format with their offsets (a random top-k routing of n tokens), x rows (spread:
// routed row r scaled by 2^(3 (r % 12) - 9)) and a row index (routed row r reads token row (r * 5) % n), and
// the three expert entry points over them: run(0) run_expert_linear, run(1) the w1 / w3 pair, run(2) the
// pair through the row index; w1's then w3's outputs of the routed rows.
struct ExpertCalls {
  WeightFormat f;
  int64_t E, out, in, n;
  Experts w1, w3;
  std::vector<int64_t> off;
  int64_t m, m_max;
  std::vector<float> x;
  std::vector<int64_t> rows;
  Dev<int64_t> doff, drows;
  Dev<float> dx, dg, dy1, dy3;
  ExpertCalls(WeightFormat f_, int64_t E_, int64_t out_, int64_t in_, int64_t n_, int64_t k, uint64_t& seed,
              bool spread)
      : f(f_), E(E_), out(out_), in(in_), n(n_), w1(make_experts(f, E, out, in, ++seed)),
        w3(make_experts(f, E, out, in, ++seed)), off(routed_offsets(n, k, E, ++seed, 0)), m(off[E]), m_max(m + 2),
        x(make_x(++seed, spread)), rows(make_rows()), doff(off), drows(rows), dx(x),
        dg(static_cast<size_t>(m_max * in)), dy1(static_cast<size_t>(m_max * out)), dy3(dy1.n) {}
  std::vector<float> make_x(uint64_t seed, bool spread) const {
    auto v = rand_floats(static_cast<size_t>(std::max(m_max, n) * in), seed);
    if (spread)
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < in; ++i) v[r * in + i] = std::ldexp(v[r * in + i], static_cast<int>(3 * (r % 12) - 9));
    return v;
  }
  std::vector<int64_t> make_rows() const {
    std::vector<int64_t> v(static_cast<size_t>(m_max));
    for (int64_t r = 0; r < m_max; ++r) v[r] = (r * 5) % n;
    return v;
  }
  std::vector<float> run(int variant) {
    cudaMemset(dy1.p, 0, dy1.n * sizeof(float));
    cudaMemset(dy3.p, 0, dy3.n * sizeof(float));
    Status st = ok_status();
    if (variant == 0)
      st = run_expert_linear(w1.dweights->p, E, out, in, doff.p, dx.p, m_max, dy1.p, nullptr, f);
    else if (variant == 1)
      st = run_expert_linear_pair(w1.dweights->p, w3.dweights->p, E, out, in, doff.p, dx.p, m_max, dy1.p, dy3.p,
                                  nullptr, f);
    else
      st = run_expert_linear_pair_rows(w1.dweights->p, w3.dweights->p, E, out, in, doff.p, dx.p, drows.p, dg.p,
                                       m_max, dy1.p, dy3.p, nullptr, f);
    EXPECT_TRUE(st.ok()) << st.message();
    std::vector<float> o1 = dy1.get(), o3 = dy3.get();
    o1.resize(static_cast<size_t>(m * out));
    o3.resize(o1.size());
    o1.insert(o1.end(), o3.begin(), o3.end());
    return o1;
  }
};

TEST(LinearParity, TensorCoreGemvExpertStageFirstKeepsTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_expert_stage_first_for_tests(-1);
      set_tc_gemv_rows_per_block_for_tests(0);
      set_persist_slot_cap_for_tests(0);
    }
  } reset;
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    WeightFormat format;
    int64_t E, out, in, n, k;
  };
  std::vector<Case> cases = {{WeightFormat::kFp4Rows, 12, 80, 1024, 6, 3}, {WeightFormat::kFp8Tiles, 12, 80, 1024, 6, 3}};
  if (!emu) cases.push_back({WeightFormat::kFp4Rows, 384, 2304, 5120, 1, 6});
  set_tc_gemv_for_tests(1);
  uint64_t seed = 17700;
  for (const Case& c : cases) {
    ExpertCalls ec(c.format, c.E, c.out, c.in, c.n, c.k, seed, true);
    size_t differ = 0, compared = 0;
    for (int variant : {0, 1, 2})
      for (int nb : {0, 6})
        for (int cap : {0, 1, 3}) {
          if (emu && cap == 1) continue;  // the host emulator: 1 and 3 slots exercise the same loop
          set_tc_gemv_rows_per_block_for_tests(nb);
          set_persist_slot_cap_for_tests(cap);
          set_tc_gemv_expert_stage_first_for_tests(0);
          const std::vector<float> want = ec.run(variant);
          set_tc_gemv_expert_stage_first_for_tests(1);
          const std::vector<float> got = ec.run(variant);
          for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(want[i]);
          compared += got.size();
        }
    report("expert_linear stage first",
           std::string(fmt_name(c.format)) + " " + std::to_string(c.E) + "x" + dims({c.out, c.in}) + " n=" +
               std::to_string(c.n) + " k=" + std::to_string(c.k) + " single / pair / pair through rows, " +
               std::to_string(compared) + " values: bits differing",
           static_cast<double>(differ), 0, "the same values staged earlier");
    EXPECT_EQ(differ, 0u);
  }
}

// The expert GEMV's early start (DS41_TCG_EXPERT_EARLY, default on; try_experts' routing_early): the MoE's w2 looks
// its units up and issues its first weight loads before its PDL wait, trusting launch.h contract 3 (the routing
// is two or more launches back). The test runs the decode's order on one stream: the offsets buffer poisoned by
// a copy with another routing of the same row count, the real offsets written by a kernel (a gather of their
// 32-bit words), the w1 / w3 pair through the row index (reads them after its wait), then w2 over the pair's
// w1 output with routing_early: equal bits to the same order without it, repeatedly (a w2 that read the
// offsets too early would take the poisoned routing: checked to differ), FP4 and FP8 experts, the released
// shape (w2 5120 x 2304 of 384 experts) on a device.
TEST(LinearParity, TensorCoreGemvExpertEarlyKeepsTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  struct Reset {
    ~Reset() {
      set_tc_gemv_for_tests(-1);
      set_tc_gemv_expert_early_for_tests(-1);
    }
  } reset;
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct Case {
    WeightFormat format;
    int64_t E, out, in, out2, n, k;
  };
  std::vector<Case> cases = {{WeightFormat::kFp4Rows, 12, 256, 1024, 160, 6, 3},
                             {WeightFormat::kFp8Tiles, 12, 256, 1024, 160, 6, 3}};
  if (!emu) cases.push_back({WeightFormat::kFp4Rows, 384, 2304, 5120, 5120, 1, 6});
  set_tc_gemv_for_tests(1);
  uint64_t seed = 18800;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct StreamGone {
    cudaStream_t s;
    ~StreamGone() { cudaStreamDestroy(s); }
  } gone{stream};
  for (const Case& c : cases) {
    ExpertCalls ec(c.format, c.E, c.out, c.in, c.n, c.k, seed, true);
    Experts w2 = make_experts(c.format, c.E, c.out2, c.out, seed);
    // Another routing with the same routed rows (the poison), distinct from the real one.
    std::vector<int64_t> poison;
    for (uint64_t ps = 1; poison.empty() || poison == ec.off; ++ps) poison = routed_offsets(c.n, c.k, c.E, seed + 97 * ps, 0);
    ASSERT_EQ(poison[c.E], ec.off[c.E]);
    const size_t words = static_cast<size_t>(2 * (c.E + 1));  // the int64 offsets as 32-bit words
    Dev<int64_t> dpoison(poison), dwork(ec.off.size()), didx(std::vector<int64_t>{0});
    Dev<float> dz(static_cast<size_t>(ec.m_max * c.out2));
    auto run = [&](bool early, bool poisoned_only) {
      set_tc_gemv_expert_early_for_tests(early ? 1 : 0);
      EXPECT_EQ(cudaMemsetAsync(dz.p, 0, dz.n * sizeof(float), stream), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(dwork.p, dpoison.p, words * 4, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
      if (!poisoned_only) {
        EXPECT_TRUE(run_gather_rows(reinterpret_cast<const float*>(ec.doff.p), didx.p, 1, static_cast<int64_t>(words),
                                    reinterpret_cast<float*>(dwork.p), stream)
                        .ok());
        const Status st = run_expert_linear_pair_rows(ec.w1.dweights->p, ec.w3.dweights->p, c.E, c.out, c.in, dwork.p,
                                                      ec.dx.p, ec.drows.p, ec.dg.p, ec.m_max, ec.dy1.p, ec.dy3.p,
                                                      stream, c.format);
        EXPECT_TRUE(st.ok()) << st.message();
      }
      const Status st = run_expert_linear(w2.dweights->p, c.E, c.out2, c.out, dwork.p, ec.dy1.p, ec.m_max, dz.p, stream,
                                          c.format, /*routing_early=*/true);
      EXPECT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<float> z = dz.get();
      z.resize(static_cast<size_t>(ec.m * c.out2));
      return z;
    };
    const std::vector<float> want = run(false, false);
    // The pair's w1 rows as the poisoned run finds them (the last real run's): only the routing differs.
    const std::vector<float> poisoned = run(false, true);
    size_t poison_differ = 0;
    for (size_t i = 0; i < want.size(); ++i) poison_differ += bits_of(poisoned[i]) != bits_of(want[i]);
    EXPECT_GT(poison_differ, 0u) << "the poisoned routing must change w2's output, or the test could not fail";
    size_t differ = 0, compared = 0;
    const int reps = emu ? 1 : 20;
    for (int rep = 0; rep < reps; ++rep) {
      const std::vector<float> got = run(true, false);
      for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(want[i]);
      compared += got.size();
    }
    report("expert_linear early start",
           std::string(fmt_name(c.format)) + " " + std::to_string(c.E) + "x" + dims({c.out2, c.out}) + " n=" +
               std::to_string(c.n) + " k=" + std::to_string(c.k) + " after route-write + pair, x" +
               std::to_string(reps) + ", " + std::to_string(compared) + " values: bits differing",
           static_cast<double>(differ), 0, "the same routing read before the wait (launch.h contract 3)");
    EXPECT_EQ(differ, 0u);
  }
}

// The same invariance for the scale-free formats (BF16: the head, the MoE gate and the compressor, on
// the tensor-core GEMV for row-invariant calls; F32 on the CUDA cores): a DSpark verification runs the head and the gate over B x (1 + candidates) rows where the
// plain decode step runs B, and greedy losslessness (MODEL_SPEC 3.10.7) needs the same logits bits
// and routing scores for a row whatever the call's row count.
TEST(LinearParity, ScaleFreeGemvRowCountInvariance) {
  DS41_SKIP_WITHOUT_GPU();
  uint64_t seed = 13500;
  struct Case {
    WeightFormat format;
    int64_t out, in;
  };
  for (const Case& c : {Case{WeightFormat::kBF16, 600, 5120}, Case{WeightFormat::kBF16, 384, 1024},
                        Case{WeightFormat::kF32, 512, 128}}) {
    HostWeight hw = make_weight(c.format, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const int64_t N = 40;
    auto x = rand_floats(static_cast<size_t>(N * c.in), ++seed);
    Dev<float> dx(x);
    auto run = [&](int64_t r0, int64_t n) {
      Dev<float> dy(static_cast<size_t>(n * c.out));
      const Status st = run_linear(dw.dw, dx.p + r0 * c.in, n, dy.p, nullptr, true);
      EXPECT_TRUE(st.ok()) << st.message();
      return dy.get();
    };
    const std::vector<float> all = run(0, N);
    size_t differ = 0;
    for (const auto& [r0, n] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 1}, {5, 1}, {39, 1}, {1, 2}, {3, 3}, {6, 6}, {2, 8}, {4, 12}, {7, 18}, {1, 36}}) {
      const std::vector<float> part = run(r0, n);
      for (int64_t i = 0; i < n * c.out; ++i) differ += bits_of(part[i]) != bits_of(all[r0 * c.out + i]);
    }
    report("linear row-count invariance",
           std::string(fmt_name(c.format)) + " " + dims({c.out, c.in}) +
               " rows alone / in batches of 1-36 vs 40: bits differing",
           static_cast<double>(differ), 0, "a row's order depends on the weight's shape only");
    EXPECT_EQ(differ, 0u);
  }
}

// The one-row FP8 GEMV at the released decode widths: the chunks per lane per batch (U = 3, 4, 5)
// change how many lanes idle and how many loads are in flight, never a lane's chunk order, so every
// U gives the bits of every other (and the launcher's choice is one of them).
TEST(LinearParity, PersistentGemvChunksPerLaneKeepTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  // No dequantized-weight cache: it is keyed by the payload address, which the next shape's
  // weights can reuse (a stale reference made this test fail on the H200 at one shape per run).
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  uint64_t seed = 7100;
  const int64_t shapes[][2] = {{1280, 5120}, {5120, 2304}, {32768, 1280}, {512, 5120}, {96, 4112}};
  for (const auto& sh : shapes) {
    HostWeight hw = make_weight(WeightFormat::kFp8Tiles, sh[0], sh[1], ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = host_ref(hw, hw.data.data(), hw.scale.data());
    auto x = rand_floats(static_cast<size_t>(sh[1]), ++seed);
    std::vector<float> want(static_cast<size_t>(sh[0]));
    cpu.linear(ref, x.data(), 1, want.data());
    Dev<float> dx(x);
    std::vector<std::vector<float>> outs;
    set_tc_gemv_for_tests(0);
    for (int u : {0, 3, 4, 5}) {
      set_persist_u_for_tests(u);
      Dev<float> dy(want.size());
      ASSERT_TRUE(run_linear(dw.dw, dx.p, 1, dy.p, nullptr).ok());
      outs.push_back(dy.get());
    }
    set_persist_u_for_tests(0);
    set_tc_gemv_for_tests(-1);
    size_t differ = 0;
    for (size_t k = 1; k < outs.size(); ++k)
      for (size_t i = 0; i < want.size(); ++i) differ += bits_of(outs[k][i]) != bits_of(outs[0][i]);
    report("linear U 3/4/5", "fp8 " + dims({sh[0], sh[1]}) + " n=1 bits differing", static_cast<double>(differ), 0,
           "the same per-lane chunk order: bit-identical");
    EXPECT_EQ(differ, 0u) << sh[0] << "x" << sh[1];
    report("linear U auto", "fp8 " + dims({sh[0], sh[1]}) + " n=1", rel_to_max(outs[0], want), kLinearTol,
           kLinearWhy);
  }
}

TEST(LinearParity, LinearArgumentErrors) {
  DeviceWeight w{WeightFormat::kFp4Rows, 16, 48, reinterpret_cast<const uint8_t*>(16),
                 reinterpret_cast<const uint8_t*>(16)};
  float* p = reinterpret_cast<float*>(16);
  Status s = run_linear(w, p, 1, p, nullptr);  // fp4 in % 32 != 0
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  w.format = WeightFormat::kEngramRows;
  s = run_linear(w, p, 1, p, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  w.format = WeightFormat::kFp8Tiles;
  s = run_grouped_linear(w, 3, p, 1, p, nullptr);  // 16 rows not divisible by 3 groups
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  s = run_expert_linear(nullptr, 0, 16, 48, nullptr, p, 4, p, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  s = run_expert_linear(reinterpret_cast<const DeviceWeight*>(16), 4, 16, 50,
                        reinterpret_cast<const int64_t*>(16), p, 4, p, nullptr);  // in_dim % 4 != 0
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
}

}  // namespace
}  // namespace ds41::cuda::parity
