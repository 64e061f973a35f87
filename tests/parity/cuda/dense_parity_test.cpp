// Parity of the CUDA elementwise / row-movement kernels (backends/cuda/elementwise_kernels.h)
// with the CPU reference (ds41_backend_cpu) or, for pure data movement without a CPU op, a host
// loop: embed (vocab 129280 x 5120), RMSNorm (hidden 5120, q rank 1280, head 512, index 128; in
// place), RoPE (64 x 512 and 32 x 128 heads, positions up to 2^20, inverse), SwiGLU (2304 wide,
// clamps hit, NaN passes, row scales), scale / add, gathers, scatter, column slices.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/elementwise_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

using backends::cpu::CpuBackend;

TEST(DenseParity, EmbedBf16) {
  DS41_SKIP_WITHOUT_GPU();
  const int64_t rows = 129280, dim = 5120;
  auto table = rand_bytes(static_cast<size_t>(rows * dim * 2), 11);  // any bf16 pattern incl. NaN/inf
  Dev<uint8_t> dt(table);
  CpuBackend cpu(nullptr);
  for (int64_t n : {1, 300}) {
    Rng r(12 + n);
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(r.next() % rows);
    ids[0] = static_cast<int32_t>(rows - 1);
    if (n > 1) ids[1] = 0;
    std::vector<float> want(n * dim);
    cpu.embed_bf16(table.data(), rows, dim, ids.data(), n, want.data());
    Dev<int32_t> di(ids);
    Dev<float> dout(want.size());
    ASSERT_TRUE(run_embed_bf16(dt.p, rows, dim, di.p, n, dout.p, nullptr).ok());
    report("embed_bf16", dims({rows, dim}) + " n=" + std::to_string(n), count_bit_diffs(dout.get(), want), 0,
           "exact (bf16 -> f32 is a shift)");
  }
}

TEST(DenseParity, RmsNorm) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, dim;
    bool weight, alias;
    float eps, scale;
  };
  const std::vector<C> cases = {{1, 5120, true, false, 1e-20f, 1.0f},  {300, 5120, true, true, 1e-20f, 30.0f},
                                {8, 1280, true, false, 1e-20f, 1e-3f}, {300, 512, false, false, 1e-6f, 1.0f},
                                {64, 128, true, true, 1e-20f, 1e4f},   {3, 100, true, false, 1e-6f, 1e-20f},
                                // the register path's largest row, and one past it (the strided path)
                                {2, 8192, true, true, 1e-20f, 1.0f},   {2, 8200, true, false, 1e-20f, 1.0f}};
  CpuBackend cpu(nullptr);
  uint64_t seed = 20;
  for (const C& c : cases) {
    auto x = rand_floats(static_cast<size_t>(c.n * c.dim), ++seed, c.scale);
    auto w = rand_floats(static_cast<size_t>(c.dim), ++seed, 2.0f);
    std::vector<float> want(x.size());
    cpu.rms_norm(x.data(), c.n, c.dim, c.weight ? w.data() : nullptr, c.eps, want.data());
    Dev<float> dx(x), dw(w), dy(x.size());
    float* out = c.alias ? dx.p : dy.p;
    ASSERT_TRUE(run_rms_norm(dx.p, c.n, c.dim, c.weight ? dw.p : nullptr, c.eps, out, nullptr).ok());
    auto got = c.alias ? dx.get() : dy.get();
    report("rms_norm",
           dims({c.n, c.dim}) + (c.weight ? " w" : " no-w") + (c.alias ? " in-place" : "") +
               " eps=" + std::to_string(c.eps),
           rel_elem(got, want), 5e-7,
           "fp64 sum of squares in another order: a flip of the fp32 mean moves y by <= 4 ulp");
  }
}

TEST(DenseParity, Rope) {
  DS41_SKIP_WITHOUT_GPU();
  struct C {
    int64_t n, heads, head_dim, n_freq;
    bool inverse;
    double base;
  };
  const std::vector<C> cases = {{300, 64, 512, 32, false, 160000},
                                {300, 64, 512, 32, true, 160000},
                                {1, 1, 512, 32, false, 10000},
                                {300, 32, 128, 32, false, 160000},
                                {5, 3, 10, 4, true, 10000}};
  CpuBackend cpu(nullptr);
  uint64_t seed = 40;
  for (const C& c : cases) {
    auto x = rand_floats(static_cast<size_t>(c.n * c.heads * c.head_dim), ++seed);
    std::vector<float> inv(c.n_freq);
    for (int64_t i = 0; i < c.n_freq; ++i)
      inv[i] = static_cast<float>(std::pow(c.base, -2.0 * static_cast<double>(i) / (2.0 * c.n_freq)));
    Rng r(++seed);
    std::vector<int64_t> pos(c.n);
    for (int64_t i = 0; i < c.n; ++i)
      pos[i] = i == 0 ? (int64_t{1} << 20) - 1 : static_cast<int64_t>(r.next() % (1 << 20));
    std::vector<float> want = x;
    cpu.rope(want.data(), c.n, c.heads, c.head_dim, pos.data(), inv.data(), c.n_freq, c.inverse);
    Dev<float> dx(x), dinv(inv);
    Dev<int64_t> dpos(pos);
    ASSERT_TRUE(run_rope(dx.p, c.n, c.heads, c.head_dim, dpos.p, dinv.p, c.n_freq, c.inverse, nullptr).ok());
    report(
        "rope",
        dims({c.n, c.heads, c.head_dim}) + " nf=" + std::to_string(c.n_freq) + (c.inverse ? " inv" : ""),
        rel_to_max(dx.get(), want), 1e-6,
        "cos/sin in fp64 (CUDA vs libm <= 2 ulp) rounded to fp32: a rare flip moves the result by <= 4 ulp");
  }
}

TEST(DenseParity, Swiglu) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  for (int64_t n : {1, 300}) {
    for (bool scaled : {false, true}) {
      const int64_t dim = 2304;
      auto g = rand_floats(static_cast<size_t>(n * dim), 60 + n, 25.0f);
      auto u = rand_floats(static_cast<size_t>(n * dim), 61 + n, 25.0f);
      auto rs = rand_floats(static_cast<size_t>(n), 62 + n, 1.5f);
      g[3] = NAN;
      u[5] = NAN;
      std::vector<float> want(g.size());
      cpu.swiglu(g.data(), u.data(), n, dim, 10.0f, scaled ? rs.data() : nullptr, want.data());
      Dev<float> dg(g), du(u), drs(rs), dout(want.size());
      ASSERT_TRUE(run_swiglu(dg.p, du.p, n, dim, 10.0f, scaled ? drs.p : nullptr, dout.p, nullptr).ok());
      report("swiglu", dims({n, dim}) + (scaled ? " row_scale" : ""), rel_elem(dout.get(), want), 5e-7,
             "SiLU's exp in fp64 (CUDA vs libm <= 1 ulp) rounded to fp32: a rare flip moves the result by <= "
             "4 ulp");
    }
  }
}

TEST(DenseParity, ScaleAddAndRowMovement) {
  DS41_SKIP_WITHOUT_GPU();
  const int64_t n = 300, dim = 5120;
  auto x = rand_floats(static_cast<size_t>(n * dim), 80, 3.0f);
  auto y = rand_floats(static_cast<size_t>(n * dim), 81, 3.0f);
  {
    Dev<float> dx(x), dy(y);
    ASSERT_TRUE(run_scale(dx.p, n * dim, 1.5f, nullptr).ok());
    ASSERT_TRUE(run_add_inplace(dy.p, dx.p, n * dim, nullptr).ok());
    std::vector<float> ws(x.size()), wa(y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      ws[i] = x[i] * 1.5f;
      wa[i] = y[i] + ws[i];
    }
    report("scale", dims({n, dim}), count_bit_diffs(dx.get(), ws), 0, "exact (one fp32 multiply)");
    report("add_inplace", dims({n, dim}), count_bit_diffs(dy.get(), wa), 0, "exact (one fp32 add)");
  }
  // gather_rows: src [1000, 512], 300 ids with -1 (zeros).
  {
    const int64_t rows = 1000, d = 512, m = 300;
    auto src = rand_floats(static_cast<size_t>(rows * d), 82);
    Rng r(83);
    std::vector<int64_t> idx(m);
    for (auto& i : idx) i = static_cast<int64_t>(r.next() % rows);
    idx[7] = -1;
    idx[0] = rows - 1;
    std::vector<float> want(m * d, 0.0f);
    for (int64_t i = 0; i < m; ++i)
      if (idx[i] >= 0) std::copy(&src[idx[i] * d], &src[(idx[i] + 1) * d], &want[i * d]);
    Dev<float> ds(src), dd(want.size());
    Dev<int64_t> di(idx);
    ASSERT_TRUE(run_gather_rows(ds.p, di.p, m, d, dd.p, nullptr).ok());
    report("gather_rows", dims({rows, d}) + " m=300", count_bit_diffs(dd.get(), want), 0, "exact (copy)");
    // gather_row_ptrs over the same rows.
    std::vector<const float*> ptrs(m);
    for (int64_t i = 0; i < m; ++i) ptrs[i] = ds.p + std::max<int64_t>(idx[i], 0) * d;
    for (int64_t i = 0; i < m; ++i)
      if (idx[i] < 0) std::copy(&src[0], &src[d], &want[i * d]);
    Dev<const float*> dp(ptrs);
    Dev<float> dd2(want.size());
    ASSERT_TRUE(run_gather_row_ptrs(dp.p, m, d, dd2.p, nullptr).ok());
    report("gather_row_ptrs", dims({rows, d}) + " m=300", count_bit_diffs(dd2.get(), want), 0,
           "exact (copy)");
    // scatter_rows: 300 distinct destinations of 1000, some skipped.
    std::vector<int64_t> perm(rows);
    for (int64_t i = 0; i < rows; ++i) perm[i] = i;
    for (int64_t i = rows - 1; i > 0; --i) std::swap(perm[i], perm[r.next() % (i + 1)]);
    std::vector<int64_t> dst_idx(perm.begin(), perm.begin() + m);
    dst_idx[3] = -1;
    auto small = rand_floats(static_cast<size_t>(m * d), 84);
    auto dst = src;
    for (int64_t i = 0; i < m; ++i)
      if (dst_idx[i] >= 0) std::copy(&small[i * d], &small[(i + 1) * d], &dst[dst_idx[i] * d]);
    Dev<float> dsmall(small), ddst(src);
    Dev<int64_t> dsi(dst_idx);
    ASSERT_TRUE(run_scatter_rows(dsmall.p, dsi.p, m, d, ddst.p, nullptr).ok());
    report("scatter_rows", dims({rows, d}) + " m=300", count_bit_diffs(ddst.get(), dst), 0, "exact (copy)");
  }
  // slice_cols: the Engram value slice of z [n, 5 * 5120].
  {
    const int64_t cols = 5 * 5120, begin = 4 * 5120, width = 5120;
    auto z = rand_floats(static_cast<size_t>(n * cols), 85);
    std::vector<float> want(n * width);
    for (int64_t i = 0; i < n; ++i)
      std::copy(&z[i * cols + begin], &z[i * cols + begin + width], &want[i * width]);
    Dev<float> dz(z), dout(want.size());
    ASSERT_TRUE(run_slice_cols(dz.p, n, cols, begin, width, dout.p, nullptr).ok());
    report("slice_cols", dims({n, cols}) + " [20480,25600)", count_bit_diffs(dout.get(), want), 0,
           "exact (copy)");
  }
}

}  // namespace
}  // namespace ds41::cuda::parity
