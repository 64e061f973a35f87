// Parity of the CUDA MoE kernels (backends/cuda/moe_kernels.h, MODEL_SPEC 3.5) with the CPU
// reference: the router (384 experts top-6 with many exact ties, bias_vl rows, -inf biases;
// DSpark's 128 top-3; tiny 8 top-2), the stable bucketing (n = 0, 1, 300, 5000 tokens: several
// 256-pair chunks; a pair without an expert) and the combine in the reference's scatter-add
// order. All exact. Then the routed-expert composition as the GPU executor runs it (router ->
// bucket -> gather -> expert w1/w3 -> SwiGLU with the routing weights -> expert w2 -> combine)
// against ForwardPass::moe's routed part on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/moe_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

using backends::cpu::CpuBackend;

TEST(MoeParity, Router) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, E, k;
    bool ties, vl, ninf;
    float temp, route_scale;
  };
  const std::vector<C> cases = {
      {300, 384, 6, true, true, false, 1.0f, 1.5f}, {1, 384, 6, false, false, false, 1.0f, 1.5f},
      {8, 384, 6, true, false, true, 1.0f, 1.5f},   {300, 384, 6, false, true, true, 0.7f, 1.5f},
      {50, 128, 3, true, false, false, 1.0f, 1.5f}, {4, 8, 2, true, true, false, 1.0f, 1.0f},
      // Past the one-warp selection (E > 512 or k > 8): the block-wide rounds.
      {6, 640, 6, true, false, true, 1.0f, 1.5f},   {5, 96, 12, false, true, false, 1.0f, 1.5f}};
  CpuBackend cpu(nullptr);
  // Both selections (the two-stage picks up to 512 experts and 8 picks, the block-wide rounds).
  for (int two_stage : {2, 1, 0}) {
  set_router_selection_for_tests(two_stage);
  uint64_t seed = 300;
  for (const C& c : cases) {
    Rng r(++seed);
    std::vector<float> logits(c.n * c.E), bias(c.E), bias_vl(c.E);
    for (auto& l : logits) l = c.ties ? std::round(r.normal() * 2.0f) * 0.5f : r.normal() * 2.0f;
    if (c.ties)
      for (int64_t e = 0; e < c.E; ++e) logits[e] = 0.25f;  // row 0: every score equal
    for (int64_t e = 0; e < c.E; ++e) {
      bias[e] = c.ties ? 0.125f * static_cast<float>(e % 3) : r.sym() * 0.1f;
      bias_vl[e] = c.ties ? 0.125f * static_cast<float>(e % 2) : r.sym() * 0.1f;
      if (c.ninf && e % 50 == 7) bias[e] = -std::numeric_limits<float>::infinity();
    }
    std::vector<uint8_t> vl(c.n);
    for (int64_t i = 0; i < c.n; ++i) vl[i] = c.vl && i % 3 == 1;
    std::vector<int32_t> want_e(c.n * c.k);
    std::vector<float> want_w(c.n * c.k);
    cpu.router(logits.data(), c.n, c.E, bias.data(), bias_vl.data(), c.vl ? vl.data() : nullptr, c.k, c.temp,
               c.route_scale, want_e.data(), want_w.data());
    Dev<float> dl(logits), db(bias), dbv(bias_vl), dw(want_w.size());
    Dev<uint8_t> dvl(vl);
    Dev<int32_t> de(want_e.size());
    Status s = run_router(dl.p, c.n, c.E, db.p, dbv.p, c.vl ? dvl.p : nullptr, c.k, c.temp, c.route_scale,
                          de.p, dw.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    auto got_e = de.get();
    size_t bad = 0;
    for (size_t i = 0; i < got_e.size(); ++i) bad += got_e[i] != want_e[i];
    const std::string shape = dims({c.n, c.E}) + " k=" + std::to_string(c.k) + (c.ties ? " ties" : "") +
                              (c.vl ? " vl" : "") + (c.ninf ? " -inf" : "") +
                              (two_stage == 2 ? " two-stage sorted" : two_stage == 1 ? " two-stage picks" : " block rounds");
    report("router experts", shape, static_cast<double>(bad), 0, "exact (house tie order)");
    report("router weights", shape, rel_elem(dw.get(), want_w), 5e-7,
           "softplus in fp64 (CUDA vs libm <= 1 ulp): expected bit-exact, a rare score flip moves w by <= 4 "
           "ulp");
  }
  }
  set_router_selection_for_tests(-1);
}

struct Bucketing {
  std::vector<int64_t> offsets, perm_rows, slot_pos;
  std::vector<float> perm_weight;
};

// The reference's order: experts ascending, rows ascending inside an expert.
Bucketing host_bucket(const std::vector<int32_t>& ex, const std::vector<float>& w, int64_t n, int64_t k,
                      int64_t E) {
  Bucketing b;
  b.offsets.assign(E + 1, 0);
  b.slot_pos.assign(n * k, -1);
  std::vector<std::vector<int64_t>> pairs(E);
  for (int64_t p = 0; p < n * k; ++p)
    if (ex[p] >= 0 && ex[p] < E) pairs[ex[p]].push_back(p);
  for (int64_t e = 0; e < E; ++e) {
    b.offsets[e + 1] = b.offsets[e] + static_cast<int64_t>(pairs[e].size());
    for (int64_t p : pairs[e]) {
      b.slot_pos[p] = static_cast<int64_t>(b.perm_rows.size());
      b.perm_rows.push_back(p / k);
      b.perm_weight.push_back(w[p]);
    }
  }
  return b;
}

std::vector<int32_t> random_routing(int64_t n, int64_t k, int64_t E, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> ex(n * k);
  std::vector<int32_t> ids(E);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) ids[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < k; ++j) {
      // Skewed: half the picks among the first 16 experts (a popular expert spans chunks).
      const int64_t range = (r.next() & 1) ? std::min<int64_t>(E, 16) : E;
      int64_t q = j + static_cast<int64_t>(r.next() % static_cast<uint64_t>(std::max<int64_t>(1, range - j)));
      std::swap(ids[j], ids[q]);
      ex[t * k + j] = ids[j];
    }
  }
  return ex;
}

TEST(MoeParity, MoeBucketAndCombine) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, k, E, dim;
    bool invalid;
  };
  const std::vector<C> cases = {{300, 6, 384, 5120, false}, {1, 6, 384, 5120, false},
                                {5000, 6, 384, 64, false},  {7, 2, 8, 192, false},
                                {0, 6, 384, 64, false},     {10, 3, 16, 33, true}};
  CpuBackend cpu(nullptr);
  uint64_t seed = 400;
  for (const C& c : cases) {
    auto ex = random_routing(c.n, c.k, c.E, ++seed);
    if (c.invalid) ex[4] = -1;
    auto w = rand_floats(static_cast<size_t>(c.n * c.k), ++seed);
    const Bucketing want = host_bucket(ex, w, c.n, c.k, c.E);
    const int64_t pairs = c.n * c.k;
    Dev<int32_t> dex(ex);
    Dev<float> dw(w), dpw(pairs);
    Dev<int64_t> doff(c.E + 1), dpr(pairs), dsp(pairs);
    Dev<uint8_t> ws(moe_bucket_workspace_bytes(c.n, c.k, c.E));
    Status s = run_moe_bucket(dex.p, dw.p, c.n, c.k, c.E, doff.p, dpr.p, dpw.p, dsp.p, ws.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    const int64_t m = want.offsets[c.E];
    auto got_off = doff.get();
    auto got_pr = dpr.get();
    auto got_pw = dpw.get();
    auto got_sp = dsp.get();
    got_pr.resize(m);
    got_pw.resize(m);
    size_t bad = (got_off != want.offsets) + (got_pr != want.perm_rows) + (got_sp != want.slot_pos);
    bad += count_bit_diffs(got_pw, want.perm_weight);
    const std::string shape = "n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
                              " E=" + std::to_string(c.E) + (c.invalid ? " one pair without expert" : "");
    report("moe_bucket", shape, static_cast<double>(bad), 0, "exact (stable, deterministic)");
    if (m == 0) continue;
    // combine: out_perm rows in bucket order; the reference adds them expert by expert
    // (ascending) into a zeroed y, as ForwardPass::moe does with scatter_add_rows.
    auto out_perm = rand_floats(static_cast<size_t>(m * c.dim), ++seed, 2.0f);
    std::vector<float> y(c.n * c.dim, 0.0f);
    for (int64_t e = 0; e < c.E; ++e) {
      const int64_t b = want.offsets[e], cnt = want.offsets[e + 1] - b;
      if (cnt > 0) cpu.scatter_add_rows(&out_perm[b * c.dim], &want.perm_rows[b], cnt, c.dim, y.data());
    }
    Dev<float> dop(out_perm), dy(y.size());
    s = run_moe_combine(dop.p, dsp.p, dex.p, c.n, c.k, c.dim, dy.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    report("moe_combine", shape + " dim=" + std::to_string(c.dim), count_bit_diffs(dy.get(), y), 0,
           "exact (ascending expert order)");
  }
}

// The routed half of MODEL_SPEC 3.5 through the launchers, against the reference composition of
// ForwardPass::moe (per expert: gather rows, w1, w3, SwiGLU scaled by the routing weight, w2,
// scatter-add in ascending expert order). Dims of the "small" preset with FP4 experts.
TEST(MoeParity, RoutedExpertsEndToEnd) {
  DS41_SKIP_WITHOUT_GPU();
  const int64_t H = 1024, I = 256, E = 16, k = 4;
  const float limit = 10.0f, route_scale = 1.5f;
  const auto fmt = quant::WeightFormat::kFp4Rows;
  std::vector<HostWeight> w1, w2, w3;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(make_weight(fmt, I, H, 700 + 3 * e));
    w3.push_back(make_weight(fmt, I, H, 701 + 3 * e));
    w2.push_back(make_weight(fmt, H, I, 702 + 3 * e));
  }
  // Device copies: one payload per matrix, DeviceWeight arrays on the device.
  std::vector<std::unique_ptr<Dev<uint8_t>>> keep;
  auto upload = [&](const std::vector<HostWeight>& ws) {
    std::vector<DeviceWeight> d;
    for (const HostWeight& w : ws) {
      keep.push_back(std::make_unique<Dev<uint8_t>>(w.data));
      const uint8_t* data = keep.back()->p;
      keep.push_back(std::make_unique<Dev<uint8_t>>(w.scale));
      d.push_back(DeviceWeight{w.format, w.out, w.in, data, keep.back()->p});
    }
    return std::make_unique<Dev<DeviceWeight>>(d);
  };
  auto d1 = upload(w1), d2 = upload(w2), d3 = upload(w3);
  backends::cpu::CpuBackend cpu(&ref_pool(), backends::cpu::CpuBackendOptions{false});
  for (int64_t n : {1, 8, 300}) {
    auto x = rand_floats(static_cast<size_t>(n * H), 800 + n, 2.0f);
    auto logits = rand_floats(static_cast<size_t>(n * E), 801 + n, 3.0f);
    auto bias = rand_floats(static_cast<size_t>(E), 802 + n, 0.2f);
    // CPU: ForwardPass::moe's routed part.
    std::vector<int32_t> ex(n * k);
    std::vector<float> wt(n * k), y(n * H, 0.0f);
    cpu.router(logits.data(), n, E, bias.data(), nullptr, nullptr, k, 1.0f, route_scale, ex.data(),
               wt.data());
    std::vector<std::vector<int64_t>> rows_of(E);
    std::vector<std::vector<float>> scale_of(E);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < k; ++j) {
        rows_of[ex[r * k + j]].push_back(r);
        scale_of[ex[r * k + j]].push_back(wt[r * k + j]);
      }
    for (int64_t e = 0; e < E; ++e) {
      const int64_t m = static_cast<int64_t>(rows_of[e].size());
      if (m == 0) continue;
      std::vector<float> xs(m * H), g(m * I), u(m * I), a(m * I), out(m * H);
      for (int64_t i = 0; i < m; ++i)
        std::copy(&x[rows_of[e][i] * H], &x[(rows_of[e][i] + 1) * H], &xs[i * H]);
      cpu.linear(host_ref(w1[e], w1[e].data.data(), w1[e].scale.data()), xs.data(), m, g.data());
      cpu.linear(host_ref(w3[e], w3[e].data.data(), w3[e].scale.data()), xs.data(), m, u.data());
      cpu.swiglu(g.data(), u.data(), m, I, limit, scale_of[e].data(), a.data());
      cpu.linear(host_ref(w2[e], w2[e].data.data(), w2[e].scale.data()), a.data(), m, out.data());
      cpu.scatter_add_rows(out.data(), rows_of[e].data(), m, H, y.data());
    }
    // GPU: the launchers in the executor's order.
    const int64_t m = n * k;
    Dev<float> dx(x), dl(logits), db(bias), dw(n * k), dpw(m), dxs(m * H), dg(m * I), du(m * I), da(m * I),
        dout(m * H), dy(n * H);
    Dev<int32_t> dex(n * k);
    Dev<int64_t> doff(E + 1), dpr(m), dsp(m);
    Dev<uint8_t> ws(moe_bucket_workspace_bytes(n, k, E));
    ASSERT_TRUE(
        run_router(dl.p, n, E, db.p, nullptr, nullptr, k, 1.0f, route_scale, dex.p, dw.p, nullptr).ok());
    ASSERT_TRUE(run_moe_bucket(dex.p, dw.p, n, k, E, doff.p, dpr.p, dpw.p, dsp.p, ws.p, nullptr).ok());
    ASSERT_TRUE(run_gather_rows(dx.p, dpr.p, m, H, dxs.p, nullptr).ok());
    ASSERT_TRUE(run_expert_linear(d1->p, E, I, H, doff.p, dxs.p, m, dg.p, nullptr).ok());
    ASSERT_TRUE(run_expert_linear(d3->p, E, I, H, doff.p, dxs.p, m, du.p, nullptr).ok());
    ASSERT_TRUE(run_swiglu(dg.p, du.p, m, I, limit, dpw.p, da.p, nullptr).ok());
    ASSERT_TRUE(run_expert_linear(d2->p, E, H, I, doff.p, da.p, m, dout.p, nullptr).ok());
    ASSERT_TRUE(run_moe_combine(dout.p, dsp.p, dex.p, n, k, H, dy.p, nullptr).ok());
    auto got_e = dex.get();
    report("moe routed e2e experts", "n=" + std::to_string(n), got_e == ex ? 0 : 1, 0, "exact (router)");
    report("moe routed e2e y", dims({n, H}) + " E=16 k=4 I=256 fp4", rel_to_max(dy.get(), y), 1e-5,
           "three linears' fp32 summation order (K <= 1024), SwiGLU and combine exact");
  }
}

}  // namespace
}  // namespace ds41::cuda::parity
