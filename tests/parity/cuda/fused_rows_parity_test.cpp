// Parity of the fused decode-step kernels (backends/cuda/fused_rows_kernels.h, issue 11) with the
// unfused op sequences they replace, bit for bit: RMSNorm -> RoPE -> Q_win / Q_kv / Q_idx packing
// and in-place fake quantization at the released widths (window KV rows 512, compressed entries
// 512, index keys 128, index queries 32 x 128), decode row counts (1, 3, 127: run_rms_norm's
// register layout) and prefill ones (128, 130: its strided layout), and past the limits (rows wider
// than a CTA run the unfused sequence; a Q_kv row 48 wide; no norm weight; the inverse rotation);
// the fused mHC site (map + collapse + norm), MoE routing (router + bucketing), combine + shared add
// + expand, the SwiGLU pair, and the sparse attention with the inverse rotation in its combine.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "backends/cuda/launch.h"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/tc_gemv_kernels.h"
#include "parity/cuda/switch_forms.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

const char* op_name(FakeQuantOp op) {
  return op == FakeQuantOp::kWin ? "win" : op == FakeQuantOp::kKv ? "kv" : "idx";
}

void norm_rope_quant_cases();
// Both placements of the constant loads (launch.h pre_wait_enabled: before / after the PDL wait) give the
// same bits as the reference sequence.
TEST(FusedRowsParity, NormRopeQuant) {
  DS41_SKIP_WITHOUT_GPU();
  for_both_forms(set_pre_wait_for_tests, "constants before the PDL wait", "constants after the PDL wait",
                 norm_rope_quant_cases);
}

void norm_rope_quant_cases() {
  struct C {
    const char* site;
    int64_t rows, dim, rows_per_pos, n_freq;
    bool norm, weight, normed, inverse, quant;
    FakeQuantOp op;
    bool scatter, inplace;
  };
  const FakeQuantOp W = FakeQuantOp::kWin, K = FakeQuantOp::kKv, I = FakeQuantOp::kIdx;
  const std::vector<C> cases = {
      // attention window KV: norm, rope, Q_win into the ring, Q_win in place
      {"attn kv", 1, 512, 1, 32, true, true, false, false, true, W, true, true},
      {"attn kv", 3, 512, 1, 32, true, true, false, false, true, W, true, true},
      {"attn kv", 127, 512, 1, 32, true, true, false, false, true, W, true, true},
      {"attn kv", 128, 512, 1, 32, true, true, false, false, true, W, true, true},
      {"attn kv", 130, 512, 1, 32, true, true, false, false, true, W, true, true},
      // compressor entry: u = norm(z) kept, e = rope(u) packed with Q_kv
      {"comp entry", 1, 512, 1, 32, true, true, true, false, true, K, true, false},
      {"comp entry", 5, 512, 1, 32, true, true, true, false, true, K, true, false},
      // compressor key: norm, rope, Q_idx packed
      {"comp key", 1, 128, 1, 32, true, true, false, false, true, I, true, false},
      {"comp key", 9, 128, 1, 32, true, true, false, false, true, I, true, false},
      // indexer query: 32 heads of 128 per position, rope, Q_idx in place
      {"index q", 32, 128, 32, 32, false, false, false, false, true, I, false, true},
      {"index q", 96, 128, 32, 32, false, false, false, false, true, I, false, true},
      // past the limits / other stages
      {"wide (unfused)", 2, 1056, 1, 32, true, true, false, false, true, W, true, true},
      {"wide normed", 3, 2048, 1, 16, true, true, true, false, true, K, true, false},
      {"kv 48", 4, 48, 1, 8, true, true, false, true, true, K, true, true},
      {"no weight", 2, 96, 1, 48, true, false, false, false, false, W, false, false},
      {"inverse", 6, 256, 2, 64, false, false, false, true, false, W, false, false},
      {"norm only", 200, 1024, 1, 0, true, true, false, false, false, W, false, false},
  };
  uint64_t seed = 900;
  for (const C& c : cases) {
    const int64_t n = c.rows, d = c.dim, npos = n / c.rows_per_pos;
    auto x = rand_floats(static_cast<size_t>(n * d), ++seed, 3.0f);
    x[0] = 0.0f;  // an exact zero and a tiny value among the channels
    if (x.size() > 5) x[5] = 1e-30f;
    auto w = rand_floats(static_cast<size_t>(d), ++seed, 1.5f);
    std::vector<int64_t> pos(npos);
    for (int64_t i = 0; i < npos; ++i) pos[i] = (i * 977 + 13) % 70000;
    std::vector<float> inv(std::max<int64_t>(c.n_freq, 1));
    for (int64_t i = 0; i < c.n_freq; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / c.n_freq);
    const int64_t rb = c.op == W ? d + d / 32 : c.op == K ? d / 2 + d / 16 : d / 2 + d / 32;
    // Row i packs to slot (3 i + 1) of a pool of 3 n + 2 rows; every fifth row is skipped.
    std::vector<int64_t> offs(n);
    for (int64_t i = 0; i < n; ++i) offs[i] = i % 5 == 4 ? -1 : (3 * i + 1) * rb;
    const std::vector<uint8_t> pool0 = rand_bytes(static_cast<size_t>((3 * n + 2) * rb), ++seed);
    const std::string shape = std::string(c.site) + " " + dims({n, d}) + " f" + std::to_string(c.n_freq) +
                              (c.quant ? std::string(" ") + op_name(c.op) : std::string());
    // Unfused.
    Dev<float> ux(x), uw(w), unormed(static_cast<size_t>(n * d)), uinv(inv);
    Dev<int64_t> dpos(pos), doffs(offs);
    Dev<uint8_t> upool(pool0);
    float* uout = ux.p;
    if (c.norm) {
      ASSERT_TRUE(
          run_rms_norm(ux.p, n, d, c.weight ? uw.p : nullptr, 1e-6f, c.normed ? unormed.p : ux.p, nullptr)
              .ok());
      if (c.normed)
        cudaMemcpy(ux.p, unormed.p, static_cast<size_t>(n * d) * sizeof(float), cudaMemcpyDeviceToDevice);
    }
    if (c.n_freq > 0) {
      ASSERT_TRUE(run_rope(ux.p, npos, c.rows_per_pos, d, dpos.p, uinv.p, c.n_freq, c.inverse, nullptr).ok());
    }
    if (c.quant && c.scatter) {
      ASSERT_TRUE(run_encode_rows_scatter(c.op, d, ux.p, n, upool.p, doffs.p, nullptr).ok());
    }
    if (c.quant && c.inplace) {
      ASSERT_TRUE(run_fake_quant_inplace(c.op, d, ux.p, n, nullptr).ok());
    }
    // Fused.
    Dev<float> fx(x), fnormed(static_cast<size_t>(n * d));
    Dev<uint8_t> fpool(pool0);
    RowsNormRopeQuantArgs a;
    a.rows = n;
    a.dim = d;
    a.in = fx.p;
    a.out = fx.p;
    a.norm = c.norm;
    a.norm_weight = c.weight ? uw.p : nullptr;
    a.eps = 1e-6f;
    a.normed = c.normed ? fnormed.p : nullptr;
    a.pos = dpos.p;
    a.rows_per_pos = c.rows_per_pos;
    a.inv_freq = uinv.p;
    a.n_freq = c.n_freq;
    a.inverse = c.inverse;
    a.quant = c.quant;
    a.op = c.op;
    a.base = fpool.p;
    a.offsets = c.scatter ? doffs.p : nullptr;
    a.quant_inplace = c.inplace;
    const Status s = run_rows_norm_rope_quant(a, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    size_t bad = count_bit_diffs(fx.get(), ux.get());
    if (c.normed) bad += count_bit_diffs(fnormed.get(), unormed.get());
    const auto up = upool.get(), fp = fpool.get();
    for (size_t i = 0; i < up.size(); ++i) bad += up[i] != fp[i];
    (void)uout;
    report("norm_rope_quant", shape, static_cast<double>(bad), 0,
           "same fp32/fp64 ops in the same order as rms_norm -> rope -> encode_rows_scatter -> "
           "fake_quant_inplace: rows and pool bytes compared bit for bit");
  }
}

TEST(FusedRowsParity, NormRopeQuantRejectsBadShapes) {
  RowsNormRopeQuantArgs a;  // checked on the host before any pointer is read
  float dummy[64] = {};
  a.in = a.out = dummy;
  a.rows = 2;
  a.dim = 64;
  a.n_freq = 33;  // 2 * n_freq > dim
  EXPECT_FALSE(run_rows_norm_rope_quant(a, nullptr).ok());
  a.n_freq = 0;
  a.rows_per_pos = 3;  // rows not a multiple
  EXPECT_FALSE(run_rows_norm_rope_quant(a, nullptr).ok());
  a.rows_per_pos = 1;
  a.quant = true;
  a.op = FakeQuantOp::kWin;
  a.dim = 48;  // not a multiple of 32
  EXPECT_FALSE(run_rows_norm_rope_quant(a, nullptr).ok());
  a.dim = 64;
  int64_t off = 0;
  a.offsets = &off;  // offsets without base
  EXPECT_FALSE(run_rows_norm_rope_quant(a, nullptr).ok());
  a.dim = 0;
  EXPECT_FALSE(run_rows_norm_rope_quant(a, nullptr).ok());
}

}  // namespace
}  // namespace ds41::cuda::parity

namespace ds41::cuda::parity {
namespace {

void hc_site_cases();
// Both placements of the constant loads (launch.h pre_wait_enabled: before / after the PDL wait) give the
// same bits as the reference sequence.
TEST(FusedRowsParity, HcSite) {
  DS41_SKIP_WITHOUT_GPU();
  for_both_forms(set_pre_wait_for_tests, "constants before the PDL wait", "constants after the PDL wait",
                 hc_site_cases);
}

void hc_site_cases() {
  struct C {
    int64_t n, c, h;
    bool weight;
  };
  // Released C = 4, h = 5120 at decode rows (1, 2, 17: one and three row groups), prefill rows past
  // run_rms_norm's register layout (130, a narrower h to keep the emulator quick), C = 3 / 8 / 2
  // (the other finish / partial instantiations, unaligned columns), h past the fused kernel's
  // shared-memory row (the unfused sequence), and 2048 / 1024 for the collapse's float4 kernel
  // (h = 5120 takes it in one round of 5 quads per thread, 2048 and 1024 in a partial round).
  const std::vector<C> cases = {{1, 4, 5120, true},  {2, 4, 5120, true}, {17, 4, 5120, true},
                                {130, 4, 640, true}, {3, 3, 33, false},  {9, 8, 260, true},
                                {2, 2, 12300, true}, {3, 4, 2048, false}, {1, 4, 1024, true}};
  uint64_t seed = 1300;
  for (const C& c : cases) {
    const int64_t F = c.c * c.h, M = (2 + c.c) * c.c;
    auto streams = rand_floats(static_cast<size_t>(c.n * F), ++seed, 4.0f);
    auto fn = rand_floats(static_cast<size_t>(M * F), ++seed, 1.7f / std::sqrt(static_cast<float>(F) / 3.0f));
    auto base = rand_floats(static_cast<size_t>(M), ++seed);
    auto cw = rand_floats(static_cast<size_t>(c.n * c.c), ++seed);
    auto nw = rand_floats(static_cast<size_t>(c.h), ++seed, 1.5f);
    std::vector<float> scale = {0.8f, 1.3f, 2.0f};
    Dev<float> ds(streams), dfn(fn), dscale(scale), dbase(base), dcw(cw), dnw(nw);
    const size_t ws_bytes = hc_map_workspace_bytes(c.n + 100, c.c, c.h);
    struct Out {
      Dev<float> pre, post, comb, x;
      Dev<uint8_t> ws;
      Out(int64_t n, int64_t cc, int64_t h, size_t wsb)
          : pre(n * cc), post(n * cc), comb(n * cc * cc), x(n * h), ws(wsb) {}
    };
    auto args = [&](Out& o) {
      HcMapDeviceArgs d;
      d.n = c.n;
      d.c = c.c;
      d.h = c.h;
      d.sinkhorn_iters = 20;
      d.streams = ds.p;
      d.fn = dfn.p;
      d.scale = dscale.p;
      d.base = dbase.p;
      d.pre = o.pre.p;
      d.post = o.post.p;
      d.comb = o.comb.p;
      d.workspace = o.ws.p;
      d.workspace_bytes = ws_bytes;
      return d;
    };
    Out u(c.n, c.c, c.h, ws_bytes), f(c.n, c.c, c.h, ws_bytes);
    const HcMapDeviceArgs ud = args(u);
    ASSERT_TRUE(run_hc_map(ud, nullptr).ok());
    ASSERT_TRUE(run_hc_collapse(ds.p, dcw.p, c.n, c.c, c.h, u.x.p, nullptr).ok());
    ASSERT_TRUE(run_rms_norm(u.x.p, c.n, c.h, c.weight ? dnw.p : nullptr, 1e-6f, u.x.p, nullptr).ok());
    const int64_t nc = hc_site_counter_count(c.n + 100);
    Dev<uint32_t> counters(std::vector<uint32_t>(static_cast<size_t>(nc), 0u));
    HcSiteArgs s;
    s.map = args(f);
    s.collapse_w = dcw.p;
    s.norm_weight = c.weight ? dnw.p : nullptr;
    s.eps = 1e-6f;
    s.x = f.x.p;
    s.counters = counters.p;
    s.counters_size = nc;
    const std::string shape = dims({c.n, c.c, c.h});
    for (int rep = 0; rep < 2; ++rep) {  // the second call finds the counters zeroed by the first
      const Status st = run_hc_site(s, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      const size_t bad = count_bit_diffs(f.pre.get(), u.pre.get()) +
                         count_bit_diffs(f.post.get(), u.post.get()) +
                         count_bit_diffs(f.comb.get(), u.comb.get()) + count_bit_diffs(f.x.get(), u.x.get());
      size_t left = 0;
      for (uint32_t v : counters.get()) left += v != 0;
      report(rep == 0 ? "hc_site" : "hc_site again", shape, static_cast<double>(bad + left), 0,
             "hc_map + hc_collapse + rms_norm: the same code / fp order; pre, post, comb, x bit for bit, "
             "counters zero after");
    }
    // The two parts in two launches (the map on the side stream, the collapse on the main one:
    // gpu_forward.h "Side stream"): the same blocks' code, so the same bits; a shape without the
    // fused kernel refuses a part.
    // The collapse part alone also through its float4 kernel (C = 4, h % 1024 == 0: hc_site_collapse_quads).
    for (int quads : {0, 1}) {
      set_hc_collapse_quads_for_tests(quads);
      Out p(c.n, c.c, c.h, ws_bytes);
      HcSiteArgs sp = s;
      sp.map = args(p);
      sp.x = p.x.p;
      if (!hc_site_fused(sp)) {
        EXPECT_FALSE(run_hc_site(sp, nullptr, HcSitePart::kMap).ok()) << shape;
        break;
      }
      EXPECT_EQ(hc_site_collapse_quads(sp), quads == 1 && c.c == 4 && c.h % 1024 == 0) << shape;
      const Status sm = run_hc_site(sp, nullptr, HcSitePart::kMap);
      const Status sc = run_hc_site(sp, nullptr, HcSitePart::kCollapse);
      ASSERT_TRUE(sm.ok() && sc.ok()) << sm.message() << sc.message();
      const size_t bad = count_bit_diffs(p.pre.get(), u.pre.get()) +
                         count_bit_diffs(p.post.get(), u.post.get()) +
                         count_bit_diffs(p.comb.get(), u.comb.get()) + count_bit_diffs(p.x.get(), u.x.get());
      size_t left = 0;
      for (uint32_t v : counters.get()) left += v != 0;
      report(hc_site_collapse_quads(sp) ? "hc_site map | collapse quads" : "hc_site map | collapse", shape,
             static_cast<double>(bad + left), 0,
             "the two parts in two launches: pre, post, comb, x bit for bit, counters zero after");
      EXPECT_EQ(bad + left, 0u) << shape;
    }
    set_hc_collapse_quads_for_tests(-1);
  }
}

// A full group of 8 rows on the vector path takes the staged loop of hc_map_partial_block (x tiles
// in shared memory, the next tile prefetched); a partial group takes the row-by-row loop. With the
// same group and split count (n = 8 vs 7, 16 vs 15: ceil(n / 8) groups either way) both must give
// the shared rows the same bits: the same products in the same order per (row, fn row, lane).
TEST(FusedRowsParity, HcMapFullGroupEqualsPartialGroup) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, c, h;
  };
  const std::vector<C> cases = {{8, 4, 5120}, {16, 4, 640}, {8, 8, 260}, {16, 3, 1000}};
  uint64_t seed = 1400;
  for (const C& c : cases) {
    const int64_t F = c.c * c.h, M = (2 + c.c) * c.c;
    auto streams = rand_floats(static_cast<size_t>(c.n * F), ++seed, 4.0f);
    auto fn = rand_floats(static_cast<size_t>(M * F), ++seed, 1.7f / std::sqrt(static_cast<float>(F) / 3.0f));
    auto base = rand_floats(static_cast<size_t>(M), ++seed);
    std::vector<float> scale = {0.8f, 1.3f, 2.0f};
    Dev<float> ds(streams), dfn(fn), dscale(scale), dbase(base);
    std::vector<float> got[2][3];
    for (int v = 0; v < 2; ++v) {
      const int64_t n = c.n - v;  // v = 1: the last group is partial
      const size_t ws_bytes = hc_map_workspace_bytes(n, c.c, c.h);
      Dev<float> pre(n * c.c), post(n * c.c), comb(n * c.c * c.c);
      Dev<uint8_t> ws(ws_bytes);
      HcMapDeviceArgs d;
      d.n = n;
      d.c = c.c;
      d.h = c.h;
      d.sinkhorn_iters = 20;
      d.streams = ds.p;
      d.fn = dfn.p;
      d.scale = dscale.p;
      d.base = dbase.p;
      d.pre = pre.p;
      d.post = post.p;
      d.comb = comb.p;
      d.workspace = ws.p;
      d.workspace_bytes = ws_bytes;
      ASSERT_TRUE(run_hc_map(d, nullptr).ok());
      got[v][0] = pre.get();
      got[v][1] = post.get();
      got[v][2] = comb.get();
    }
    size_t bad = 0;
    for (int k = 0; k < 3; ++k) {
      std::vector<float> full = got[0][k];
      full.resize(got[1][k].size());  // the rows both calls computed
      bad += count_bit_diffs(full, got[1][k]);
    }
    report("hc_map full vs partial group", dims({c.n, c.c, c.h}), static_cast<double>(bad), 0,
           "staged full-group loop vs row-by-row loop: the same products and order; pre, post, comb bit for bit");
  }
}

}  // namespace
}  // namespace ds41::cuda::parity

namespace ds41::cuda::parity {
namespace {

// A routing's device outputs (run_moe_route's: experts, weights, offsets, perm rows / weights, slot_pos)
// for n * k pairs over E experts, filled with values no routing writes, and the differences of two of
// them (bits of the floats, equality of the integers).
struct RouteOut {
  Dev<int32_t> ex;
  Dev<float> w, pw;
  Dev<int64_t> off, pr, sp;
  RouteOut(int64_t nk, int64_t E)
      : ex(std::vector<int32_t>(nk, 7)),
        w(std::vector<float>(nk, 0.5f)),
        pw(std::vector<float>(nk, 0.25f)),
        off(std::vector<int64_t>(E + 1, 3)),
        pr(std::vector<int64_t>(nk, 5)),
        sp(std::vector<int64_t>(nk, 9)) {}
  void into(MoeRouteArgs& a) const {
    a.experts = ex.p;
    a.weights = w.p;
    a.offsets = off.p;
    a.perm_rows = pr.p;
    a.perm_weight = pw.p;
    a.slot_pos = sp.p;
  }
  size_t diffs(const RouteOut& o) const {
    size_t bad = count_bit_diffs(w.get(), o.w.get()) + count_bit_diffs(pw.get(), o.pw.get());
    bad += ex.get() != o.ex.get();
    bad += off.get() != o.off.get();
    bad += pr.get() != o.pr.get();
    bad += sp.get() != o.sp.get();
    return bad;
  }
};

TEST(FusedRowsParity, MoeRoute) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, E, k;
    bool vl, ties, masked;
  };
  // The released router (384 experts, top 6) at decode rows 1 / 3 and the largest one-chunk batch
  // (42 rows = 252 pairs), DSpark's (128, top 3), past the chunk (43 rows: the unfused sequence), tied
  // scores, image rows with bias_vl, and -inf biases leaving fewer than k selectable experts; one warp
  // selects up to 512 experts and 8 picks, larger shapes take the block-wide rounds.
  const std::vector<C> cases = {{1, 384, 6, false, false, false}, {3, 384, 6, true, false, false},
                                {42, 384, 6, false, true, false}, {43, 384, 6, false, false, false},
                                {2, 128, 3, false, false, false}, {5, 8, 6, false, true, true},
                                {2, 600, 10, true, true, true},   // the block-wide selection (E > 512, k > 8)
                                // one row (the bucketing from the picks alone), with too few selectable experts
                                // (-1 picks), ties, image rows and the block-wide selection
                                {1, 8, 6, false, true, true}, {1, 600, 10, true, true, true},
                                {1, 128, 3, true, true, false}};
  // The two selections' outputs per case, compared at the end: the two-stage picks (each warp's by redux.sync
  // keys) against the block-wide rounds (warp_best's shuffle tree), ties and -inf included.
  struct HostRoute {
    std::vector<int32_t> ex;
    std::vector<float> w, pw;
    std::vector<int64_t> off, pr, sp;
  };
  std::vector<std::vector<HostRoute>> by_sel(3);
  for (int two_stage : {2, 1, 0}) {  // every selection of route_row (sorted, picks, block rounds)
  set_router_selection_for_tests(two_stage);
  uint64_t seed = 1700;
  for (const C& c : cases) {
    const int64_t n = c.n, E = c.E, k = c.k, nk = n * k;
    auto logits = rand_floats(static_cast<size_t>(n * E), ++seed, 3.0f);
    if (c.ties)
      for (auto& v : logits) v = std::round(v * 2.0f) / 2.0f;
    auto bias = rand_floats(static_cast<size_t>(E), ++seed, 0.1f);
    if (c.ties)
      for (auto& v : bias) v = 0.0f;
    if (c.masked)
      for (int64_t e = 0; e < E; e += 2) bias[e] = -INFINITY;
    auto bias_vl = rand_floats(static_cast<size_t>(E), ++seed, 0.1f);
    std::vector<uint8_t> vl(n);
    for (int64_t r = 0; r < n; ++r) vl[r] = r % 2;
    Dev<float> dl(logits), db(bias), dbv(bias_vl);
    Dev<uint8_t> dvl(vl), dws(moe_bucket_workspace_bytes(n, k, E) + 256);
    RouteOut u(nk, E), f(nk, E);
    const float temp = 1.3f, scale = 2.5f;
    ASSERT_TRUE(run_router(dl.p, n, E, db.p, c.vl ? dbv.p : nullptr, c.vl ? dvl.p : nullptr, k, temp, scale,
                           u.ex.p, u.w.p, nullptr)
                    .ok());
    ASSERT_TRUE(run_moe_bucket(u.ex.p, u.w.p, n, k, E, u.off.p, u.pr.p, u.pw.p, u.sp.p, dws.p, nullptr).ok());
    Dev<uint32_t> counters(std::vector<uint32_t>(4, 0u));
    MoeRouteArgs a;
    a.logits = dl.p;
    a.n = n;
    a.n_experts = E;
    a.k = k;
    a.bias = db.p;
    a.bias_vl = c.vl ? dbv.p : nullptr;
    a.vl = c.vl ? dvl.p : nullptr;
    a.temp = temp;
    a.route_scale = scale;
    f.into(a);
    a.workspace = dws.p;
    a.counters = counters.p;
    const std::string shape = dims({n, E, k}) + (c.vl ? " vl" : "") + (c.ties ? " ties" : "") +
                              (c.masked ? " -inf" : "") + (two_stage == 2 ? " two-stage sorted" : two_stage == 1 ? " two-stage picks" : " block rounds");
    for (int rep = 0; rep < 2; ++rep) {
      const Status st = run_moe_route(a, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      const size_t bad = f.diffs(u);
      size_t left = 0;
      for (uint32_t v : counters.get()) left += v != 0;
      report(
          rep == 0 ? "moe_route" : "moe_route again", shape, static_cast<double>(bad + left), 0,
          "router_kernel's code + the stable bucketing (integers): experts, weights, offsets, perm, slot_pos "
          "equal; counter zero after");
    }
    by_sel[two_stage].push_back(HostRoute{f.ex.get(), f.w.get(), f.pw.get(), f.off.get(), f.pr.get(), f.sp.get()});
  }
  }
  set_router_selection_for_tests(-1);
  for (size_t i = 0; i < 2 * cases.size(); ++i) {  // the picks, then the sorted, against the block rounds
    const HostRoute &a = by_sel[1 + i / cases.size()][i % cases.size()], &b = by_sel[0][i % cases.size()];
    const size_t bad = (a.ex != b.ex) + count_bit_diffs(a.w, b.w) + count_bit_diffs(a.pw, b.pw) + (a.off != b.off) +
                       (a.pr != b.pr) + (a.sp != b.sp);
    const C& c = cases[i % cases.size()];
    report("moe_route selections",
           dims({c.n, c.E, c.k}) + (c.ties ? " ties" : "") + (c.masked ? " -inf" : "") +
               (i < cases.size() ? " picks" : " sorted"),
           static_cast<double>(bad), 0,
           "two-stage (redux.sync picks or bitonic sorts of pick_key64 keys) vs block-wide rounds: the same picks "
           "and outputs");
    EXPECT_EQ(bad, 0u) << dims({c.n, c.E, c.k});
  }
}

// The MoE entry of a one-row decode step (run_moe_entry: the FFN site's collapse + norm, the gate, the
// router and bucketing in one launch) against the same three as separate launches (its fallback:
// run_hc_collapse + run_rms_norm, run_linear row-invariant, run_moe_route), bit for bit: x, logits,
// experts, weights, offsets, perm rows / weights, slot_pos; the counter zero after; twice. The released
// widths (h 5120, 384 experts top 6) on a device, a small one everywhere; an image row (bias_vl); 600
// experts (the block-wide selection); streams scaled apart (the collapse's weights matter) and a norm
// weight; and a shape the kernel refuses (h 768) checked to fall back.
void moe_entry_cases();
// Both forms of the routing tail's last-block count (launch.h one_fence_enabled: one thread's fence after a
// barrier, or every thread's) give the same integers and bits.
TEST(FusedRowsParity, MoeEntry) {
  DS41_SKIP_WITHOUT_GPU();
  for_both_forms(set_one_fence_for_tests, "one fence", "every thread's fence", moe_entry_cases);
}

void moe_entry_cases() {
  struct Reset {
    ~Reset() {
      set_moe_entry_for_tests(-1);
      tcg::set_entry_in_flight_for_tests(-1);
      tcg::set_entry_split_route_for_tests(-1);
    }
  } reset;
  const uint64_t split_before = tcg::entry_split_route_launches();
  const bool emu = std::getenv("DS41_PARITY_SMALL") != nullptr;
  struct C {
    int64_t h, E, k;
    bool vl;
    bool fused;  // the one launch takes it
  };
  std::vector<C> cases = {{1024, 24, 3, false, true}, {1024, 600, 10, true, true}, {768, 16, 4, false, false},
                          {1024, 200, 8, true, true}};
  if (!emu) {
    cases.push_back({5120, 384, 6, false, true});
    cases.push_back({5120, 384, 6, true, true});
  }
  uint64_t seed = 9100;
  for (const C& c : cases) {
    const int64_t h = c.h, E = c.E, k = c.k;
    auto streams = rand_floats(static_cast<size_t>(4 * h), ++seed, 2.0f);
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t i = 0; i < h; ++i) streams[j * h + i] = std::ldexp(streams[j * h + i], static_cast<int>(3 * j - 4));
    const std::vector<float> cw = {0.7f, -1.3f, 0.25f, 2.0f};
    auto nw = rand_floats(static_cast<size_t>(h), ++seed, 0.5f);
    for (auto& v : nw) v += 1.0f;
    const HostWeight gate = make_weight(quant::WeightFormat::kBF16, E, h, ++seed);
    DevWeight dgate(gate);
    auto bias = rand_floats(static_cast<size_t>(E), ++seed, 0.1f);
    auto bias_vl = rand_floats(static_cast<size_t>(E), ++seed, 0.1f);
    Dev<float> dst(streams), dcw(cw), dnw(nw), db(bias), dbv(bias_vl);
    const size_t ws_bytes = std::max(moe_bucket_workspace_bytes(1, k, E), tcg::entry_split_route_bytes(32)) + 256;
    Dev<uint8_t> dvl(std::vector<uint8_t>{1}), dws(ws_bytes);
    struct Out {
      Dev<float> x, lg;
      RouteOut route;
      Dev<uint32_t> cnt;
      Out(int64_t h, int64_t E, int64_t k)
          : x(std::vector<float>(h, 1.5f)),
            lg(std::vector<float>(E, -2.0f)),
            route(k, E),
            cnt(std::vector<uint32_t>(4, 0u)) {}
    };
    auto args = [&](Out& o) {
      MoeEntryArgs a;
      a.row.streams = dst.p;
      a.row.collapse_w = dcw.p;
      a.row.norm_weight = dnw.p;
      a.row.eps = 1e-6f;
      a.row.sum_threads = rms_norm_sum_threads(1, h);
      a.row.x = o.x.p;
      MoeRouteArgs& r = a.route;
      r.logits = o.lg.p;
      r.n = 1;
      r.n_experts = E;
      r.k = k;
      r.bias = db.p;
      r.bias_vl = c.vl ? dbv.p : nullptr;
      r.vl = c.vl ? dvl.p : nullptr;
      r.temp = 1.3f;
      r.route_scale = 2.5f;
      o.route.into(r);
      r.workspace = dws.p;
      r.workspace_bytes = ws_bytes;
      r.counters = o.cnt.p;
      return a;
    };
    Out u(h, E, k), f(h, E, k);
    set_moe_entry_for_tests(0);
    const uint64_t before_unfused = moe_entry_fused_launches();
    Status st = run_moe_entry(dgate.dw, args(u), nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(moe_entry_fused_launches(), before_unfused) << "off: three launches";
    set_moe_entry_for_tests(1);
    const std::string shape = dims({h, E, k}) + (c.vl ? " image row" : "") + (c.fused ? "" : " (refused)");
    // The default steps in flight (8), then the gate's 2, 4 and 8 (tcg::InFlight: the same bits; the counter
    // reused each time).
    // Then (rep 4) the split routing: the gate blocks' k best, the last block's picks over them.
    for (int rep = 0; rep < 5; ++rep) {
      tcg::set_entry_in_flight_for_tests(rep == 1 ? 2 : (rep == 2 ? 4 : (rep == 3 ? 8 : -1)));
      tcg::set_entry_split_route_for_tests(rep == 4 ? 1 : 0);
      const uint64_t before = moe_entry_fused_launches();
      st = run_moe_entry(dgate.dw, args(f), nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(moe_entry_fused_launches() - before, c.fused ? 1u : 0u) << shape;
      const size_t bad =
          count_bit_diffs(f.x.get(), u.x.get()) + count_bit_diffs(f.lg.get(), u.lg.get()) + f.route.diffs(u.route);
      size_t left = 0;
      for (uint32_t v : f.cnt.get()) left += v != 0;
      report(rep == 0 ? "moe_entry"
                      : (rep == 1   ? "moe_entry, 2 in flight"
                         : rep == 2 ? "moe_entry, 4 in flight"
                         : rep == 3 ? "moe_entry, 8 in flight"
                                    : "moe_entry, split routing"),
             shape, static_cast<double>(bad + left), 0,
             "collapse_norm_quads + the gate's tensor-core GEMV (try_dense's KS) + moe_route's code: x, logits, "
             "experts, weights, offsets, perm, slot_pos equal; counter zero after");
      EXPECT_EQ(bad + left, 0u) << shape;
    }
    // The routing is not trivially equal: another gate routes otherwise (the test could fail).
    EXPECT_NE(u.route.ex.get(), std::vector<int32_t>(static_cast<size_t>(k), 7));
  }
  // The split routing ran (k <= 8 and one row group per block of <= 32 rows: the released gate, and the
  // small cases whose KS leaves one or two row groups per block).
  EXPECT_GT(tcg::entry_split_route_launches(), split_before) << "no case took the split routing";
}

TEST(FusedRowsParity, MoeCombineExpand) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, k, h, c;
    bool add;
  };
  const std::vector<C> cases = {
      {1, 6, 5120, 4, true}, {3, 6, 5120, 4, false}, {2, 3, 333, 3, true}, {5, 2, 64, 8, true},
      {2, 13, 257, 4, true}};  // k = 13: the kernel's slot and expert-row batches of 8 take two rounds
  uint64_t seed = 1900;
  for (const C& c : cases) {
    const int64_t n = c.n, k = c.k, h = c.h, nk = n * k;
    auto out_perm = rand_floats(static_cast<size_t>(nk * h), ++seed, 2.0f);
    auto add = rand_floats(static_cast<size_t>(n * h), ++seed, 2.0f);
    auto streams = rand_floats(static_cast<size_t>(n * c.c * h), ++seed, 3.0f);
    auto post = rand_floats(static_cast<size_t>(n * c.c), ++seed);
    auto comb = rand_floats(static_cast<size_t>(n * c.c * c.c), ++seed);
    // Pair (r, j): expert (r * 7 + 5 * (k - j)) % 50 (descending in j: the sort matters), position a
    // permutation of [0, nk); every seventh pair unrouted (slot -1).
    std::vector<int32_t> ex(nk);
    std::vector<int64_t> sp(nk);
    for (int64_t p = 0; p < nk; ++p) {
      ex[p] = static_cast<int32_t>(((p / k) * 7 + 5 * (k - p % k)) % 50);
      sp[p] = p % 7 == 6 ? -1 : (p * 5 + 3) % nk;
    }
    Dev<float> dop(out_perm), dadd(add), dpost(post), dcomb(comb), uy(static_cast<size_t>(n * h)),
        fy(static_cast<size_t>(n * h)), us(streams), fs(streams);
    Dev<int32_t> dex(ex);
    Dev<int64_t> dsp(sp);
    ASSERT_TRUE(run_moe_combine(dop.p, dsp.p, dex.p, n, k, h, uy.p, nullptr).ok());
    if (c.add) {
      ASSERT_TRUE(run_add_inplace(uy.p, dadd.p, n * h, nullptr).ok());
    }
    ASSERT_TRUE(run_hc_expand(us.p, uy.p, dpost.p, dcomb.p, n, c.c, h, nullptr).ok());
    const Status st = run_moe_combine_expand(dop.p, dsp.p, dex.p, n, k, h, c.add ? dadd.p : nullptr, fy.p,
                                             fs.p, dpost.p, dcomb.p, c.c, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    const size_t bad = count_bit_diffs(fy.get(), uy.get()) + count_bit_diffs(fs.get(), us.get());
    report("moe_combine_expand", dims({n, k, h, c.c}) + (c.add ? " +shared" : ""), static_cast<double>(bad),
           0, "combine's sorted fp32 sum, the add, hc_expand's fp32 order: y and streams bit for bit");
  }
}

// The combine with the next site's collapse and norm (run_moe_combine_expand_collapse, DS41_COMBINE_COLLAPSE): y and
// the streams as run_moe_combine_expand, and x as run_hc_collapse + run_rms_norm over the streams it wrote (the
// sequence the MoE entry's fallback runs, which equals hc_collapse_norm_quads), bit for bit; the counters zero
// after; twice (the counters reused). The released width at decode rows 1 / 3, a null norm weight, a row of two
// blocks' channels where the second is partial, streams scaled apart (the collapse weights matter); c = 3 refused.
TEST(FusedRowsParity, MoeCombineExpandCollapse) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, k, h;
    bool add, norm;
  };
  const std::vector<C> cases = {{1, 6, 5120, true, true}, {3, 6, 5120, false, true}, {2, 6, 1024, true, false},
                                {1, 13, 260, true, true}};
  uint64_t seed = 1950;
  for (const C& c : cases) {
    const int64_t n = c.n, k = c.k, h = c.h, nk = n * k, cc = 4;
    auto out_perm = rand_floats(static_cast<size_t>(nk * h), ++seed, 2.0f);
    auto add = rand_floats(static_cast<size_t>(n * h), ++seed, 2.0f);
    auto streams = rand_floats(static_cast<size_t>(n * cc * h), ++seed, 3.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < cc; ++j)
        for (int64_t i = 0; i < h; ++i)
          streams[(r * cc + j) * h + i] = std::ldexp(streams[(r * cc + j) * h + i], static_cast<int>(2 * j - 3));
    auto post = rand_floats(static_cast<size_t>(n * cc), ++seed);
    auto comb = rand_floats(static_cast<size_t>(n * cc * cc), ++seed);
    auto cw = rand_floats(static_cast<size_t>(n * cc), ++seed, 1.5f);
    auto nw = rand_floats(static_cast<size_t>(h), ++seed, 0.5f);
    for (auto& v : nw) v += 1.0f;
    std::vector<int32_t> ex(nk);
    std::vector<int64_t> sp(nk);
    for (int64_t p = 0; p < nk; ++p) {
      ex[p] = static_cast<int32_t>(((p / k) * 7 + 5 * (k - p % k)) % 50);
      sp[p] = p % 7 == 6 ? -1 : (p * 5 + 3) % nk;
    }
    Dev<float> dop(out_perm), dadd(add), dpost(post), dcomb(comb), dcw(cw), dnw(nw), uy(static_cast<size_t>(n * h)),
        fy(uy.n), us(streams), ux(uy.n), fx(uy.n);
    Dev<int32_t> dex(ex);
    Dev<int64_t> dsp(sp);
    Dev<uint32_t> cnt(std::vector<uint32_t>(static_cast<size_t>(n) + 2, 0u));
    ASSERT_TRUE(run_moe_combine_expand(dop.p, dsp.p, dex.p, n, k, h, c.add ? dadd.p : nullptr, uy.p, us.p, dpost.p,
                                       dcomb.p, cc, nullptr)
                    .ok());
    ASSERT_TRUE(run_hc_collapse(us.p, dcw.p, n, cc, h, ux.p, nullptr).ok());
    ASSERT_TRUE(run_rms_norm(ux.p, n, h, c.norm ? dnw.p : nullptr, 1e-6f, ux.p, nullptr).ok());
    NextCollapse nc;
    nc.collapse_w = dcw.p;
    nc.norm_weight = c.norm ? dnw.p : nullptr;
    nc.eps = 1e-6f;
    nc.sum_threads = rms_norm_sum_threads(n, h);
    nc.x = fx.p;
    nc.counters = cnt.p;
    const std::string shape = dims({n, k, h}) + (c.add ? " +shared" : "") + (c.norm ? "" : " no norm weight");
    for (int rep = 0; rep < 2; ++rep) {
      Dev<float> fs(streams);
      const Status st = run_moe_combine_expand_collapse(dop.p, dsp.p, dex.p, n, k, h, c.add ? dadd.p : nullptr, fy.p,
                                                        fs.p, dpost.p, dcomb.p, cc, nc, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      size_t left = 0;
      for (uint32_t v : cnt.get()) left += v != 0;
      const size_t bad =
          count_bit_diffs(fy.get(), uy.get()) + count_bit_diffs(fs.get(), us.get()) + count_bit_diffs(fx.get(), ux.get());
      report(rep == 0 ? "combine_collapse" : "combine_collapse again", shape, static_cast<double>(bad + left), 0,
             "moe_combine_expand's y and streams, then hc_collapse + rms_norm's x of the new streams; counters zero");
    }
  }
  {  // c = 3: refused with a clear error, nothing launched
    Dev<float> d(std::vector<float>(64, 1.0f));
    Dev<int32_t> e(std::vector<int32_t>(2, 0));
    Dev<int64_t> p(std::vector<int64_t>(2, 0));
    Dev<uint32_t> cnt(std::vector<uint32_t>(2, 0u));
    NextCollapse nc;
    nc.collapse_w = d.p;
    nc.x = d.p;
    nc.counters = cnt.p;
    nc.sum_threads = 32;
    const Status st = run_moe_combine_expand_collapse(d.p, p.p, e.p, 1, 2, 16, nullptr, d.p, d.p, d.p, d.p, 3, nc, nullptr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("c = 4"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace ds41::cuda::parity

namespace ds41::cuda::parity {
namespace {

TEST(FusedRowsParity, SwigluPair) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t na, da, nb, db;
  };
  // The routed rows (n * 6 x 2304, routing weights as row scales) and the shared expert's rows
  // (n x 2304), decode n = 1 and 3 and a prefill chunk of 1,000 rows (the float4 kernel, past 65,536
  // quads); ragged small shapes (the element kernel); one set of each kind; an empty first set.
  const std::vector<C> cases = {{6, 2304, 1, 2304}, {18, 2304, 3, 2304}, {6000, 2304, 1000, 2304},
                                {5, 33, 2, 70},     {12, 2304, 2, 70},  {0, 16, 3, 40}};
  uint64_t seed = 2300;
  for (const C& c : cases) {
    auto ga = rand_floats(static_cast<size_t>(c.na * c.da), ++seed, 12.0f);
    auto ua = rand_floats(static_cast<size_t>(c.na * c.da), ++seed, 12.0f);
    auto gb = rand_floats(static_cast<size_t>(c.nb * c.db), ++seed, 12.0f);
    auto ub = rand_floats(static_cast<size_t>(c.nb * c.db), ++seed, 12.0f);
    auto sc = rand_floats(static_cast<size_t>(std::max<int64_t>(c.na, 1)), ++seed);
    if (!gb.empty())
      gb[0] = NAN, ub[1] = INFINITY, gb[2] = -INFINITY;  // NaN / inf pass as in std::min / clamp
    Dev<float> dga(ga), dua(ua), dgb(gb), dub(ub), dsc(sc), uoa(ga.size()), uob(gb.size()), foa(ga.size()),
        fob(gb.size());
    const float lim = 7.0f;
    if (c.na) {
      ASSERT_TRUE(run_swiglu(dga.p, dua.p, c.na, c.da, lim, dsc.p, uoa.p, nullptr).ok());
    }
    ASSERT_TRUE(run_swiglu(dgb.p, dub.p, c.nb, c.db, lim, nullptr, uob.p, nullptr).ok());
    const Status st = run_swiglu_pair({dga.p, dua.p, c.na, c.da, dsc.p, foa.p},
                                      {dgb.p, dub.p, c.nb, c.db, nullptr, fob.p}, lim, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    const size_t bad =
        (c.na ? count_bit_diffs(foa.get(), uoa.get()) : 0) + count_bit_diffs(fob.get(), uob.get());
    report("swiglu_pair", dims({c.na, c.da, c.nb, c.db}), static_cast<double>(bad), 0,
           "swiglu_kernel's ops per element over both sets: outputs bit for bit");
  }
}

}  // namespace
}  // namespace ds41::cuda::parity

namespace ds41::cuda::parity {
namespace {

TEST(FusedRowsParity, SparseAttentionRopeBack) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, heads, hd, n_freq, entries;
  };
  // Decode rows with split CTAs (the rotation inside the combine, row 0 of each case without
  // entries), a single split (the run_rope launch after), and more rows than the split kernel takes
  // (the float kernel, then run_rope). The released head (512 wide, 32 rotated pairs) at 2 heads.
  const std::vector<C> cases = {
      {1, 2, 512, 32, 300}, {3, 4, 128, 32, 200}, {2, 4, 128, 32, 20}, {18, 2, 64, 16, 40}};
  uint64_t seed = 2100;
  for (const C& c : cases) {
    const int64_t n = c.n, nh = c.heads, hd = c.hd, rows = c.entries + 8;
    auto q = rand_floats(static_cast<size_t>(n * nh * hd), ++seed, 0.5f);
    auto kv = rand_floats(static_cast<size_t>(rows * hd), ++seed, 0.5f);
    auto sink = rand_floats(static_cast<size_t>(nh), ++seed);
    std::vector<int64_t> offs(n + 1, 0), pos(n);
    std::vector<int32_t> index;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t m = r == 0 && n > 1 ? 0 : c.entries - r % 5;
      for (int64_t j = 0; j < m; ++j) index.push_back(static_cast<int32_t>((j * 7 + r) % rows));
      offs[r + 1] = static_cast<int64_t>(index.size());
      pos[r] = 1000 + 37 * r;
    }
    std::vector<float> inv(c.n_freq);
    for (int64_t i = 0; i < c.n_freq; ++i) inv[i] = std::pow(10000.0f, -static_cast<float>(i) / c.n_freq);
    Dev<float> dq(q), dkv(kv), dsink(sink), dinv(inv), uo(static_cast<size_t>(n * nh * hd)),
        fo(static_cast<size_t>(n * nh * hd));
    Dev<int64_t> doffs(offs), dpos(pos);
    Dev<int32_t> dindex(index);
    const size_t wsb = sparse_attention_workspace_bytes(n, nh, hd, c.entries);
    Dev<uint8_t> dws(wsb + 16);
    SparseAttentionArgs a;
    a.n = n;
    a.n_heads = nh;
    a.head_dim = hd;
    a.q = dq.p;
    a.kv_offsets = doffs.p;
    a.kv_index = dindex.p;
    a.kv = dkv.p;
    a.sink = dsink.p;
    a.scale = 0.0625f;
    a.max_entries_per_row = c.entries;
    a.workspace = dws.p;
    a.workspace_bytes = wsb;
    a.out = uo.p;
    ASSERT_TRUE(run_sparse_attention(a, nullptr).ok());
    ASSERT_TRUE(run_rope(uo.p, n, nh, hd, dpos.p, dinv.p, c.n_freq, true, nullptr).ok());
    a.out = fo.p;
    a.rope_pos = dpos.p;
    a.rope_inv_freq = dinv.p;
    a.rope_n_freq = c.n_freq;
    const Status st = run_sparse_attention(a, nullptr);
    ASSERT_TRUE(st.ok()) << st.message();
    report("attn + rope back", dims({n, nh, hd, c.entries}),
           static_cast<double>(count_bit_diffs(fo.get(), uo.get())), 0,
           "the combine's values, then rope_kernel's inverse rotation ops: out bit for bit");
  }
  SparseAttentionArgs bad;  // rejected on the host
  bad.n = 1;
  bad.n_heads = 1;
  bad.head_dim = 64;
  bad.rope_n_freq = 33;
  EXPECT_FALSE(run_sparse_attention(bad, nullptr).ok());
}

}  // namespace
}  // namespace ds41::cuda::parity
