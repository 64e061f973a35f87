// Parity of the packed-KV-row launchers (backends/cuda/kv_rows_kernels.h) with src/quant, bit for
// bit: encode-scatter into a byte pool at unaligned byte offsets (skipped rows untouched),
// gather-decode with repeats and -1 offsets (zeros), in-place fake quantization, for Q_win / Q_kv /
// Q_idx at the released widths and small ones, inputs with NaN / inf / -0 / rounding midpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backends/cuda/kv_rows_kernels.h"
#include "parity/cuda/kc_parity_util.h"
#include "quant/fake_quant.h"

namespace ds41::cuda {
namespace {

using namespace kc_test;

// Rows with per-16-block magnitudes 10^U(-40, 37) and injected specials (as cuda_parity_test).
std::vector<float> quant_input(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-40.0f, 37.0f);
  std::vector<float> x(count);
  for (int64_t b = 0; b < count; b += 16) {
    const float scale = std::pow(10.0f, ex(rng));
    const int kind = static_cast<int>(rng() % 16);
    for (int64_t i = b; i < b + 16; ++i) {
      float v = nd(rng) * scale;
      if (kind == 0) v = 0.0f;
      if (kind == 1) v = (i % 2) ? -0.0f : 0.0f;
      if (kind == 2) v = std::ldexp(static_cast<float>(static_cast<int>(rng() % 25) - 12) * 0.25f, -3);
      if (kind == 3) v = std::ldexp(static_cast<float>(rng() % 1024) + 0.5f, -7);
      x[i] = v;
    }
    if (kind == 4) x[b + rng() % 16] = NAN;
    if (kind == 5) x[b + rng() % 16] = (rng() & 1) ? INFINITY : -INFINITY;
  }
  return x;
}

int64_t row_bytes(FakeQuantOp op, int64_t n) {
  return op == FakeQuantOp::kWin  ? quant::window_row_bytes(n)
         : op == FakeQuantOp::kKv ? quant::kv_row_bytes(n)
                                  : quant::idx_row_bytes(n);
}
void cpu_encode(FakeQuantOp op, const float* x, int64_t n, uint8_t* row) {
  if (op == FakeQuantOp::kWin) quant::q_win_encode(x, n, row);
  if (op == FakeQuantOp::kKv) quant::q_kv_encode(x, n, row);
  if (op == FakeQuantOp::kIdx) quant::q_idx_encode(x, n, row);
}
void cpu_decode(FakeQuantOp op, const uint8_t* row, int64_t n, float* out) {
  if (op == FakeQuantOp::kWin) quant::q_win_decode(row, n, out);
  if (op == FakeQuantOp::kKv) quant::q_kv_decode(row, n, out);
  if (op == FakeQuantOp::kIdx) quant::q_idx_decode(row, n, out);
}
void cpu_inplace(FakeQuantOp op, float* x, int64_t n) {
  if (op == FakeQuantOp::kWin) quant::q_win_inplace(x, n);
  if (op == FakeQuantOp::kKv) quant::q_kv_inplace(x, n);
  if (op == FakeQuantOp::kIdx) quant::q_idx_inplace(x, n);
}
const char* op_name(FakeQuantOp op) {
  return op == FakeQuantOp::kWin ? "Q_win" : op == FakeQuantOp::kKv ? "Q_kv" : "Q_idx";
}

struct RowCase {
  FakeQuantOp op;
  int64_t channels, m, pool_rows;
};
const RowCase kRowCases[] = {
    {FakeQuantOp::kWin, 512, 300, 700},   // window rows (528 B)
    {FakeQuantOp::kKv, 512, 300, 700},    // main compressed rows (288 B)
    {FakeQuantOp::kIdx, 128, 600, 1500},  // indexer key rows (68 B)
    {FakeQuantOp::kWin, 64, 33, 80},     {FakeQuantOp::kKv, 16, 65, 130},
    {FakeQuantOp::kIdx, 32, 7, 20},      {FakeQuantOp::kKv, 48, 1, 3},
};

TEST(KvRowsParity, EncodeScatterDecodeGatherInplace) {
  KC_SKIP_WITHOUT_GPU();
  for (const RowCase& c : kRowCases) {
    const int64_t n = c.channels, rb = row_bytes(c.op, n), stride = rb + 1;  // odd stride: unaligned rows
    const std::string shape = std::string(op_name(c.op)) + " n=" + std::to_string(n) +
                              " m=" + std::to_string(c.m) + " pool=" + std::to_string(c.pool_rows);
    std::mt19937 rng(static_cast<uint32_t>(n * 31 + c.m));
    auto x = quant_input(n * c.m, static_cast<uint32_t>(7 + n + c.m));
    // Scatter offsets: distinct pool rows, every 7th row skipped (-1).
    std::vector<int64_t> rows(c.pool_rows);
    for (int64_t i = 0; i < c.pool_rows; ++i) rows[i] = i;
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<int64_t> off(c.m);
    for (int64_t i = 0; i < c.m; ++i) off[i] = (i % 7 == 3) ? -1 : rows[i] * stride + 1;
    std::vector<uint8_t> pool(c.pool_rows * stride + 1, 0xA5);
    std::vector<uint8_t> want_pool = pool;
    for (int64_t i = 0; i < c.m; ++i)
      if (off[i] >= 0) cpu_encode(c.op, &x[i * n], n, &want_pool[off[i]]);

    auto dx = upload(x);
    auto doff = upload(off);
    auto dpool = upload(pool);
    ASSERT_TRUE(dx->p && doff->p && dpool->p);
    KC_OK(run_encode_rows_scatter(c.op, n, dx->p, c.m, dpool->p, doff->p, nullptr));
    auto got_pool = from_dev(dpool->p, pool.size());
    int64_t bad = 0;
    for (size_t i = 0; i < pool.size(); ++i) bad += got_pool[i] != want_pool[i];
    report("encode_rows_scatter", shape, static_cast<double>(bad), 0, "packing is exact: bytes compared");
    EXPECT_EQ(bad, 0) << shape;

    // Gather: random pool rows with repeats, every 5th offset -1 (zeros).
    const int64_t mg = c.m + 5;
    std::vector<int64_t> goff(mg);
    for (int64_t i = 0; i < mg; ++i)
      goff[i] = (i % 5 == 2) ? -1 : static_cast<int64_t>(rng() % c.pool_rows) * stride + 1;
    std::vector<float> want(mg * n, 0.0f);
    for (int64_t i = 0; i < mg; ++i)
      if (goff[i] >= 0) cpu_decode(c.op, &want_pool[goff[i]], n, &want[i * n]);
    auto dgoff = upload(goff);
    DevBuf<float> dout(mg * n);
    ASSERT_TRUE(dgoff->p && dout.p);
    to_dev(dpool->p, want_pool);
    KC_OK(run_decode_rows_gather(c.op, n, dpool->p, dgoff->p, mg, dout.p, nullptr));
    auto got = from_dev(dout.p, mg * n);
    bad = bit_mismatches(got, want);
    report("decode_rows_gather", shape, static_cast<double>(bad), 0, "decoding is exact: bits compared");
    EXPECT_EQ(bad, 0) << shape;

    // In place.
    std::vector<float> want_x = x;
    for (int64_t i = 0; i < c.m; ++i) cpu_inplace(c.op, &want_x[i * n], n);
    KC_OK(run_fake_quant_inplace(c.op, n, dx->p, c.m, nullptr));
    got = from_dev(dx->p, x.size());
    bad = bit_mismatches(got, want_x);
    report("fake_quant_inplace", shape, static_cast<double>(bad), 0,
           "decode(encode(x)) is exact: bits compared");
    EXPECT_EQ(bad, 0) << shape;
  }
}

// Shape checks return before any CUDA call, so they run on every machine.
TEST(KvRowsParity, LaunchersRejectBadShapes) {
  EXPECT_FALSE(run_fake_quant_inplace(FakeQuantOp::kWin, 48, nullptr, 2, nullptr).ok());
  EXPECT_FALSE(run_fake_quant_inplace(FakeQuantOp::kKv, 24, nullptr, 2, nullptr).ok());
  EXPECT_FALSE(run_decode_rows_gather(FakeQuantOp::kIdx, 0, nullptr, nullptr, 1, nullptr, nullptr).ok());
  EXPECT_FALSE(run_encode_rows_scatter(FakeQuantOp::kWin, 512, nullptr, -1, nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(run_encode_rows_scatter(FakeQuantOp::kWin, 512, nullptr, 0, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace ds41::cuda
