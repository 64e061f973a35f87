// Table-driven test of every op of the CPU reference (src/backends/cpu) over the shared case
// table (tests/support/op_cases.h): seeded inputs, shapes past every limit, expected values from
// an independent naive double-precision implementation written here from MODEL_SPEC and the op
// contracts of src/ops/backend.h (never by calling an op). Float ops use the relative metric
// max|got - want| / rms(want) against each case's tolerance; exact ops (gathers, selections,
// masks, router expert ids) are compared bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "support/op_cases.h"

namespace ds41::testing::op_cases {
namespace {

using quant::WeightFormat;

// ---- independent decoders (MODEL_SPEC 2.1) ---------------------------------------------------
double ref_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double ref_e4m3(uint8_t b) {  // 1 sign, 4 exponent (bias 7), 3 mantissa; no inf
  const int e = (b >> 3) & 15, m = b & 7;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}
double ref_e2m1(uint8_t code) {  // 1 sign, 2 exponent (bias 1), 1 mantissa
  const int e = (code >> 1) & 3, m = code & 1;
  const double mag = e == 0 ? m * 0.5 : std::ldexp(1.0 + m / 2.0, e - 1);
  return (code & 8) ? -mag : mag;
}
double ref_e8m0(uint8_t b) { return std::ldexp(1.0, static_cast<int>(b) - 127); }

// Dequantized [out, in] weight in double, from the byte layouts of MODEL_SPEC 2.1.
std::vector<double> ref_dequant(WeightFormat f, const WeightData& w, int64_t out, int64_t in) {
  std::vector<double> d(out * in);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      double v = 0;
      switch (f) {
        case WeightFormat::kF32: {
          float x;
          std::memcpy(&x, &w.data[4 * (o * in + i)], 4);
          v = x;
          break;
        }
        case WeightFormat::kBF16: {
          uint16_t x;
          std::memcpy(&x, &w.data[2 * (o * in + i)], 2);
          v = ref_bf16(x);
          break;
        }
        case WeightFormat::kFp8Tiles:
          v = ref_e4m3(w.data[o * in + i]) * ref_e8m0(w.scale[(o / 32) * ((in + 31) / 32) + i / 32]);
          break;
        case WeightFormat::kFp4Rows: {
          const uint8_t byte = w.data[o * (in / 2) + i / 2];
          v = ref_e2m1(i % 2 ? byte >> 4 : byte & 15) * ref_e8m0(w.scale[o * (in / 32) + i / 32]);
          break;
        }
        case WeightFormat::kEngramRows:
          v = ref_e4m3(w.data[o * in + i]) * ref_e8m0(w.scale[o * (in / 32) + i / 32]);
          break;
        case WeightFormat::kNone: break;
      }
      d[o * in + i] = v;
    }
  return d;
}

// max|got - want| / rms(want) (the golden README's row error, over the whole output).
double rel_error(const std::vector<double>& want, const float* got) {
  double mx = 0, ss = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(got[i]) - want[i]));
    ss += want[i] * want[i];
  }
  if (want.empty()) return 0;
  return mx / std::max(std::sqrt(ss / static_cast<double>(want.size())), 1e-30);
}
double rel_error(const std::vector<double>& want, const std::vector<float>& got) {
  EXPECT_EQ(want.size(), got.size());
  return rel_error(want, got.data());
}

// Asserts the relative error within tol and prints it (the measured margin of every case).
void expect_close(const std::vector<double>& want, const std::vector<float>& got, double tol, const char* why,
                  const char* what = "") {
  const double e = rel_error(want, got);
  EXPECT_LE(e, tol) << what << " " << why;
  std::cout << "  " << ::testing::UnitTest::GetInstance()->current_test_info()->name() << " " << what
            << " rel error " << e << " (tol " << tol << ")\n";
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class CpuOpTable : public ::testing::Test {
 protected:
  CpuOpTable() : pool_(2), be_(&pool_) {}
  ThreadPool pool_;
  backends::cpu::CpuBackend be_;
};

#define CASE_TRACE(c) SCOPED_TRACE(std::string((c).name))

TEST_F(CpuOpTable, LinearAndGroupedLinear) {
  uint64_t seed = 1;
  for (const LinearCase& c : linear_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t G = c.groups > 0 ? c.groups : 1, x_cols = G * c.in;
    WeightData w = make_weight(c.format, c.out, c.in, rng);
    std::vector<float> x = rng.floats(c.n * x_cols, -2, 2);
    std::vector<double> wd = ref_dequant(c.format, w, c.out, c.in), want(c.n * c.out);
    const int64_t out_g = c.out / G;
    for (int64_t t = 0; t < c.n; ++t)
      for (int64_t o = 0; o < c.out; ++o) {
        const int64_t g = o / out_g;
        double s = 0;
        for (int64_t i = 0; i < c.in; ++i)
          s += static_cast<double>(x[t * x_cols + g * c.in + i]) * wd[o * c.in + i];
        want[t * c.out + o] = s;
      }
    ops::WeightRef ref{c.format, w.data.data(), w.scale.empty() ? nullptr : w.scale.data(),
                       c.out,    c.in,          c.name};
    std::vector<float> y(c.n * c.out, NAN);
    if (c.groups > 0)
      be_.grouped_linear(ref, c.groups, x.data(), c.n, y.data());
    else
      be_.linear(ref, x.data(), c.n, y.data());
    expect_close(want, y, c.tol, c.why, "y");
    if (c.groups == 0) {  // the quantized-resident path computes the same values
      backends::cpu::CpuBackend resident(&pool_, backends::cpu::CpuBackendOptions{false});
      std::vector<float> y2(c.n * c.out, NAN);
      resident.linear(ref, x.data(), c.n, y2.data());
      EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)));
    }
  }
}

TEST_F(CpuOpTable, RmsNorm) {
  uint64_t seed = 100;
  for (const RmsNormCase& c : rms_norm_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> x = rng.floats(c.n * c.dim, -3, 3), w = rng.floats(c.dim, 0.5f, 1.5f);
    x[0] = 1e4f;  // a large entry dominates the mean
    std::vector<double> want(c.n * c.dim);
    for (int64_t r = 0; r < c.n; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < c.dim; ++i) ss += static_cast<double>(x[r * c.dim + i]) * x[r * c.dim + i];
      const double inv = 1.0 / std::sqrt(ss / c.dim + c.eps);
      for (int64_t i = 0; i < c.dim; ++i)
        want[r * c.dim + i] = x[r * c.dim + i] * inv * (c.weighted ? w[i] : 1.0);
    }
    std::vector<float> y(x.size(), NAN);
    be_.rms_norm(x.data(), c.n, c.dim, c.weighted ? w.data() : nullptr, c.eps, y.data());
    expect_close(want, y, c.tol, c.why, "y");
    be_.rms_norm(x.data(), c.n, c.dim, c.weighted ? w.data() : nullptr, c.eps, x.data());  // y may alias x
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), y.size() * sizeof(float)));
  }
}

TEST_F(CpuOpTable, Rope) {
  uint64_t seed = 200;
  for (const RopeCase& c : rope_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> x = rng.floats(c.n * c.heads * c.head_dim, -1, 1), inv_freq(c.n_freq);
    for (int64_t i = 0; i < c.n_freq; ++i)
      inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / (2 * c.n_freq)));
    std::vector<int64_t> pos(c.n);
    for (int64_t r = 0; r < c.n; ++r) pos[r] = r == 0 ? 0 : rng.below(c.max_pos);
    std::vector<double> want(x.begin(), x.end());
    const int64_t off = c.head_dim - 2 * c.n_freq;  // channels [0, off) pass through
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t i = 0; i < c.n_freq; ++i) {
          // MODEL_SPEC 3.4.1: pair (off + 2i, off + 2i + 1); the angle is the fp32 product p * f_i.
          const float ang = static_cast<float>(pos[r]) * inv_freq[i];
          const double cs = std::cos(static_cast<double>(ang)),
                       sn = (c.inverse ? -1 : 1) * std::sin(static_cast<double>(ang));
          double* v = &want[(r * c.heads + h) * c.head_dim + off + 2 * i];
          const double e = v[0], o = v[1];
          v[0] = e * cs - o * sn;
          v[1] = e * sn + o * cs;
        }
    std::vector<float> y = x;
    be_.rope(y.data(), c.n, c.heads, c.head_dim, pos.data(), inv_freq.data(), c.n_freq, c.inverse);
    expect_close(want, y, c.tol, c.why, "y");
    for (int64_t r = 0; r < c.n; ++r)  // pass-through channels are untouched bit for bit
      for (int64_t h = 0; h < c.heads; ++h)
        EXPECT_EQ(0, std::memcmp(&y[(r * c.heads + h) * c.head_dim], &x[(r * c.heads + h) * c.head_dim],
                                 off * sizeof(float)));
  }
}

TEST_F(CpuOpTable, Swiglu) {
  uint64_t seed = 300;
  for (const SwigluCase& c : swiglu_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> g = rng.floats(c.n * c.dim, -3 * c.limit, 3 * c.limit);
    std::vector<float> u = rng.floats(c.n * c.dim, -3 * c.limit, 3 * c.limit), rs = rng.floats(c.n, 0, 2);
    std::vector<double> want(g.size());
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t i = 0; i < c.dim; ++i) {
        const double gg = std::min<double>(g[r * c.dim + i], c.limit);  // MODEL_SPEC 3.5: upper clamp only
        const double uu = std::max<double>(-c.limit, std::min<double>(u[r * c.dim + i], c.limit));
        want[r * c.dim + i] = (c.row_scale ? rs[r] : 1.0) * gg * sigmoid(gg) * uu;
      }
    std::vector<float> y(g.size(), NAN);
    be_.swiglu(g.data(), u.data(), c.n, c.dim, c.limit, c.row_scale ? rs.data() : nullptr, y.data());
    expect_close(want, y, c.tol, c.why, "y");
  }
}

TEST_F(CpuOpTable, EmbedBf16IsExact) {
  uint64_t seed = 400;
  for (const GatherCase& c : embed_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<uint8_t> table = rng.bytes(c.table_rows * c.dim * 2);
    std::vector<int32_t> ids(c.n);
    for (auto& id : ids) id = static_cast<int32_t>(rng.below(c.table_rows));
    ids.back() = static_cast<int32_t>(c.table_rows - 1);
    std::vector<float> y(c.n * c.dim);
    be_.embed_bf16(table.data(), c.table_rows, c.dim, ids.data(), c.n, y.data());
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t i = 0; i < c.dim; ++i) {
        uint32_t want = static_cast<uint32_t>(table[2 * (ids[r] * c.dim + i)] |
                                              table[2 * (ids[r] * c.dim + i) + 1] << 8)
                        << 16,
                 got;
        std::memcpy(&got, &y[r * c.dim + i], 4);
        ASSERT_EQ(got, want) << "row " << r << " col " << i;  // bits, NaN payloads included
      }
  }
}

TEST_F(CpuOpTable, EngramGatherIsExact) {
  uint64_t seed = 500;
  for (const GatherCase& c : engram_gather_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    WeightData t = make_weight(WeightFormat::kEngramRows, c.table_rows, c.dim, rng);
    std::vector<int64_t> ids(c.n * c.cols);
    for (auto& id : ids) id = rng.below(c.table_rows);
    ids[0] = c.table_rows - 1;
    std::vector<double> td = ref_dequant(WeightFormat::kEngramRows, t, c.table_rows, c.dim);
    std::vector<float> y(c.n * c.cols * c.dim, NAN);
    be_.engram_gather(t.data.data(), t.scale.data(), c.dim, ids.data(), c.n, c.cols, y.data());
    for (int64_t j = 0; j < c.n * c.cols; ++j)
      for (int64_t i = 0; i < c.dim; ++i)
        ASSERT_EQ(static_cast<double>(y[j * c.dim + i]), td[ids[j] * c.dim + i])
            << "entry " << j << " col " << i;
  }
}

TEST_F(CpuOpTable, ScatterAddRows) {
  uint64_t seed = 600;
  for (const ScatterCase& c : scatter_add_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> src = rng.floats(c.m * c.dim, -1, 1), dst = rng.floats(c.dst_rows * c.dim, -1, 1);
    std::vector<int64_t> rows(c.m);
    for (auto& r : rows) r = rng.below(c.dst_rows);
    std::vector<double> want(dst.begin(), dst.end());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t d = 0; d < c.dim; ++d) want[rows[i] * c.dim + d] += src[i * c.dim + d];
    be_.scatter_add_rows(src.data(), rows.data(), c.m, c.dim, dst.data());
    expect_close(want, dst, c.tol, c.why, "dst");
  }
}

// MODEL_SPEC 3.3: the mHC site map, in double throughout.
TEST_F(CpuOpTable, HcMap) {
  uint64_t seed = 700;
  for (const HcCase& c : hc_map_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t C = c.c, F = c.c * c.h, M = (2 + C) * C;
    std::vector<float> S = rng.floats(c.n * F, -2, 2), fn = rng.floats(M * F, -0.02f, 0.02f);
    std::vector<float> scale = rng.floats(3, 0.5f, 2.0f), base = rng.floats(M, -1, 1);
    const double hc_eps = 1e-6, norm_eps = 1e-20;
    std::vector<double> want_pre(c.n * C), want_post(c.n * C), want_comb(c.n * C * C);
    for (int64_t r = 0; r < c.n; ++r) {
      const float* f = &S[r * F];
      double ss = 0;
      for (int64_t i = 0; i < F; ++i) ss += static_cast<double>(f[i]) * f[i];
      const double inv = 1.0 / std::sqrt(ss / F + norm_eps);
      std::vector<double> m(M), L(C * C);
      for (int64_t j = 0; j < M; ++j) {
        double d = 0;
        for (int64_t i = 0; i < F; ++i) d += static_cast<double>(f[i]) * fn[j * F + i];
        m[j] = d * inv;
      }
      for (int64_t k = 0; k < C; ++k) {
        want_pre[r * C + k] = sigmoid(scale[0] * m[k] + base[k]) + hc_eps;
        want_post[r * C + k] = 2 * sigmoid(scale[1] * m[C + k] + base[C + k]);
      }
      double* cb = &want_comb[r * C * C];
      for (int64_t j = 0; j < C; ++j) {
        double mx = -INFINITY, s = 0;
        for (int64_t k = 0; k < C; ++k)
          mx = std::max(mx, L[j * C + k] = scale[2] * m[2 * C + j * C + k] + base[2 * C + j * C + k]);
        for (int64_t k = 0; k < C; ++k) s += std::exp(L[j * C + k] - mx);
        for (int64_t k = 0; k < C; ++k) cb[j * C + k] = std::exp(L[j * C + k] - mx) / s + hc_eps;
      }
      auto norm_cols = [&] {
        for (int64_t k = 0; k < C; ++k) {
          double s = 0;
          for (int64_t j = 0; j < C; ++j) s += cb[j * C + k];
          for (int64_t j = 0; j < C; ++j) cb[j * C + k] /= s + hc_eps;
        }
      };
      auto norm_rows = [&] {
        for (int64_t j = 0; j < C; ++j) {
          double s = 0;
          for (int64_t k = 0; k < C; ++k) s += cb[j * C + k];
          for (int64_t k = 0; k < C; ++k) cb[j * C + k] /= s + hc_eps;
        }
      };
      norm_cols();  // sinkhorn_iters column normalisations, one fewer row normalisations
      for (int64_t it = 1; it < c.sinkhorn_iters; ++it) {
        norm_rows();
        norm_cols();
      }
    }
    std::vector<float> pre(c.n * C, NAN), post(c.n * C, NAN), comb(c.n * C * C, NAN);
    ops::HcMapArgs a;
    a.n = c.n;
    a.c = C;
    a.h = c.h;
    a.sinkhorn_iters = c.sinkhorn_iters;
    a.streams = S.data();
    a.fn = fn.data();
    a.scale = scale.data();
    a.base = base.data();
    a.hc_eps = static_cast<float>(hc_eps);
    a.norm_eps = static_cast<float>(norm_eps);
    a.pre = pre.data();
    a.post = post.data();
    a.comb = comb.data();
    be_.hc_map(a);
    expect_close(want_pre, pre, c.tol, c.why, "pre");
    expect_close(want_post, post, c.tol, c.why, "post");
    expect_close(want_comb, comb, c.tol, c.why, "comb");
  }
}

TEST_F(CpuOpTable, HcCollapseAndExpand) {
  uint64_t seed = 800;
  for (const HcCase& c : hc_mix_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t C = c.c, H = c.h;
    std::vector<float> S = rng.floats(c.n * C * H, -2, 2), w = rng.floats(c.n * C, 0, 1);
    std::vector<float> y = rng.floats(c.n * H, -2, 2), post = rng.floats(c.n * C, 0, 2),
                       comb = rng.floats(c.n * C * C, 0, 1);
    std::vector<double> want_col(c.n * H, 0), want_exp(c.n * C * H);
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t i = 0; i < H; ++i) {
        for (int64_t j = 0; j < C; ++j)
          want_col[r * H + i] += static_cast<double>(w[r * C + j]) * S[(r * C + j) * H + i];
        for (int64_t k = 0; k < C; ++k) {  // MODEL_SPEC 3.3: the sum runs over Comb's first index
          double s = static_cast<double>(post[r * C + k]) * y[r * H + i];
          for (int64_t j = 0; j < C; ++j)
            s += static_cast<double>(comb[(r * C + j) * C + k]) * S[(r * C + j) * H + i];
          want_exp[(r * C + k) * H + i] = s;
        }
      }
    std::vector<float> col(c.n * H, NAN);
    be_.hc_collapse(S.data(), w.data(), c.n, C, H, col.data());
    expect_close(want_col, col, c.tol, c.why, "col");
    be_.hc_expand(S.data(), y.data(), post.data(), comb.data(), c.n, C, H);  // in place
    expect_close(want_exp, S, c.tol, c.why, "S");
  }
}

// MODEL_SPEC 3.2.4: the Engram gate per stream, dead rows unchanged with g = 0.
TEST_F(CpuOpTable, EngramUpdate) {
  uint64_t seed = 900;
  for (const EngramUpdateCase& c : engram_update_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t C = c.c, H = c.h;
    std::vector<float> S = rng.floats(c.n * C * H, -2, 2), k = rng.floats(c.n * C * H, -2, 2);
    std::vector<float> v = rng.floats(c.n * H, -1, 1), om = rng.floats(C * H, -1, 1);
    std::vector<uint8_t> dead(c.n, 0);
    dead[1] = 1;
    for (int64_t i = 0; i < H; ++i) k[i] = 0.0f;  // row 0 stream 0: alpha = 0 -> the 1e-6 floor
    std::vector<double> want_S(S.begin(), S.end()), want_g(c.n * C, 0);
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t s = 0; s < C; ++s) {
        if (dead[r]) continue;
        const float* Sr = &S[(r * C + s) * H];
        const float* kr = &k[(r * C + s) * H];
        double ss = 0, kk = 0, d = 0;
        for (int64_t i = 0; i < H; ++i) {
          ss += static_cast<double>(Sr[i]) * Sr[i];
          kk += static_cast<double>(kr[i]) * kr[i];
          d += static_cast<double>(Sr[i]) * om[s * H + i] * kr[i];
        }
        const double alpha =
            d / (std::sqrt(static_cast<double>(H)) * std::sqrt(ss / H + c.eps) * std::sqrt(kk / H + c.eps));
        const double sgn = alpha > 0 ? 1 : alpha < 0 ? -1 : 0;
        const double g = sigmoid(sgn * std::sqrt(std::max(std::fabs(alpha), 1e-6)));
        want_g[r * C + s] = g;
        for (int64_t i = 0; i < H; ++i) want_S[(r * C + s) * H + i] += g * v[r * H + i];
      }
    std::vector<float> gates(c.n * C, NAN), S0 = S;
    be_.engram_update(S.data(), k.data(), v.data(), om.data(), dead.data(), c.n, C, H, c.eps, gates.data());
    expect_close(want_g, gates, c.tol, c.why, "gates");
    expect_close(want_S, S, c.tol, c.why, "S");
    EXPECT_EQ(0, std::memcmp(&S[1 * C * H], &S0[1 * C * H], C * H * sizeof(float))) << "dead row changed";
    EXPECT_EQ(gates[1 * C], 0.0f);
  }
}

// MODEL_SPEC 3.4.7: one shared latent as key and value; the sink enlarges the denominator only.
TEST_F(CpuOpTable, Attention) {
  uint64_t seed = 1000;
  for (const AttentionCase& c : attention_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t n = static_cast<int64_t>(c.row_entries.size()), H = c.n_heads, D = c.head_dim;
    std::vector<int64_t> offs(n + 1, 0);
    for (int64_t r = 0; r < n; ++r) offs[r + 1] = offs[r] + c.row_entries[r];
    const int64_t pool_rows = 900;
    std::vector<float> kvpool = rng.floats(pool_rows * D, -1, 1), q = rng.floats(n * H * D, -1, 1);
    std::vector<float> sink = rng.floats(H, -2, 2);
    std::vector<const float*> kv(offs[n]);
    for (auto& p : kv) p = &kvpool[rng.below(pool_rows) * D];  // entries may repeat, like Reuse layers
    std::vector<double> want(n * H * D, 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t m = c.row_entries[r];
        if (m == 0) continue;  // a row without entries yields 0
        std::vector<double> s(m);
        double mx = sink[h];
        for (int64_t j = 0; j < m; ++j) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i)
            d += static_cast<double>(q[(r * H + h) * D + i]) * kv[offs[r] + j][i];
          s[j] = d * c.scale;
          mx = std::max(mx, s[j]);
        }
        double den = std::exp(sink[h] - mx);
        for (int64_t j = 0; j < m; ++j) den += std::exp(s[j] - mx);
        for (int64_t j = 0; j < m; ++j)
          for (int64_t i = 0; i < D; ++i)
            want[(r * H + h) * D + i] += std::exp(s[j] - mx) / den * kv[offs[r] + j][i];
      }
    std::vector<float> out(n * H * D, NAN);
    ops::AttentionArgs a;
    a.n = n;
    a.n_heads = H;
    a.head_dim = D;
    a.q = q.data();
    a.kv_offsets = offs.data();
    a.kv = kv.data();
    a.sink = sink.data();
    a.scale = c.scale;
    a.out = out.data();
    be_.attention(a);
    expect_close(want, out, c.tol, c.why, "out");
    for (int64_t r = 0; r < n; ++r)
      if (c.row_entries[r] == 0) {
        for (int64_t i = 0; i < H * D; ++i) ASSERT_EQ(out[r * H * D + i], 0.0f);
      }
  }
}

// MODEL_SPEC 3.4.6: out[r, t] = sum_h w[r, h] * relu(q[r, h] . key[t]) * scale, -inf past visible.
TEST_F(CpuOpTable, IndexerScores) {
  uint64_t seed = 1100;
  for (const IndexerCase& c : indexer_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t n = static_cast<int64_t>(c.visible.size()), H = c.n_heads, D = c.head_dim, T = c.n_keys;
    std::vector<float> q = rng.floats(n * H * D, -1, 1), w = rng.floats(n * H, -1, 1),
                       keys = rng.floats(T * D, -1, 1);
    std::vector<double> want;  // visible entries only; the rest must be -inf exactly
    std::vector<float> out(n * T, NAN);
    ops::IndexerArgs a;
    a.n = n;
    a.n_heads = H;
    a.head_dim = D;
    a.n_keys = T;
    a.q = q.data();
    a.w = w.data();
    a.keys = keys.data();
    a.visible = c.visible.data();
    a.scale = c.scale;
    a.out = out.data();
    be_.indexer_scores(a);
    std::vector<float> got;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t vis = std::min(c.visible[r], T);
      for (int64_t t = 0; t < T; ++t) {
        if (t >= vis) {
          ASSERT_TRUE(std::isinf(out[r * T + t]) && out[r * T + t] < 0) << "row " << r << " key " << t;
          continue;
        }
        double s = 0;
        for (int64_t h = 0; h < H; ++h) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i) d += static_cast<double>(q[(r * H + h) * D + i]) * keys[t * D + i];
          s += static_cast<double>(w[r * H + h]) * std::max(d, 0.0) * c.scale;
        }
        want.push_back(s);
        got.push_back(out[r * T + t]);
      }
    }
    expect_close(want, got, c.tol, c.why, "got");
  }
}

// Scores for the selection ops: `distinct` > 0 draws from that many values (ties), then -inf and
// +inf entries at the given rates.
std::vector<float> selection_scores(int64_t count, int64_t distinct, double neg_inf, double pos_inf,
                                    OpRng& rng) {
  std::vector<float> s(count);
  for (auto& x : s) {
    x = distinct > 0 ? static_cast<float>(rng.below(distinct)) : rng.uniform(-10, 10);
    const double u = rng.unit();
    if (u < neg_inf)
      x = -kInf;
    else if (u < neg_inf + pos_inf)
      x = kInf;
  }
  return s;
}

// Indices of the k best of s in ds41's tie order (ops/backend.h: larger first, equal -> lower
// index first, -inf never), by a full stable sort (independent of the op's partial sort).
std::vector<int64_t> ref_best(const float* s, int64_t t, int64_t k) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < t; ++i)
    if (s[i] != -kInf) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  if (static_cast<int64_t>(idx.size()) > k) idx.resize(k);
  return idx;
}

TEST_F(CpuOpTable, TopkRowsIsExact) {
  uint64_t seed = 1200;
  for (const TopkCase& c : topk_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> s =
        selection_scores(c.n * c.t, c.distinct, c.neg_inf_fraction, c.pos_inf_fraction, rng);
    std::vector<int32_t> out(c.n * c.k, -7);
    be_.topk_rows(s.data(), c.n, c.t, c.k, out.data());
    for (int64_t r = 0; r < c.n; ++r) {
      std::vector<int64_t> best = ref_best(&s[r * c.t], c.t, c.k);
      std::sort(best.begin(), best.end());  // written in ascending index order, padded with -1
      std::vector<int32_t> want(c.k, -1);
      for (size_t j = 0; j < best.size(); ++j) want[j] = static_cast<int32_t>(best[j]);
      EXPECT_EQ(std::vector<int32_t>(out.begin() + r * c.k, out.begin() + (r + 1) * c.k), want)
          << "row " << r;
    }
  }
}

TEST_F(CpuOpTable, CandidatePoolIsExact) {
  uint64_t seed = 1300;
  for (const CandidateCase& c : candidate_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t n = static_cast<int64_t>(c.visible.size()), nb = (c.t + c.block - 1) / c.block;
    std::vector<float> s = selection_scores(n * c.t, c.distinct, 0.0, 0.0, rng);
    for (int64_t r = 0; r < n; ++r)  // entries past visible are -inf (indexer_scores' contract)
      for (int64_t t = c.visible[r]; t < c.t; ++t) s[r * c.t + t] = -kInf;
    for (int64_t r = 0; r < n; ++r)  // the newest block scores lowest: only the forcing keeps it
      for (int64_t t = (c.visible[r] - 1) / c.block * c.block; t < c.visible[r]; ++t)
        s[r * c.t + t] = -100.0f;
    std::vector<uint8_t> mask(n * c.t, 7);
    be_.candidate_pool(s.data(), c.visible.data(), n, c.t, c.block, c.keep_blocks, mask.data());
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> bs(nb, -kInf);
      for (int64_t t = 0; t < c.t; ++t) bs[t / c.block] = std::max(bs[t / c.block], s[r * c.t + t]);
      if (c.visible[r] > 0) bs[(c.visible[r] - 1) / c.block] = kInf;  // the newest block is forced
      std::vector<uint8_t> want(c.t, 0);
      for (int64_t b : ref_best(bs.data(), nb, c.keep_blocks))
        for (int64_t t = b * c.block; t < std::min(c.t, (b + 1) * c.block); ++t) want[t] = 1;
      EXPECT_EQ(std::vector<uint8_t>(mask.begin() + r * c.t, mask.begin() + (r + 1) * c.t), want)
          << "row " << r;
    }
  }
}

TEST_F(CpuOpTable, SoftmaxPool) {
  uint64_t seed = 1400;
  for (const SoftmaxPoolCase& c : softmax_pool_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    std::vector<float> a = rng.floats(c.r * c.dim, -2, 2), b = rng.floats(c.r * c.dim, -30, 30);
    std::vector<double> want(c.dim);
    for (int64_t d = 0; d < c.dim; ++d) {
      double mx = -INFINITY, den = 0, z = 0;
      for (int64_t i = 0; i < c.r; ++i) mx = std::max<double>(mx, b[i * c.dim + d]);
      for (int64_t i = 0; i < c.r; ++i) den += std::exp(b[i * c.dim + d] - mx);
      for (int64_t i = 0; i < c.r; ++i) z += std::exp(b[i * c.dim + d] - mx) / den * a[i * c.dim + d];
      want[d] = z;
    }
    std::vector<float> out(c.dim, NAN);
    be_.softmax_pool(a.data(), b.data(), c.r, c.dim, out.data());
    expect_close(want, out, c.tol, c.why, "out");
  }
}

// MODEL_SPEC 3.5: the bias (bias_vl inside image spans) selects, the unbiased score weighs.
TEST_F(CpuOpTable, Router) {
  uint64_t seed = 1500;
  for (const RouterCase& c : router_cases()) {
    CASE_TRACE(c);
    OpRng rng(seed++);
    const int64_t E = c.n_experts, K = c.k;
    std::vector<float> logits = rng.floats(c.n * E, -4, 4), bias = rng.floats(E, -0.5f, 0.5f);
    std::vector<float> bias_vl = rng.floats(E, -0.5f, 0.5f);
    std::vector<uint8_t> vl(c.n, 0);
    for (int64_t r = 0; r < c.n; r += 2) vl[r] = 1;
    std::vector<int32_t> experts(c.n * K, -7);
    std::vector<float> weights(c.n * K, NAN);
    be_.router(logits.data(), c.n, E, bias.data(), c.bias_vl ? bias_vl.data() : nullptr, vl.data(), K, c.temp,
               c.route_scale, experts.data(), weights.data());
    std::vector<double> want_w;
    std::vector<float> got_w;
    for (int64_t r = 0; r < c.n; ++r) {
      const std::vector<float>& b = (c.bias_vl && vl[r]) ? bias_vl : bias;
      std::vector<double> score(E), biased(E);
      for (int64_t e = 0; e < E; ++e) {
        const double l = static_cast<double>(logits[r * E + e]) / c.temp;
        score[e] = std::sqrt(std::log1p(std::exp(l)));  // sqrt(softplus)
        biased[e] = score[e] + b[e];
      }
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return biased[x] > biased[y]; });
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) sum += score[order[j]];
      for (int64_t j = 0; j < K; ++j) {
        EXPECT_EQ(experts[r * K + j], order[j]) << "row " << r << " slot " << j;
        want_w.push_back(score[order[j]] / (sum + 1e-20) * c.route_scale);
        got_w.push_back(weights[r * K + j]);
      }
    }
    expect_close(want_w, got_w, c.tol, c.why, "got_w");
  }
}

}  // namespace
}  // namespace ds41::testing::op_cases
