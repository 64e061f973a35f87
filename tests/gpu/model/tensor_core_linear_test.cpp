// Parity of the tensor-core prefill linears (gpu/tensor_core_linear.h) with the CPU reference at
// the released widths: dense FP8-tile / FP4-row / BF16 weights, the grouped o-projection, and the
// routed experts (384 FP4 experts, top-6 routing of 300 and 2048 tokens, empty experts, FP8 and
// BF16 experts), each in both splits (split_parts 3, the default: three bfloat16 parts; 2, opt-in:
// FP8 / FP4 weights on two fp16 parts). The products are exact (the weights are exact in bfloat16 / in fp16 after a
// power-of-two shift per band of 32 rows; three bfloat16 parts keep fp32's 24 bits of x, two fp16
// parts keep x to within one ulp); the fp32 additions differ: 2K or 3K of them in the tensor core's
// order. Tolerance 2e-5 of the largest |y| (the GEMV path's is 1e-5): measured on the H200 (three
// parts) up to 7.6e-6 for K <= 5120 and 1.07e-5 at K = 8192 (wo_b, n = 2048: the max over 10M
// outputs). A split into two bfloat16 parts (16 bits) failed this bound on the H200 (2.2e-5, branch
// i11-kb2); two fp16 parts carry 22-23 bits. The fp16 split's scaling is checked where a wrong one
// would show: rows of x from 1e-15 to 1e20 and mixed magnitudes (fp16 alone spans 2^-24 .. 65504),
// inf in a row, weight scales spread over 45 binades inside a band and a band 2^-40 under the rest,
// each output band compared with its own largest |y|. Also: refused shapes and rows fall back
// (accepts() false), the result is bit-identical run to run, and the BF16-only mode of the vision
// tower. Label gpu: skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gpu/tensor_core_linear.h"
#include "parity/cuda/kernel_parity_util.h"

namespace ds41::gpu {
namespace {

using cuda::DeviceWeight;
using cuda::parity::Dev;
using cuda::parity::DevWeight;
using cuda::parity::HostWeight;
using quant::WeightFormat;

constexpr double kTol = 2e-5;
const char* kWhy = "exact products (x in 2 fp16 / 3 bf16 parts), fp32 sums in the tensor core's order";

TensorCoreLimits limits(int parts = 3) {
  TensorCoreLimits l;
  l.split_parts = parts;
  l.min_rows = 128;
  l.max_rows = 2048;
  l.max_in = 8192 * 2;  // wo_a's x rows: 8 groups x 4096 (in the test), wo_b 8192
  l.max_out = 32768;
  l.n_experts = 384;
  l.expert_out = 2304;
  l.expert_in = 5120;
  l.max_expert_rows = 2048 * 6;
  l.weight_scratch_bytes = int64_t{512} << 20;
  l.fp4_gemm_rows_per_expert = int64_t{1} << 30;  // the FP4 GEMM at every row count (its threshold: below)
  return l;
}

std::unique_ptr<TensorCoreLinear> make(int parts = 3, cudaStream_t s = nullptr) {
  auto r = TensorCoreLinear::create(limits(parts), s);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::string split_name(int parts) { return parts == 2 ? " [fp16 x2]" : " [bf16 x3]"; }

TEST(TensorCoreLinear, DenseMatchesTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  for (int parts : {2, 3}) {
  auto tc = make(parts);
  ASSERT_TRUE(tc);
  struct Case {
    const char* what;
    WeightFormat f;
    int64_t out, in;
    std::vector<int64_t> ns;
  };
  const std::vector<Case> cases = {
      {"wq_a", WeightFormat::kFp8Tiles, 1280, 5120, {128, 300, 2048}},
      {"wq_b", WeightFormat::kFp8Tiles, 32768, 1280, {300, 2048}},
      {"wo_b", WeightFormat::kFp8Tiles, 5120, 8192, {2048}},
      {"shared w2", WeightFormat::kFp8Tiles, 5120, 2304, {777}},
      {"fp4 dense", WeightFormat::kFp4Rows, 2304, 5120, {300}},
      {"gate bf16", WeightFormat::kBF16, 384, 5120, {300}},
      {"fp8 ragged tiles", WeightFormat::kFp8Tiles, 77, 102, {130}},
  };
  uint64_t seed = 7000;
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = cuda::parity::make_weight(c.f, c.out, c.in, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = cuda::parity::host_ref(hw, hw.data.data(), hw.scale.data());
    for (int64_t n : c.ns) {
      ASSERT_TRUE(tc->accepts(dw.dw, n)) << c.what << " n=" << n;
      auto x = cuda::parity::rand_floats(static_cast<size_t>(n * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = tc->linear(dw.dw, dx.p, n, dy.p);
      ASSERT_TRUE(s.ok()) << s.message();
      const auto got = dy.get();
      cuda::parity::report("tc linear",
                           std::string(c.what) + " " + quant::weight_format_name(c.f) + " " +
                               cuda::parity::dims({c.out, c.in}) + " n=" + std::to_string(n) + split_name(parts),
                           cuda::parity::rel_to_max(got, want), kTol, kWhy);
      // Deterministic: a second run is bit-identical.
      ASSERT_TRUE(tc->linear(dw.dw, dx.p, n, dy.p).ok());
      EXPECT_EQ(cuda::parity::count_bit_diffs(dy.get(), got), 0u) << c.what;
    }
  }
  }
}

TEST(TensorCoreLinear, GroupedMatchesTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  for (int parts : {2, 3}) {
  auto tc = make(parts);
  ASSERT_TRUE(tc);
  backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool());
  const int64_t G = 8, out = 8192, in = 1024, n = 300;
  HostWeight hw = cuda::parity::make_weight(WeightFormat::kFp8Tiles, out, in, 71);
  DevWeight dw(hw);
  const ops::WeightRef ref = cuda::parity::host_ref(hw, hw.data.data(), hw.scale.data());
  auto x = cuda::parity::rand_floats(static_cast<size_t>(n * G * in), 72);
  std::vector<float> want(static_cast<size_t>(n * out));
  cpu.grouped_linear(ref, G, x.data(), n, want.data());
  Dev<float> dx(x), dy(want.size());
  ASSERT_TRUE(tc->accepts_grouped(dw.dw, G, n));
  Status s = tc->grouped_linear(dw.dw, G, dx.p, n, dy.p);
  ASSERT_TRUE(s.ok()) << s.message();
  cuda::parity::report("tc grouped", "wo_a fp8 g=8 8192x1024 n=300" + split_name(parts),
                       cuda::parity::rel_to_max(dy.get(), want), kTol, kWhy);
  }
}

// Rows per expert of a random top-k routing of n tokens (distinct experts per token); experts
// that are multiples of `empty_every` get no rows.
std::vector<int64_t> routing(int64_t n, int64_t k, int64_t E, uint64_t seed, int64_t empty_every) {
  cuda::parity::Rng r(seed);
  std::vector<int64_t> cnt(E, 0), ids;
  for (int64_t e = 0; e < E; ++e)
    if (empty_every == 0 || e % empty_every != 0) ids.push_back(e);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t q = j + static_cast<int64_t>(r.next() % static_cast<uint64_t>(ids.size() - j));
      std::swap(ids[j], ids[q]);
      ++cnt[ids[j]];
    }
  std::vector<int64_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + cnt[e];
  return off;
}

TEST(TensorCoreLinear, ExpertsMatchTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  for (int parts : {2, 3}) {
  auto tc = make(parts);
  ASSERT_TRUE(tc);
  struct Case {
    const char* what;
    WeightFormat f;
    int64_t E, out, in, n, k, empty_every, slack;
  };
  const std::vector<Case> cases = {
      {"w1 384 experts", WeightFormat::kFp4Rows, 384, 2304, 5120, 300, 6, 7, 0},
      {"w2 384 experts", WeightFormat::kFp4Rows, 384, 5120, 2304, 2048, 6, 0, 9},
      {"fp8 16 experts", WeightFormat::kFp8Tiles, 16, 96, 512, 400, 3, 5, 3},
      {"bf16 16 experts", WeightFormat::kBF16, 16, 100, 256, 400, 2, 0, 0},
  };
  uint64_t seed = 9000;
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
    std::vector<HostWeight> hws;
    std::vector<std::unique_ptr<DevWeight>> dws;
    std::vector<DeviceWeight> host_list;
    for (int64_t e = 0; e < c.E; ++e) {
      hws.push_back(cuda::parity::make_weight(c.f, c.out, c.in, ++seed));
      dws.push_back(std::make_unique<DevWeight>(hws.back()));
      host_list.push_back(dws.back()->dw);
    }
    Dev<DeviceWeight> d_list(host_list);
    const auto off = routing(c.n, c.k, c.E, ++seed, c.empty_every);
    const int64_t m = off[c.E], m_max = m + c.slack;
    auto x = cuda::parity::rand_floats(static_cast<size_t>(m_max * c.in), ++seed);
    std::vector<float> want(static_cast<size_t>(m * c.out));
    for (int64_t e = 0; e < c.E; ++e)
      if (off[e + 1] > off[e]) {
        const ops::WeightRef ref = cuda::parity::host_ref(hws[e], hws[e].data.data(), hws[e].scale.data());
        cpu.linear(ref, x.data() + off[e] * c.in, off[e + 1] - off[e], want.data() + off[e] * c.out);
      }
    Dev<int64_t> doff(off);
    Dev<float> dx(x), dy(static_cast<size_t>(m_max * c.out));
    cudaMemset(dy.p, 0xff, dy.n * sizeof(float));  // NaN sentinel: rows >= m stay untouched
    ASSERT_TRUE(tc->accepts_experts(host_list, c.out, c.in, m_max)) << c.what;
    Status s = tc->expert_linear(host_list, d_list.p, c.out, c.in, doff.p, dx.p, m_max, dy.p);
    ASSERT_TRUE(s.ok()) << s.message();
    auto got = dy.get();
    size_t touched = 0;
    for (size_t i = static_cast<size_t>(m * c.out); i < got.size(); ++i)
      touched += cuda::parity::bits_of(got[i]) != 0xffffffffu;
    EXPECT_EQ(touched, 0u) << "rows past offsets[E] were written";
    got.resize(want.size());
    cuda::parity::report("tc experts",
                         std::string(c.what) + " " + quant::weight_format_name(c.f) + " " +
                             cuda::parity::dims({c.out, c.in}) + " n=" + std::to_string(c.n) +
                             " m=" + std::to_string(m) + split_name(parts),
                         cuda::parity::rel_to_max(got, want), kTol, kWhy);
  }
  }
}

// E FP4 experts of two matrices (a pair's w1 / w3), seeds drawn alternately from *seed, on the
// host and on the device (l1 / l2: the device weights' descriptors).
struct PairWeights {
  std::vector<HostWeight> h1, h2;
  std::vector<std::unique_ptr<DevWeight>> dws;
  std::vector<DeviceWeight> l1, l2;
};
PairWeights pair_weights(int64_t E, int64_t out, int64_t in, uint64_t* seed) {
  PairWeights p;
  for (int64_t e = 0; e < E; ++e) {
    p.h1.push_back(cuda::parity::make_weight(WeightFormat::kFp4Rows, out, in, ++*seed));
    p.h2.push_back(cuda::parity::make_weight(WeightFormat::kFp4Rows, out, in, ++*seed));
    p.dws.push_back(std::make_unique<DevWeight>(p.h1.back()));
    p.l1.push_back(p.dws.back()->dw);
    p.dws.push_back(std::make_unique<DevWeight>(p.h2.back()));
    p.l2.push_back(p.dws.back()->dw);
  }
  return p;
}

// A pair (the MoE's w1 / w3: one split of x, two matrices) gives each matrix the bits of its own
// call, in both splits; the pair's second matrix uses its own grouped-GEMM pointer slots.
TEST(TensorCoreLinear, ExpertPairEqualsTwoCallsBitForBit) {
  DS41_SKIP_WITHOUT_GPU();
  for (int parts : {2, 3}) {
    auto tc = make(parts);
    ASSERT_TRUE(tc);
    backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
    const int64_t E = 24, out = 256, in = 512;
    uint64_t seed = 9700;
    const PairWeights pw = pair_weights(E, out, in, &seed);
    const std::vector<HostWeight>& h2 = pw.h2;
    const std::vector<DeviceWeight>& l1 = pw.l1, &l2 = pw.l2;
    Dev<DeviceWeight> d1(l1), d2(l2);
    const auto off = routing(400, 3, E, ++seed, 5);
    const int64_t m = off[E];
    auto x = cuda::parity::rand_floats(static_cast<size_t>(m * in), ++seed);
    Dev<int64_t> doff(off);
    Dev<float> dx(x), y1(static_cast<size_t>(m * out)), y2(static_cast<size_t>(m * out)),
        s1(static_cast<size_t>(m * out)), s2(static_cast<size_t>(m * out));
    Status s = tc->expert_linear_pair(l1, &l2, d1.p, d2.p, out, in, doff.p, dx.p, m, y1.p, y2.p);
    ASSERT_TRUE(s.ok()) << s.message();
    ASSERT_TRUE(tc->expert_linear(l1, d1.p, out, in, doff.p, dx.p, m, s1.p).ok());
    ASSERT_TRUE(tc->expert_linear(l2, d2.p, out, in, doff.p, dx.p, m, s2.p).ok());
    EXPECT_EQ(cuda::parity::count_bit_diffs(y1.get(), s1.get()), 0u) << split_name(parts);
    EXPECT_EQ(cuda::parity::count_bit_diffs(y2.get(), s2.get()), 0u) << split_name(parts);
    std::vector<float> want(static_cast<size_t>(m * out));
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e]) {
        const ops::WeightRef ref = cuda::parity::host_ref(h2[e], h2[e].data.data(), h2[e].scale.data());
        cpu.linear(ref, x.data() + off[e] * in, off[e + 1] - off[e], want.data() + off[e] * out);
      }
    cuda::parity::report("tc experts pair", "w3 of 24 fp4 experts 256x512 m=" + std::to_string(m) + split_name(parts),
                         cuda::parity::rel_to_max(y2.get(), want), kTol, kWhy);
  }
}

// The expert streams (TensorCoreLimits::expert_streams): the GEMMs spread over 1, 3 or 4 streams
// with the decode double-buffered on its own stream give the bits of the in-order run, call after
// call. A scratch of 5 experts makes ~20 decode jobs per matrix, so a decode overwriting a buffer
// whose GEMMs are still queued would show as wrong bits; skewed row counts (empty experts, single
// rows, 300-row experts) put a different number of GEMMs on each stream. Both pair layouts: the
// second matrix in its own half of the partial products (out < in), and waiting for the first
// matrix's sum (out == in, a y3 buffer too small for both).
TEST(TensorCoreLinear, ExpertStreamsKeepTheBits) {
  DS41_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{256, 512}, {256, 256}}) {
    const int64_t E = 40;
    std::vector<int64_t> off(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = e % 5 == 0 ? 0 : e % 7 == 1 ? 1 : e % 11 == 2 ? 300 : 3 + (e * 13) % 37;
      off[e + 1] = off[e] + rows;
    }
    const int64_t m = off[E];
    uint64_t seed = 9900 + static_cast<uint64_t>(in);
    const PairWeights pw = pair_weights(E, out, in, &seed);
    const std::vector<HostWeight>& h2 = pw.h2;
    const std::vector<DeviceWeight>& l1 = pw.l1, &l2 = pw.l2;
    Dev<DeviceWeight> d1(l1), d2(l2);
    auto x = cuda::parity::rand_floats(static_cast<size_t>(m * in), ++seed);
    Dev<int64_t> doff(off);
    Dev<float> dx(x);
    std::vector<float> ref1, ref2;
    for (int streams : {1, 4, 3}) {
      TensorCoreLimits l;
      l.min_rows = 128;
      l.max_rows = 128;
      l.max_in = in;
      l.max_out = out;
      l.n_experts = E;
      l.expert_out = out;
      l.expert_in = in;
      l.max_expert_rows = m;
      l.weight_scratch_bytes = 5 * out * in * static_cast<int64_t>(sizeof(uint16_t));
      l.expert_streams = streams;
      l.fp4_expert_gemm = false;  // these FP4 experts take the decode and cuBLAS on the streams
      auto r = TensorCoreLinear::create(l, nullptr);
      ASSERT_TRUE(r.ok()) << r.status().message();
      auto tc = std::move(r).value();
      for (int call = 0; call < 3; ++call) {
        Dev<float> y1(static_cast<size_t>(m * out)), y2(static_cast<size_t>(m * out));
        Status s = tc->expert_linear_pair(l1, &l2, d1.p, d2.p, out, in, doff.p, dx.p, m, y1.p, y2.p);
        ASSERT_TRUE(s.ok()) << s.message();
        auto g1 = y1.get(), g2 = y2.get();
        if (ref1.empty()) {
          ref1 = g1;
          ref2 = g2;
          std::vector<float> want(static_cast<size_t>(m * out));
          for (int64_t e = 0; e < E; ++e)
            if (off[e + 1] > off[e]) {
              const ops::WeightRef ref = cuda::parity::host_ref(h2[e], h2[e].data.data(), h2[e].scale.data());
              cpu.linear(ref, x.data() + off[e] * in, off[e + 1] - off[e], want.data() + off[e] * out);
            }
          cuda::parity::report("tc expert streams",
                               "w3 of 40 fp4 experts " + cuda::parity::dims({out, in}) + " m=" + std::to_string(m) +
                                   ", 1 stream, scratch of 5",
                               cuda::parity::rel_to_max(g2, want), kTol, kWhy);
          continue;
        }
        EXPECT_EQ(cuda::parity::count_bit_diffs(g1, ref1), 0u) << streams << " streams, call " << call << ", " << in;
        EXPECT_EQ(cuda::parity::count_bit_diffs(g2, ref2), 0u) << streams << " streams, call " << call << ", " << in;
      }
    }
  }
}

// The FP4 expert GEMM (TensorCoreLimits::fp4_expert_gemm, the default) against the decode and cuBLAS path
// (the switch off) and the CPU op, a pair through a row index (the MoE's permutation); then one scale byte
// of one expert outside the GEMM's window: the call must take the decode path, so its bits equal the
// switch-off run's exactly (and the CPU op's values within the tolerance).
TEST(TensorCoreLinear, Fp4ExpertGemmAndItsFallback) {
  DS41_SKIP_WITHOUT_GPU();
  backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
  auto on = make(3);
  TensorCoreLimits lo = limits(3);
  lo.fp4_expert_gemm = false;
  auto ro = TensorCoreLinear::create(lo, nullptr);
  ASSERT_TRUE(on && ro.ok());
  auto off_tc = std::move(ro).value();
  const int64_t E = 24, out = 384, in = 1024;
  uint64_t seed = 9800;
  PairWeights pw = pair_weights(E, out, in, &seed);
  const auto off = routing(400, 3, E, ++seed, 5);
  const int64_t m = off[E], tokens = 400;
  auto x = cuda::parity::rand_floats(static_cast<size_t>(tokens * in), ++seed);
  std::vector<int64_t> rows_of(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) rows_of[i] = (i * 37 + 11) % tokens;
  std::vector<float> xr(static_cast<size_t>(m * in));
  for (int64_t i = 0; i < m; ++i) std::copy_n(x.begin() + rows_of[i] * in, in, xr.begin() + i * in);
  auto want = [&](const std::vector<HostWeight>& h) {
    std::vector<float> w(static_cast<size_t>(m * out));
    for (int64_t e = 0; e < E; ++e)
      if (off[e + 1] > off[e])
        cpu.linear(cuda::parity::host_ref(h[e], h[e].data.data(), h[e].scale.data()), xr.data() + off[e] * in,
                   off[e + 1] - off[e], w.data() + off[e] * out);
    return w;
  };
  Dev<int64_t> doff(off), drows(rows_of);
  Dev<float> dx(x);
  auto pair = [&](TensorCoreLinear& tc, const Dev<DeviceWeight>& d1, const Dev<DeviceWeight>& d2) {
    Dev<float> y1(static_cast<size_t>(m * out)), y2(static_cast<size_t>(m * out));
    Status s = tc.expert_linear_pair(pw.l1, &pw.l2, d1.p, d2.p, out, in, doff.p, dx.p, m, y1.p, y2.p, drows.p);
    EXPECT_TRUE(s.ok()) << s.message();
    return std::make_pair(y1.get(), y2.get());
  };
  {
    Dev<DeviceWeight> d1(pw.l1), d2(pw.l2);
    const auto g = pair(*on, d1, d2), r = pair(*off_tc, d1, d2);
    const auto w1 = want(pw.h1), w3 = want(pw.h2);
    cuda::parity::report("tc fp4 expert gemm", "pair of 24 fp4 experts 384x1024 m=" + std::to_string(m) + " rows_of",
                         std::max(cuda::parity::rel_to_max(g.first, w1), cuda::parity::rel_to_max(g.second, w3)), kTol,
                         kWhy);
    EXPECT_LE(cuda::parity::rel_to_max(g.first, w1), kTol);
    EXPECT_LE(cuda::parity::rel_to_max(g.second, w3), kTol);
    EXPECT_LE(cuda::parity::rel_to_max(r.second, w3), kTol);
    EXPECT_GT(cuda::parity::count_bit_diffs(g.second, r.second), 0u) << "the GEMM did not run (the same bits as cuBLAS)";
  }
  // Expert 6 (it has rows: empty_every 5 empties 0, 5, 10, ...) gets a scale byte of 200 in w3.
  ASSERT_GT(off[7], off[6]);
  pw.h2[6].scale[3] = 200;
  cudaMemcpy(const_cast<uint8_t*>(pw.l2[6].scale) + 3, &pw.h2[6].scale[3], 1, cudaMemcpyHostToDevice);
  Dev<DeviceWeight> d1(pw.l1), d2(pw.l2);
  const auto g = pair(*on, d1, d2), r = pair(*off_tc, d1, d2);
  EXPECT_EQ(cuda::parity::count_bit_diffs(g.first, r.first), 0u) << "a pair with an out-of-window scale must fall back";
  EXPECT_EQ(cuda::parity::count_bit_diffs(g.second, r.second), 0u);
  EXPECT_LE(cuda::parity::rel_to_max(g.second, want(pw.h2)), kTol);
  // Above fp4_gemm_rows_per_expert routed rows per expert the call takes the decode path too (the scale
  // restored, so only the threshold sends it there).
  pw.h2[6].scale[3] = pw.h1[6].scale[3];
  cudaMemcpy(const_cast<uint8_t*>(pw.l2[6].scale) + 3, &pw.h2[6].scale[3], 1, cudaMemcpyHostToDevice);
  TensorCoreLimits lt = limits(3);
  lt.fp4_gemm_rows_per_expert = m / E - 1;
  auto rt = TensorCoreLinear::create(lt, nullptr);
  ASSERT_TRUE(rt.ok());
  const auto t = pair(*rt.value(), d1, d2), r2 = pair(*off_tc, d1, d2), g2 = pair(*on, d1, d2);
  EXPECT_EQ(cuda::parity::count_bit_diffs(t.second, r2.second), 0u) << "above the rows threshold: the decode path";
  EXPECT_GT(cuda::parity::count_bit_diffs(g2.second, r2.second), 0u) << "the GEMM again with the scale restored";
}

// x rows whose magnitudes fp16 alone cannot hold: row r % 6 = 0 plain, 1 x 1e20, 2 x 1e-15,
// 3 each element x 10^U(-20, 20), 4 zeros, 5 plain with one +inf (rows of kind 5 only when
// with_inf).
std::vector<float> wide_rows(int64_t n, int64_t in, uint64_t seed, bool with_inf) {
  cuda::parity::Rng r(seed);
  std::vector<float> x(static_cast<size_t>(n * in));
  for (int64_t i = 0; i < n; ++i) {
    const int kind = static_cast<int>(i % (with_inf ? 6 : 5));
    for (int64_t k = 0; k < in; ++k) {
      float v = r.sym();
      if (kind == 1) v *= 1e20f;
      if (kind == 2) v *= 1e-15f;
      if (kind == 3) v *= std::pow(10.0f, 40.0f * r.uniform() - 20.0f);
      if (kind == 4) v = 0.0f;
      x[static_cast<size_t>(i * in + k)] = v;
    }
    if (kind == 5) x[static_cast<size_t>(i * in + (i * 7) % in)] = INFINITY;
  }
  return x;
}

// Scale bytes spread over [97, 142] (45 binades) tile by tile, and the band of output rows
// [32 * tiny_band, 32 * tiny_band + 32) 2^-40 under the rest (bytes 57 .. 102).
void spread_scales(HostWeight& w, int64_t tiny_band, uint64_t seed) {
  cuda::parity::Rng r(seed);
  const bool fp4 = w.format == WeightFormat::kFp4Rows;
  const int64_t per_band = fp4 ? 32 * (w.in / 32) : (w.in + 31) / 32;
  for (size_t j = 0; j < w.scale.size(); ++j) {
    const int64_t band = static_cast<int64_t>(j) / per_band;
    const int base = band == tiny_band ? 57 : 97;
    w.scale[j] = static_cast<uint8_t>(base + static_cast<int>(r.next() % 46));
  }
}

// Each (row, band of 32 outputs) against its own largest |want|; non-finite wants must be matched
// (NaN by NaN, inf by the same inf). Returns the worst relative error.
double worst_by_band(const std::vector<float>& got, const std::vector<float>& want, int64_t n, int64_t out,
                     int64_t* nonfinite_mismatch) {
  double worst = 0.0;
  *nonfinite_mismatch = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b0 = 0; b0 < out; b0 += 32) {
      double mx = 0.0, err = 0.0;
      for (int64_t o = b0; o < std::min(out, b0 + 32); ++o) {
        const float w = want[static_cast<size_t>(i * out + o)], g = got[static_cast<size_t>(i * out + o)];
        if (!std::isfinite(w)) {
          const bool same = std::isnan(w) ? std::isnan(g) : g == w;
          *nonfinite_mismatch += !same;
          continue;
        }
        mx = std::max(mx, std::fabs(static_cast<double>(w)));
        err = std::max(err, std::fabs(static_cast<double>(g) - w));
      }
      if (mx > 0.0) worst = std::max(worst, err / mx);
      else worst = std::max(worst, err);  // an all-zero band must come out zero
    }
  return worst;
}

TEST(TensorCoreLinear, Fp16SplitKeepsWideRanges) {
  DS41_SKIP_WITHOUT_GPU();
  auto tc = make(2);
  ASSERT_TRUE(tc);
  backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
  struct Case {
    const char* what;
    WeightFormat f;
    int64_t out, in;
    bool spread, with_inf;  // inf rows only with unspread scales: a weight that fp16 rounds to 0
                            // would turn the oracle's inf * w into NaN
  };
  uint64_t seed = 9500;
  for (const Case& c : {Case{"fp8 spread", WeightFormat::kFp8Tiles, 256, 1024, true, false},
                        Case{"fp4 spread", WeightFormat::kFp4Rows, 96, 2048, true, false},
                        Case{"fp8 inf rows", WeightFormat::kFp8Tiles, 64, 512, false, true}}) {
    HostWeight hw = cuda::parity::make_weight(c.f, c.out, c.in, ++seed);
    if (c.spread) spread_scales(hw, 1, ++seed);
    DevWeight dw(hw);
    const ops::WeightRef ref = cuda::parity::host_ref(hw, hw.data.data(), hw.scale.data());
    const int64_t n = 180;
    const auto x = wide_rows(n, c.in, ++seed, c.with_inf);
    std::vector<float> want(static_cast<size_t>(n * c.out));
    cpu.linear(ref, x.data(), n, want.data());
    Dev<float> dx(x), dy(want.size());
    ASSERT_TRUE(tc->accepts(dw.dw, n));
    Status s = tc->linear(dw.dw, dx.p, n, dy.p);
    ASSERT_TRUE(s.ok()) << s.message();
    int64_t bad = 0;
    const double err = worst_by_band(dy.get(), want, n, c.out, &bad);
    cuda::parity::report("tc linear wide", std::string(c.what) + " " + cuda::parity::dims({c.out, c.in}) +
                                               " n=180 per band",
                         err, kTol, "fp16 split: per-row and per-band power-of-two shifts");
    EXPECT_EQ(bad, 0) << c.what << ": non-finite outputs differ";
  }
  // Routed experts: every row kind except inf through 6 FP4 experts with spread scales.
  const int64_t E = 6, out = 128, in = 1024;
  std::vector<HostWeight> hws;
  std::vector<std::unique_ptr<DevWeight>> dws;
  std::vector<DeviceWeight> host_list;
  for (int64_t e = 0; e < E; ++e) {
    hws.push_back(cuda::parity::make_weight(WeightFormat::kFp4Rows, out, in, ++seed));
    spread_scales(hws.back(), e % 4, ++seed);
    dws.push_back(std::make_unique<DevWeight>(hws.back()));
    host_list.push_back(dws.back()->dw);
  }
  Dev<DeviceWeight> d_list(host_list);
  const auto off = routing(150, 2, E, ++seed, 0);
  const int64_t m = off[E];
  const auto x = wide_rows(m, in, ++seed, false);
  std::vector<float> want(static_cast<size_t>(m * out));
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) {
      const ops::WeightRef ref = cuda::parity::host_ref(hws[e], hws[e].data.data(), hws[e].scale.data());
      cpu.linear(ref, x.data() + off[e] * in, off[e + 1] - off[e], want.data() + off[e] * out);
    }
  Dev<int64_t> doff(off);
  Dev<float> dx(x), dy(want.size());
  ASSERT_TRUE(tc->accepts_experts(host_list, out, in, m));
  Status s = tc->expert_linear(host_list, d_list.p, out, in, doff.p, dx.p, m, dy.p);
  ASSERT_TRUE(s.ok()) << s.message();
  int64_t bad = 0;
  const double err = worst_by_band(dy.get(), want, m, out, &bad);
  cuda::parity::report("tc experts wide", "6 fp4 experts 128x1024 m=" + std::to_string(m) + " per band", err,
                       kTol, "fp16 split: per-row and per-expert-band shifts");
  EXPECT_EQ(bad, 0);
}

// decode_weights = false (the vision tower, issue 16): BF16 weights read in place with no decode
// scratch, from one row up, the released tower's shapes (patch embedding K = 588: an unaligned
// leading dimension; the fused qkv; mlp.w1's up half, a row slice 2816 rows into the tensor;
// aligner.w1 K = 9216) and small row chunks (max_rows 64 < n); FP8 / FP4 refused.
TEST(TensorCoreLinear, Bf16OnlyWithoutScratchMatchesTheCpuOp) {
  DS41_SKIP_WITHOUT_GPU();
  TensorCoreLimits l;
  l.min_rows = 1;
  l.max_rows = 64;
  l.max_in = 9216;
  l.max_out = 5120;
  l.decode_weights = false;
  l.weight_scratch_bytes = 0;
  auto r = TensorCoreLinear::create(l, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  TensorCoreLinear& tc = **r;
  struct Case {
    const char* what;
    int64_t out, in, first_row;  // first_row: a row slice starting there
    std::vector<int64_t> ns;
  };
  const std::vector<Case> cases = {{"patch_embed", 1024, 588, 0, {1, 42, 300}},
                                   {"wqkv", 3072, 1024, 0, {135}},
                                   {"mlp.w1 up half", 2816, 1024, 2816, {261}},
                                   {"aligner.w1", 5120, 9216, 0, {29}}};
  uint64_t seed = 9100;
  for (const Case& c : cases) {
    backends::cpu::CpuBackend cpu(&cuda::parity::ref_pool(), backends::cpu::CpuBackendOptions{false});
    HostWeight hw = cuda::parity::make_weight(WeightFormat::kBF16, c.first_row + c.out, c.in, ++seed);
    DevWeight dw(hw);
    DeviceWeight slice = dw.dw;
    slice.out_dim = c.out;
    slice.data += c.first_row * c.in * 2;
    ops::WeightRef ref = cuda::parity::host_ref(hw, hw.data.data() + c.first_row * c.in * 2, nullptr);
    ref.out_dim = c.out;
    for (int64_t n : c.ns) {
      ASSERT_TRUE(tc.accepts(slice, n)) << c.what << " n=" << n;
      auto x = cuda::parity::rand_floats(static_cast<size_t>(n * c.in), ++seed);
      std::vector<float> want(static_cast<size_t>(n * c.out));
      cpu.linear(ref, x.data(), n, want.data());
      Dev<float> dx(x), dy(want.size());
      Status s = tc.linear(slice, dx.p, n, dy.p);
      ASSERT_TRUE(s.ok()) << s.message();
      cuda::parity::report("tc linear bf16-only",
                           std::string(c.what) + " " + cuda::parity::dims({c.out, c.in}) + " n=" + std::to_string(n),
                           cuda::parity::rel_to_max(dy.get(), want), kTol, kWhy);
    }
  }
  uint8_t* fake = reinterpret_cast<uint8_t*>(256);
  EXPECT_FALSE(tc.accepts(DeviceWeight{WeightFormat::kFp8Tiles, 64, 64, fake, fake}, 8));  // needs the scratch
  EXPECT_FALSE(tc.accepts(DeviceWeight{WeightFormat::kFp4Rows, 64, 64, fake, fake}, 8));
}

TEST(TensorCoreLinear, RefusesWhatItCannotRun) {
  DS41_SKIP_WITHOUT_GPU();
  auto tc = make();
  ASSERT_TRUE(tc);
  uint8_t* fake = reinterpret_cast<uint8_t*>(256);
  DeviceWeight w{WeightFormat::kFp8Tiles, 1280, 5120, fake, fake};
  EXPECT_FALSE(tc->accepts(w, 127));  // decode-sized: GEMV
  EXPECT_TRUE(tc->accepts(w, 128));
  w.format = WeightFormat::kF32;  // not exact in bfloat16
  EXPECT_FALSE(tc->accepts(w, 300));
  DeviceWeight head{WeightFormat::kBF16, 129280, 5120, fake, nullptr};  // wider than max_out
  EXPECT_FALSE(tc->accepts(head, 300));
  std::vector<DeviceWeight> ex(4, DeviceWeight{WeightFormat::kFp4Rows, 64, 48, fake, fake});
  EXPECT_FALSE(tc->accepts_experts(ex, 64, 48, 300));  // in % 32 != 0
  ex.assign(4, DeviceWeight{WeightFormat::kFp4Rows, 64, 64, fake + 8, fake});
  EXPECT_FALSE(tc->accepts_experts(ex, 64, 64, 300));  // payload not 16-byte aligned
  Status s = tc->linear(DeviceWeight{WeightFormat::kF32, 8, 8, fake, nullptr}, nullptr, 300, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds41::gpu
