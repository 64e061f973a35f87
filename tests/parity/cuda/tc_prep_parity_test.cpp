// Parity rows of the element kernels around the tensor-core prefill linears
// (backends/cuda/tc_prep_kernels.h), bit for bit against host computations:
//   - the experts' weight decode into bfloat16 (FP4 rows, FP8 tiles with a ragged last tile row,
//     BF16; a mixed list in one call, ids out of order) = quant's dequant_rows rounded to bf16;
//   - the fp16 decode (experts and one dense weight) with its shift per band of 32 rows (scales
//     spread over 45 binades, one band with a NaN scale byte) = dequant_rows times 2^sigma in fp16,
//     and the sigmas themselves;
//   - split3 / sum3 on rows that take the four-column path (cols % 4 == 0) and the scalar one,
//     grouped by offsets: hi + lo + lo2 == x exactly, stacked per group, sum = hi + (lo + lo2);
//   - split2 / sum2: tau per row, the parts and the unscaled sum.
// Label gpu: skips without a device; scripts/cuda-host-emu/run.sh runs it on the host emulator.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/tc_prep_kernels.h"
#include "parity/cuda/kernel_parity_util.h"
#include "quant/weight_format.h"

namespace ds41::cuda {
namespace {

using parity::Dev;
using parity::DevWeightList;
using parity::HostWeight;
using quant::WeightFormat;

std::vector<float> host_dequant(const HostWeight& w) {
  std::vector<float> v(static_cast<size_t>(w.out * w.in));
  quant::kWeightFormatTraits[static_cast<int>(w.format)].dequant_rows(w.data.data(), w.scale.data(), w.out, w.in, 0,
                                                                      w.out, v.data());
  return v;
}

uint16_t half_bits(float f) { return static_cast<__half_raw>(__float2half_rn(f)).x; }

float half_float(uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}

float bf16_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// sigma of band b (rows [32 b, 32 b + 32)): the band's largest finite E8M0 byte puts its max |w| at
// 448 2^7 (FP8) or 6 2^13 (FP4); 0 without one.
int band_sigma(const HostWeight& w, int64_t b) {
  const bool fp4 = w.format == WeightFormat::kFp4Rows;
  const int64_t nb = w.in / 32;
  const int64_t b0 = fp4 ? b * 32 * nb : b * nb, b1 = fp4 ? std::min(b * 32 + 32, w.out) * nb : b0 + nb;
  int smax = -1;
  for (int64_t j = b0; j < b1; ++j)
    if (w.scale[j] != 255) smax = std::max(smax, static_cast<int>(w.scale[j]));
  return smax < 0 ? 0 : (fp4 ? 13 : 7) - (smax - 127);
}

TEST(TcPrepParity, ExpertsDequantBf16BitExact) {
  DS41_SKIP_WITHOUT_GPU();
  // 70 rows: a ragged last FP8 tile row; 700 items of 32: 3 blocks of the decode, the last partial.
  const int64_t out = 70, in = 320;
  std::vector<HostWeight> hw = {parity::make_weight(WeightFormat::kFp4Rows, out, in, 11),
                                parity::make_weight(WeightFormat::kFp8Tiles, out, in, 12),
                                parity::make_weight(WeightFormat::kBF16, out, in, 13)};
  const DevWeightList d_list(hw);
  const std::vector<int32_t> ids = {2, 0, 1};
  Dev<int32_t> d_ids(ids);
  Dev<uint16_t> d_out(ids.size() * out * in);
  ASSERT_TRUE(run_experts_dequant_bf16(d_list.p(), d_ids.p, 3, out, in,
                                       reinterpret_cast<__nv_bfloat16*>(d_out.p), nullptr)
                  .ok());
  const auto got = d_out.get();
  size_t bad = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto want = host_dequant(hw[ids[i]]);
    for (int64_t k = 0; k < out * in; ++k) bad += !parity::same_bits(bf16_float(got[i * out * in + k]), want[k]);
  }
  EXPECT_EQ(bad, 0u);
  std::printf("experts_dequant_bf16 fp4 / fp8 / bf16 %lld x %lld: %zu bits differ\n", (long long)out,
              (long long)in, bad);
}

TEST(TcPrepParity, Fp16DequantWithBandShiftsBitExact) {
  DS41_SKIP_WITHOUT_GPU();
  const int64_t out = 96, in = 256;
  std::vector<HostWeight> hw = {parity::make_weight(WeightFormat::kFp4Rows, out, in, 21),
                                parity::make_weight(WeightFormat::kFp8Tiles, out, in, 22)};
  for (HostWeight& h : hw) {  // scales over 45 binades; band 2 of each weight holds a NaN scale byte
    h.scale = parity::rand_e8m0(h.scale.size(), 23, 97, 142);
    const int64_t per_band = h.format == WeightFormat::kFp4Rows ? 32 * (in / 32) : in / 32;
    h.scale[2 * per_band + 1] = 255;
  }
  const DevWeightList d_list(hw);
  const std::vector<int32_t> ids = {1, 0};
  Dev<int32_t> d_ids(ids);
  const int64_t bands = out / 32;
  Dev<uint16_t> d_out(ids.size() * out * in);
  Dev<int32_t> d_shift(hw.size() * bands);
  ASSERT_TRUE(
      run_experts_dequant_f16(d_list.p(), d_ids.p, 2, out, in, reinterpret_cast<__half*>(d_out.p), d_shift.p,
                              nullptr)
          .ok());
  const auto got = d_out.get();
  const auto shifts = d_shift.get();
  size_t bad = 0, bad_shift = 0;
  auto check = [&](const HostWeight& h, const uint16_t* g, const int32_t* sig) {
    const auto v = host_dequant(h);
    for (int64_t b = 0; b < bands; ++b) bad_shift += sig[b] != band_sigma(h, b);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < in; ++k) {
        const uint16_t want = half_bits(std::ldexp(v[o * in + k], band_sigma(h, o / 32)));
        const uint16_t gb = g[o * in + k];
        const bool nan_both = (want & 0x7c00) == 0x7c00 && (want & 0x3ff) && (gb & 0x7c00) == 0x7c00 && (gb & 0x3ff);
        bad += !(nan_both || gb == want);
      }
  };
  for (size_t i = 0; i < ids.size(); ++i) check(hw[ids[i]], got.data() + i * out * in, shifts.data() + ids[i] * bands);
  // One dense weight (by value) into the dense slot.
  Dev<uint16_t> d_dense(out * in);
  Dev<int32_t> d_dshift(bands);
  ASSERT_TRUE(run_weight_dequant_f16(d_list.weights[1]->dw, reinterpret_cast<__half*>(d_dense.p), d_dshift.p, nullptr).ok());
  const auto dg = d_dense.get();
  const auto ds = d_dshift.get();
  check(hw[1], dg.data(), ds.data());
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(bad_shift, 0u);
  std::printf("dequant_f16 experts fp8 / fp4 + dense fp8 %lld x %lld: %zu values, %zu sigmas differ\n",
              (long long)out, (long long)in, bad, bad_shift);
}

// The MoE's routed rows split straight from the token rows (rows_of: a permutation with repeats,
// each token routed to several experts) equal the split of the gathered rows, bit for bit, in both
// splits (three bfloat16 parts; two fp16 parts with their row shifts), on both column paths.
TEST(TcPrepParity, SplitWithRowIndexEqualsGatheredSplit) {
  DS41_SKIP_WITHOUT_GPU();
  for (const int64_t cols : {int64_t{128}, int64_t{102}}) {
    const int64_t tokens = 9;
    const std::vector<int64_t> off = {0, 5, 5, 12, 18};  // 18 routed rows in 4 groups (one empty)
    const int64_t rows = off.back(), groups = static_cast<int64_t>(off.size()) - 1;
    std::vector<int64_t> idx(rows);
    for (int64_t r = 0; r < rows; ++r) idx[r] = (r * 7 + 3) % tokens;
    auto x = parity::rand_floats(static_cast<size_t>(tokens * cols), 77 + cols);
    for (int64_t i = 0; i < tokens * cols; i += 5) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
    std::vector<float> xg(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&xg[r * cols], &x[idx[r] * cols], static_cast<size_t>(cols) * sizeof(float));
    Dev<float> dx(x), dxg(xg);
    Dev<int64_t> doff(off), didx(idx);
    Dev<uint16_t> a3(3 * rows * cols), b3(3 * rows * cols), a2(2 * rows * cols), b2(2 * rows * cols);
    Dev<int32_t> ta(rows), tb(rows);
    ASSERT_TRUE(run_split3_bf16(dx.p, rows, cols, doff.p, groups, reinterpret_cast<__nv_bfloat16*>(a3.p), nullptr,
                                didx.p).ok());
    ASSERT_TRUE(run_split3_bf16(dxg.p, rows, cols, doff.p, groups, reinterpret_cast<__nv_bfloat16*>(b3.p), nullptr)
                    .ok());
    ASSERT_TRUE(run_split2_f16(dx.p, rows, cols, doff.p, groups, reinterpret_cast<__half*>(a2.p), ta.p, nullptr,
                               didx.p).ok());
    ASSERT_TRUE(
        run_split2_f16(dxg.p, rows, cols, doff.p, groups, reinterpret_cast<__half*>(b2.p), tb.p, nullptr).ok());
    EXPECT_EQ(a3.get(), b3.get()) << "split3 cols " << cols;
    EXPECT_EQ(a2.get(), b2.get()) << "split2 cols " << cols;
    EXPECT_EQ(ta.get(), tb.get()) << "split2 row shifts cols " << cols;
  }
}

TEST(TcPrepParity, SplitAndSumExact) {
  DS41_SKIP_WITHOUT_GPU();
  for (const int64_t cols : {int64_t{96}, int64_t{102}}) {  // the four-column path and the scalar one
    const std::vector<int64_t> off = {0, 3, 3, 10, 13};       // groups of 3, 0, 7 and 3 rows
    const int64_t rows = off.back(), groups = static_cast<int64_t>(off.size()) - 1;
    auto x = parity::rand_floats(static_cast<size_t>(rows * cols), 31 + cols);
    for (int64_t i = 0; i < rows * cols; i += 7) x[i] *= std::ldexp(1.0f, static_cast<int>(i % 60) - 30);
    x[5] = INFINITY;
    Dev<float> dx(x);
    Dev<int64_t> doff(off);
    // Three bfloat16 parts.
    Dev<uint16_t> d3(3 * rows * cols);
    ASSERT_TRUE(run_split3_bf16(dx.p, rows, cols, doff.p, groups, reinterpret_cast<__nv_bfloat16*>(d3.p), nullptr).ok());
    const auto p3 = d3.get();
    std::vector<float> y3(3 * rows * cols), want3(rows * cols);
    size_t bad = 0;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = off[g]; r < off[g + 1]; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r - off[g], cnt = off[g + 1] - off[g];
          const float h = bf16_float(p3[(3 * off[g] + i) * cols + c]);
          const float l = bf16_float(p3[(3 * off[g] + cnt + i) * cols + c]);
          const float l2 = bf16_float(p3[(3 * off[g] + 2 * cnt + i) * cols + c]);
          const float v = x[r * cols + c];
          const bool ok = std::isfinite(v) ? static_cast<double>(h) + l + l2 == v && h == bf16_float(parity::bf16_of(v))
                                           : (h == v && l == 0.0f && l2 == 0.0f);
          bad += !ok;
          // Products stand-ins for sum3: the parts themselves.
          y3[(3 * off[g] + i) * cols + c] = h;
          y3[(3 * off[g] + cnt + i) * cols + c] = l;
          y3[(3 * off[g] + 2 * cnt + i) * cols + c] = l2;
          want3[r * cols + c] = h + (l + l2);
        }
    EXPECT_EQ(bad, 0u) << "split3 cols " << cols;
    Dev<float> dy3(y3), dsum(rows * cols);
    ASSERT_TRUE(run_sum3(dy3.p, rows, cols, doff.p, groups, dsum.p, nullptr).ok());
    EXPECT_EQ(parity::count_bit_diffs(dsum.get(), want3), 0u) << "sum3 cols " << cols;
    // Two fp16 parts with the row shift; sum2 with a shift per group and band.
    Dev<uint16_t> d2(2 * rows * cols);
    Dev<int32_t> dtau(rows);
    ASSERT_TRUE(
        run_split2_f16(dx.p, rows, cols, doff.p, groups, reinterpret_cast<__half*>(d2.p), dtau.p, nullptr).ok());
    const auto p2 = d2.get();
    const auto tau = dtau.get();
    const int64_t bands = (cols + 31) / 32;
    std::vector<int32_t> gsig(groups * bands);
    for (size_t j = 0; j < gsig.size(); ++j) gsig[j] = static_cast<int32_t>(j % 9) - 4;
    std::vector<float> y2(2 * rows * cols), want2(rows * cols);
    size_t bad2 = 0;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = off[g]; r < off[g + 1]; ++r) {
        float m = 0.0f;
        for (int64_t c = 0; c < cols; ++c)
          if (std::isfinite(x[r * cols + c])) m = std::max(m, std::fabs(x[r * cols + c]));
        int e = 0;
        std::frexp(m, &e);
        const int want_tau = m > 0.0f ? 15 - e : 0;
        bad2 += tau[r] != want_tau;
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r - off[g], cnt = off[g + 1] - off[g];
          const float v = std::ldexp(x[r * cols + c], want_tau);
          const uint16_t hw = half_bits(v);
          const uint16_t lw = std::isfinite(v) ? half_bits(v - half_float(hw)) : half_bits(0.0f);
          bad2 += p2[(2 * off[g] + i) * cols + c] != hw || p2[(2 * off[g] + cnt + i) * cols + c] != lw;
          const float a0 = static_cast<float>(r + c), a1 = 0.25f * static_cast<float>(c);
          y2[(2 * off[g] + i) * cols + c] = a0;
          y2[(2 * off[g] + cnt + i) * cols + c] = a1;
          want2[r * cols + c] = std::ldexp(a0 + a1, -(want_tau + gsig[g * bands + c / 32]));
        }
      }
    EXPECT_EQ(bad2, 0u) << "split2 cols " << cols;
    Dev<float> dy2(y2), dsum2(rows * cols);
    Dev<int32_t> dg(gsig);
    ASSERT_TRUE(run_sum2_scaled(dy2.p, rows, cols, doff.p, groups, dtau.p, dg.p, dsum2.p, nullptr).ok());
    EXPECT_EQ(parity::count_bit_diffs(dsum2.get(), want2), 0u) << "sum2 cols " << cols;
    std::printf("split3 / sum3 / split2 / sum2 %lld rows x %lld cols in %lld groups exact\n", (long long)rows,
                (long long)cols, (long long)groups);
  }
}

}  // namespace
}  // namespace ds41::cuda
