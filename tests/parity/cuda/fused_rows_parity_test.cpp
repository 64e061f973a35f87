// Parity of the fused decode-step kernels (backends/cuda/fused_rows_kernels.h, issue 11) with the
// unfused op sequences they replace, bit for bit: RMSNorm -> RoPE -> Q_win / Q_kv / Q_idx packing
// and in-place fake quantization at the released widths (window KV rows 512, compressed entries
// 512, index keys 128, index queries 32 x 128), decode row counts (1, 3, 127: run_rms_norm's
// register layout) and prefill ones (128, 130: its strided layout), and past the limits (rows wider
// than a CTA run the unfused sequence; a Q_kv row 48 wide; no norm weight; the inverse rotation);
// the fused mHC site (map + collapse + norm).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/kv_rows_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

const char* op_name(FakeQuantOp op) {
  return op == FakeQuantOp::kWin ? "win" : op == FakeQuantOp::kKv ? "kv" : "idx";
}

TEST(FusedRowsParity, NormRopeQuant) {
  DS41_SKIP_WITHOUT_GPU();
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
    if (c.n_freq > 0)
      ASSERT_TRUE(run_rope(ux.p, npos, c.rows_per_pos, d, dpos.p, uinv.p, c.n_freq, c.inverse, nullptr).ok());
    if (c.quant && c.scatter)
      ASSERT_TRUE(run_encode_rows_scatter(c.op, d, ux.p, n, upool.p, doffs.p, nullptr).ok());
    if (c.quant && c.inplace) ASSERT_TRUE(run_fake_quant_inplace(c.op, d, ux.p, n, nullptr).ok());
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

TEST(FusedRowsParity, HcSite) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, c, h;
    bool weight;
  };
  // Released C = 4, h = 5120 at decode rows (1, 2, 17: one and three row groups), prefill rows past
  // run_rms_norm's register layout (130, a narrower h to keep the emulator quick), C = 3 / 8 / 2
  // (the other finish / partial instantiations, unaligned columns), and h past the fused kernel's
  // shared-memory row (the unfused sequence).
  const std::vector<C> cases = {{1, 4, 5120, true},  {2, 4, 5120, true}, {17, 4, 5120, true},
                                {130, 4, 640, true}, {3, 3, 33, false},  {9, 8, 260, true},
                                {2, 2, 12300, true}};
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
  }
}

}  // namespace
}  // namespace ds41::cuda::parity
