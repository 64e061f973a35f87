// Parity of the CUDA vision-tower kernels (MODEL_SPEC 3.11) with the CPU reference ops
// (src/backends/cpu/cpu_vision_ops.cpp): bias add, exact GELU, split-half 2D RoPE (plain rows and
// inside fused qkv rows), full attention within segments (image-sized segments, head 32 / 64 /
// 100, fused qkv strides) and the aligner's zero-padded unshuffle. One line per case: op, shape,
// error, tolerance, reason. The other tower ops are existing kernels with their own rows
// (rms_norm, swiglu, add_inplace in dense_parity_test.cpp; the BF16 linears in
// tensor_core_linear_test.cpp / linear_parity_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/dense_attention_kernels.h"
#include "backends/cuda/rope_2d_kernels.h"
#include "backends/cuda/space_to_depth_kernels.h"
#include "backends/cuda/vision_pointwise_kernels.h"
#include "kernel_parity_util.h"

namespace ds41::cuda::parity {
namespace {

using backends::cpu::CpuBackend;

std::vector<float> vision_inv_freq(int64_t head_dim, double theta = 10000.0) {
  // As model::VisionTower: f_i = theta^(-2i / (head_dim / 2)), i < head_dim / 4.
  std::vector<float> f(head_dim / 4);
  for (int64_t i = 0; i < head_dim / 4; ++i)
    f[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / (head_dim / 2)));
  return f;
}

// Patch coordinates of a gh x gw grid, row-major.
void grid_coords(int64_t gh, int64_t gw, std::vector<int32_t>* row, std::vector<int32_t>* col) {
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t c = 0; c < gw; ++c) {
      row->push_back(static_cast<int32_t>(r));
      col->push_back(static_cast<int32_t>(c));
    }
}

TEST(VisionParity, AddBias) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  struct C {
    int64_t n, dim;
  };
  for (const C& c : std::vector<C>{{1, 5120}, {300, 3072}, {9216, 1024}, {7, 5}}) {
    auto y = rand_floats(static_cast<size_t>(c.n * c.dim), 100 + c.n, 4.0f);
    auto b = rand_floats(static_cast<size_t>(c.dim), 101 + c.n, 0.5f);
    std::vector<float> want = y;
    cpu.add_bias(want.data(), c.n, c.dim, b.data());
    Dev<float> dy(y), db(b);
    ASSERT_TRUE(run_add_bias(dy.p, c.n, c.dim, db.p, nullptr).ok());
    report("add_bias", dims({c.n, c.dim}), static_cast<double>(count_bit_diffs(dy.get(), want)), 0,
           "exact (one fp32 add)");
  }
}

TEST(VisionParity, GeluErf) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  for (int64_t count : {int64_t{1}, int64_t{1024} * 5120}) {
    auto x = rand_floats(static_cast<size_t>(count), 110 + count, 8.0f);
    if (count > 8) {
      x[0] = 0.0f;
      x[1] = -0.0f;
      x[2] = 30.0f;
      x[3] = -30.0f;
      x[4] = std::numeric_limits<float>::quiet_NaN();
      x[5] = 1e-30f;
    }
    std::vector<float> want = x;
    cpu.gelu_erf(want.data(), count);
    Dev<float> dx(x);
    ASSERT_TRUE(run_gelu_erf(dx.p, count, nullptr).ok());
    report(
        "gelu_erf", dims({count}) + " U(-8,8)", rel_to_max(dx.get(), want), 2.4e-7,
        "float64 erf (CUDA vs libm <= 2 ulp) rounded to fp32: a flip moves one value by 1 ulp of <= the max");
  }
}

TEST(VisionParity, Rope2d) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  struct C {
    int64_t gh, gw, heads, head_dim;
    bool fused;  // rotate q and k inside [q | k | v] rows (ld = 3 * heads * head_dim), v untouched
  };
  const std::vector<C> cases = {{39, 39, 16, 64, false},
                                {96, 96, 16, 64, true},
                                {6, 7, 2, 64, true},
                                {45, 3, 2, 32, false},
                                {3, 87, 3, 8, false}};
  uint64_t seed = 120;
  for (const C& c : cases) {
    std::vector<int32_t> row, col;
    grid_coords(c.gh, c.gw, &row, &col);
    const int64_t n = c.gh * c.gw, D = c.heads * c.head_dim, ld = c.fused ? 3 * D : D;
    auto x = rand_floats(static_cast<size_t>(n * ld), ++seed, 3.0f);
    auto inv = vision_inv_freq(c.head_dim);
    // The reference on the rotated part (q and k: 2 * heads vectors of each row).
    const int64_t rot = c.fused ? 2 * D : D;
    std::vector<float> part(static_cast<size_t>(n * rot));
    for (int64_t r = 0; r < n; ++r)
      std::copy(x.begin() + r * ld, x.begin() + r * ld + rot, part.begin() + r * rot);
    cpu.rope_2d(part.data(), n, rot / c.head_dim, c.head_dim, row.data(), col.data(), inv.data());
    std::vector<float> want = x;
    for (int64_t r = 0; r < n; ++r)
      std::copy(part.begin() + r * rot, part.begin() + (r + 1) * rot, want.begin() + r * ld);
    Dev<float> dx(x), dinv(inv);
    Dev<int32_t> drow(row), dcol(col);
    ASSERT_TRUE(run_rope_2d(dx.p, n, rot / c.head_dim, c.head_dim, ld, drow.p, dcol.p, dinv.p, nullptr).ok());
    report(
        "rope_2d", dims({c.gh, c.gw, c.heads, c.head_dim}) + (c.fused ? " fused qkv (v untouched)" : ""),
        rel_to_max(dx.get(), want), 1e-6,
        "cos/sin in fp64 (CUDA vs libm <= 2 ulp) rounded to fp32: a rare flip moves the result by <= 4 ulp");
  }
}

TEST(VisionParity, DenseAttention) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(&ref_pool());
  struct C {
    std::vector<int64_t> segs;  // segment lengths
    int64_t heads, head_dim;
    bool fused;
    float amp;  // q / k amplitude: larger = peakier softmax
  };
  const std::vector<C> cases = {
      {{42, 135, 1, 64, 65, 700}, 2, 64, true, 3.0f},  // the golden set's grids, fused qkv rows
      {{1521, 1000}, 16, 64, false, 3.0f},             // a 544x544 image and another
      {{33, 96, 2}, 2, 32, false, 6.0f},               // head 32 (preset tiny-vision), very peaky
      {{100, 31}, 3, 100, true, 1.0f},                 // head 100 (padded to the 128 kernel)
      {{300}, 4, 8, false, 0.05f}};                    // nearly uniform weights
  uint64_t seed = 140;
  for (const C& c : cases) {
    std::vector<int64_t> off{0};
    int64_t mx = 0;
    for (int64_t s : c.segs) {
      off.push_back(off.back() + s);
      mx = std::max(mx, s);
    }
    const int64_t n = off.back(), D = c.heads * c.head_dim, ld = c.fused ? 3 * D : D;
    auto qkv = rand_floats(static_cast<size_t>(n * ld), ++seed, c.amp);
    auto vv = rand_floats(static_cast<size_t>(n * D), ++seed, 1.0f);
    std::vector<float> q(n * D), k(n * D), v(n * D);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < D; ++i) {
        q[r * D + i] = qkv[r * ld + i];
        k[r * D + i] = c.fused ? qkv[r * ld + D + i] : q[r * D + i] * 0.5f + vv[r * D + i];
        v[r * D + i] = vv[r * D + i];
      }
    // Separate buffers unless fused: then q / k / v live in one [n, 3D] buffer.
    std::vector<float> fused(static_cast<size_t>(n * 3 * D));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < D; ++i) {
        fused[r * 3 * D + i] = q[r * D + i];
        fused[r * 3 * D + D + i] = k[r * D + i];
        fused[r * 3 * D + 2 * D + i] = v[r * D + i];
      }
    ops::DenseAttentionArgs ca;
    ca.n = n;
    ca.n_heads = c.heads;
    ca.head_dim = c.head_dim;
    ca.q = q.data();
    ca.k = k.data();
    ca.v = v.data();
    ca.seg_offsets = off.data();
    ca.n_segs = static_cast<int64_t>(c.segs.size());
    ca.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    std::vector<float> want(n * D);
    ca.out = want.data();
    cpu.dense_attention(ca);
    Dev<float> dq(q), dk(k), dv(v), df(fused), dout(want.size());
    Dev<int64_t> doff(off);
    DenseAttentionDeviceArgs ga;
    ga.n = n;
    ga.n_heads = c.heads;
    ga.head_dim = c.head_dim;
    ga.q = c.fused ? df.p : dq.p;
    ga.k = c.fused ? df.p + D : dk.p;
    ga.v = c.fused ? df.p + 2 * D : dv.p;
    ga.ld_in = c.fused ? 3 * D : 0;
    ga.seg_offsets = doff.p;
    ga.n_segs = ca.n_segs;
    ga.max_seg_rows = mx;
    ga.scale = ca.scale;
    ga.out = dout.p;
    ASSERT_TRUE(run_dense_attention(ga, nullptr).ok());
    std::string segs;
    for (int64_t s : c.segs) segs += (segs.empty() ? "" : ",") + std::to_string(s);
    report("dense_attention",
           "segs " + segs + " " + dims({c.heads, c.head_dim}) + (c.fused ? " fused" : "") + " amp " +
               std::to_string(c.amp),
           rel_to_max(dout.get(), want), 5e-5,
           "fp32 online softmax and sum of p.v (largely cancelling terms) vs fp64 sums: ~sqrt(keys) ulps of "
           "sum|p.v| / |out|; emulator 1.2e-5 at 1521 keys");
  }
}

TEST(VisionParity, SpaceToDepth) {
  DS41_SKIP_WITHOUT_GPU();
  CpuBackend cpu(nullptr);
  struct C {
    int64_t gh, gw, c, k;
  };
  const std::vector<C> cases = {{6, 7, 128, 3},    {45, 3, 128, 3}, {3, 87, 128, 3},
                                {96, 96, 1024, 3}, {8, 15, 128, 3}, {5, 5, 3, 2}};
  uint64_t seed = 160;
  for (const C& c : cases) {
    auto x = rand_floats(static_cast<size_t>(c.gh * c.gw * c.c), ++seed);
    const int64_t m = ((c.gh + c.k - 1) / c.k) * ((c.gw + c.k - 1) / c.k);
    std::vector<float> want(static_cast<size_t>(m * c.c * c.k * c.k));
    cpu.space_to_depth(x.data(), c.gh, c.gw, c.c, c.k, want.data());
    Dev<float> dx(x), dout(want.size());
    ASSERT_TRUE(run_space_to_depth(dx.p, c.gh, c.gw, c.c, c.k, dout.p, nullptr).ok());
    report("space_to_depth", dims({c.gh, c.gw, c.c}) + " k=" + std::to_string(c.k),
           static_cast<double>(count_bit_diffs(dout.get(), want)), 0, "exact (data movement, zero padding)");
  }
}

// Argument checks happen before any launch: no device needed.
TEST(VisionParity, ArgumentErrors) {
  float* p = reinterpret_cast<float*>(16);
  const int32_t* ip = reinterpret_cast<const int32_t*>(16);
  EXPECT_EQ(run_rope_2d(p, 4, 2, 6, 12, ip, ip, p, nullptr).code(), StatusCode::kInvalidArgument);  // 6 % 4
  EXPECT_EQ(run_rope_2d(p, 4, 2, 8, 15, ip, ip, p, nullptr).code(), StatusCode::kInvalidArgument);  // ld < 16
  EXPECT_EQ(run_add_bias(p, 4, 8, nullptr, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run_gelu_erf(p, -1, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run_space_to_depth(p, 0, 3, 8, 3, p, nullptr).code(), StatusCode::kInvalidArgument);
  DenseAttentionDeviceArgs a;
  a.n = 4;
  a.n_heads = 2;
  a.head_dim = 129;  // over the kernel's 128
  a.q = a.k = a.v = p;
  a.out = p;
  a.seg_offsets = reinterpret_cast<const int64_t*>(16);
  a.n_segs = 1;
  a.max_seg_rows = 4;
  EXPECT_EQ(run_dense_attention(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.head_dim = 64;
  a.ld_in = 100;  // < heads * head_dim
  EXPECT_EQ(run_dense_attention(a, nullptr).code(), StatusCode::kInvalidArgument);
  a.ld_in = 0;
  a.n_segs = 70000;
  EXPECT_EQ(run_dense_attention(a, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ds41::cuda::parity
