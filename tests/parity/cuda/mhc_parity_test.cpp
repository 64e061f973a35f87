// Parity of the CUDA mHC kernels (backends/cuda/mhc_kernels.h, MODEL_SPEC 3.1 / 3.3) with the CPU
// reference: the site map with 20 Sinkhorn iterations at the released C = 4, h = 5120 (decode rows
// 1, 2, 8, 17, 64 and prefill rows: the split-K geometry changes with n), C*h not a multiple of 4 or
// of the 128-column tile, small and C = 2 / 6 / 8 shapes, bit-identical reruns; collapse and expand
// (exact); the stream init.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/mhc_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

using backends::cpu::CpuBackend;

TEST(MhcParity, HcMap) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, c, h, iters;
  };
  const std::vector<C> cases = {{1, 4, 5120, 20},  {2, 4, 5120, 20}, {8, 4, 5120, 20},  {17, 4, 5120, 20},
                                {64, 4, 5120, 20}, {300, 4, 5120, 20}, {5, 4, 192, 20}, {7, 2, 64, 3},
                                {4, 6, 100, 5},    {3, 3, 33, 20},    {1, 3, 1001, 20}, {2, 4, 1283, 20},
                                {9, 8, 260, 20},   {1, 8, 5120, 20}};
  CpuBackend cpu(&ref_pool());
  uint64_t seed = 100;
  for (const C& c : cases) {
    const int64_t F = c.c * c.h, M = (2 + c.c) * c.c;
    auto streams = rand_floats(static_cast<size_t>(c.n * F), ++seed, 4.0f);
    // fn scaled so that m = fn . flat is O(1) (the released Phi has the same order of magnitude).
    auto fn = rand_floats(static_cast<size_t>(M * F), ++seed, 1.7f / std::sqrt(static_cast<float>(F) / 3.0f));
    auto base = rand_floats(static_cast<size_t>(M), ++seed);
    std::vector<float> scale = {0.8f, 1.3f, 2.0f};
    std::vector<float> pre(c.n * c.c), post(c.n * c.c), comb(c.n * c.c * c.c);
    ops::HcMapArgs a;
    a.n = c.n;
    a.c = c.c;
    a.h = c.h;
    a.sinkhorn_iters = c.iters;
    a.streams = streams.data();
    a.fn = fn.data();
    a.scale = scale.data();
    a.base = base.data();
    a.pre = pre.data();
    a.post = post.data();
    a.comb = comb.data();
    cpu.hc_map(a);
    Dev<float> ds(streams), dfn(fn), dscale(scale), dbase(base), dpre(pre.size()), dpost(post.size()),
        dcomb(comb.size());
    HcMapDeviceArgs d;
    d.n = c.n;
    d.c = c.c;
    d.h = c.h;
    d.sinkhorn_iters = c.iters;
    d.streams = ds.p;
    d.fn = dfn.p;
    d.scale = dscale.p;
    d.base = dbase.p;
    d.pre = dpre.p;
    d.post = dpost.p;
    d.comb = dcomb.p;
    // Sized for a larger step than this one, as the engine does (the bound grows with n).
    d.workspace_bytes = hc_map_workspace_bytes(c.n + 100, c.c, c.h);
    ASSERT_GE(d.workspace_bytes, hc_map_workspace_bytes(c.n, c.c, c.h));
    Dev<uint8_t> dws(d.workspace_bytes);
    d.workspace = dws.p;
    Status s = run_hc_map(d, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    const auto pre1 = dpre.get(), post1 = dpost.get(), comb1 = dcomb.get();
    ASSERT_TRUE(run_hc_map(d, nullptr).ok());
    EXPECT_EQ(count_bit_diffs(dpre.get(), pre1) + count_bit_diffs(dpost.get(), post1) +
                  count_bit_diffs(dcomb.get(), comb1),
              0)
        << "hc_map must be bit-identical run to run";
    const std::string shape = dims({c.n, c.c, c.h}) + " it=" + std::to_string(c.iters);
    const char* why =
        "m: the CPU fp32 lanes of C*h/8 terms carry ~1e-6 rel. error, carried through "
        "sigmoid/softmax/Sinkhorn";
    report("hc_map pre", shape, rel_to_max(dpre.get(), pre), 1e-4, why);
    report("hc_map post", shape, rel_to_max(dpost.get(), post), 1e-4, why);
    report("hc_map comb", shape, rel_to_max(dcomb.get(), comb), 1e-4, why);
  }
}

TEST(MhcParity, HcMapRejectsMissingWorkspace) {
  HcMapDeviceArgs d;  // checked on the host before any pointer is read: no device needed
  d.n = 1;
  d.c = 4;
  d.h = 5120;
  d.sinkhorn_iters = 20;
  float dummy[64] = {};
  d.streams = d.fn = d.scale = d.base = dummy;
  d.pre = d.post = d.comb = dummy;
  EXPECT_FALSE(run_hc_map(d, nullptr).ok());
  d.workspace = dummy;
  d.workspace_bytes = hc_map_workspace_bytes(1, 4, 5120) - 8;
  EXPECT_FALSE(run_hc_map(d, nullptr).ok());
  EXPECT_GT(hc_map_workspace_bytes(1, 4, 5120), 0u);
  EXPECT_LE(hc_map_workspace_bytes(1, 4, 5120), hc_map_workspace_bytes(2048, 4, 5120));
  EXPECT_EQ(hc_map_workspace_bytes(1, 9, 5120), 0u);
}

TEST(MhcParity, HcCollapseExpandInit) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  struct C {
    int64_t n, c, h;
  };
  uint64_t seed = 200;
  for (const C& c : std::vector<C>{{1, 4, 5120}, {300, 4, 5120}, {5, 3, 33}}) {
    auto streams = rand_floats(static_cast<size_t>(c.n * c.c * c.h), ++seed, 3.0f);
    auto w = rand_floats(static_cast<size_t>(c.n * c.c), ++seed);
    auto y = rand_floats(static_cast<size_t>(c.n * c.h), ++seed, 2.0f);
    auto comb = rand_floats(static_cast<size_t>(c.n * c.c * c.c), ++seed);
    const std::string shape = dims({c.n, c.c, c.h});
    // collapse
    std::vector<float> want(c.n * c.h);
    cpu.hc_collapse(streams.data(), w.data(), c.n, c.c, c.h, want.data());
    Dev<float> ds(streams), dw(w), dy(y), dcomb(comb), dout(want.size());
    ASSERT_TRUE(run_hc_collapse(ds.p, dw.p, c.n, c.c, c.h, dout.p, nullptr).ok());
    report("hc_collapse", shape, count_bit_diffs(dout.get(), want), 0, "exact (the reference's fp32 order)");
    // expand (w as post)
    auto want_s = streams;
    cpu.hc_expand(want_s.data(), y.data(), w.data(), comb.data(), c.n, c.c, c.h);
    ASSERT_TRUE(run_hc_expand(ds.p, dy.p, dw.p, dcomb.p, c.n, c.c, c.h, nullptr).ok());
    report("hc_expand", shape, count_bit_diffs(ds.get(), want_s), 0, "exact (the reference's fp32 order)");
    // init: streams[r, c, :] = e[r, :], pi = one-hot(0)
    std::vector<float> ws(c.n * c.c * c.h), wpi(c.n * c.c, 0.0f);
    for (int64_t r = 0; r < c.n; ++r) {
      wpi[r * c.c] = 1.0f;
      for (int64_t k = 0; k < c.c; ++k) std::copy(&y[r * c.h], &y[(r + 1) * c.h], &ws[(r * c.c + k) * c.h]);
    }
    Dev<float> dpi(wpi.size());
    ASSERT_TRUE(run_hc_init(dy.p, c.n, c.c, c.h, ds.p, dpi.p, nullptr).ok());
    report("hc_init", shape, count_bit_diffs(ds.get(), ws) + count_bit_diffs(dpi.get(), wpi), 0,
           "exact (copies)");
  }
}

}  // namespace
}  // namespace ds41::cuda::parity
