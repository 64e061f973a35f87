// Parity of the CUDA quant kernels (src/backends/cuda) with the CPU reference (src/quant), bit
// for bit: elementwise E4M3 / E2M1 encoders over a 16.7M-float sweep of every sign / exponent /
// high mantissa pattern, Q_win / Q_kv / Q_idx encode + decode (f32, bf16) on random rows with
// NaN/inf/-0/midpoint injections, and the three weight dequantizers (f32, bf16, row ranges,
// ragged shapes, unaligned fallback). Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fake_quant_kernels.h"
#include "backends/cuda/weight_dequant.h"
#include "core/dtype.h"
#include "quant/act_quant.h"
#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/fake_quant.h"
#include "quant/weight_formats.h"

namespace ds41::cuda {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

#define CUDA_OK(expr) ASSERT_TRUE(cuda_status((expr), #expr).ok()) << cuda_status((expr), #expr).message()

// Device buffer owned by the test (tests may allocate; kernels never do).
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count, size_t extra_bytes = 0) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T) + extra_bytes + 16) != cudaSuccess)
      p = nullptr;
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

template <typename T>
void to_dev(T* d, const std::vector<T>& h) {
  ASSERT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}
template <typename T>
std::vector<T> from_dev(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Bit equality, except that any NaN matches any NaN (payloads are not part of the contract).
bool same_f32(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }
bool same_bf16(uint16_t a, uint16_t b) {
  bool na = (a & 0x7fff) > 0x7f80, nb = (b & 0x7fff) > 0x7f80;
  return (na && nb) || a == b;
}

// ---------------------------------------------------------------------------------------------
TEST(CudaParity, ScalarEncodersOnBitPatternSweep) {
  SKIP_WITHOUT_GPU();
  // Every (sign, exponent, top-15 mantissa bits) pattern; the low 8 bits alternate between 0
  // (exact ties and representable values) and a hash (off-tie values).
  const size_t n = size_t{1} << 24;
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t low = (i & 1) ? static_cast<uint32_t>((i * 2654435761u) >> 24) : 0u;
    uint32_t u = static_cast<uint32_t>(i << 8) | low;
    std::memcpy(&x[i], &u, 4);
  }
  DevBuf<float> dx(n);
  DevBuf<uint8_t> dc(n);
  ASSERT_TRUE(dx.p && dc.p);
  to_dev(dx.p, x);
  for (int kind = 0; kind < 2; ++kind) {
    Status s = kind == 0 ? run_e4m3_encode(dx.p, n, dc.p, nullptr) : run_e2m1_encode(dx.p, n, dc.p, nullptr);
    ASSERT_TRUE(s.ok()) << s.message();
    auto got = from_dev(dc.p, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      uint8_t want = kind == 0 ? quant::e4m3_from_float(x[i]) : quant::e2m1_from_float(x[i]);
      if (got[i] != want && ++bad <= 10)
        ADD_FAILURE() << (kind ? "e2m1" : "e4m3") << " x=" << x[i] << " bits 0x" << std::hex << bits(x[i])
                      << " gpu 0x" << int{got[i]} << " cpu 0x" << int{want} << std::dec;
    }
    EXPECT_EQ(bad, 0u) << (kind ? "e2m1" : "e4m3") << " mismatches of " << n;
  }
}

// Rows with per-block magnitudes 10^U(-40, 38) and injected specials.
std::vector<float> fake_quant_input(int64_t n, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-40.0f, 37.0f);
  std::vector<float> x(n * rows);
  for (int64_t b = 0; b < n * rows; b += 16) {
    float scale = std::pow(10.0f, ex(rng));
    int kind = static_cast<int>(rng() % 16);
    for (int64_t i = b; i < b + 16; ++i) {
      float v = nd(rng) * scale;
      if (kind == 0) v = 0.0f;
      if (kind == 1) v = (i % 2) ? -0.0f : 0.0f;
      if (kind == 2)
        v = std::ldexp(static_cast<float>(static_cast<int>(rng() % 25) - 12) * 0.25f, -3);  // E2M1 ties
      if (kind == 3)
        v = std::ldexp(static_cast<float>(rng() % 1024) + 0.5f, -7);  // E4M3 ties for some scales
      x[i] = v;
    }
    if (kind == 4) x[b + rng() % 16] = NAN;
    if (kind == 5) x[b + rng() % 16] = (rng() & 1) ? INFINITY : -INFINITY;
  }
  return x;
}

void check_fake_quant(FakeQuantOp op, int64_t n, int64_t rows) {
  auto plan = plan_fake_quant(op, n, rows);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const int64_t rb = plan->row_bytes;
  auto x = fake_quant_input(n, rows, 100 + static_cast<uint32_t>(op));
  // CPU reference.
  std::vector<uint8_t> want(rb * rows);
  std::vector<float> want_f(n * rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[r * n];
    uint8_t* wr = &want[r * rb];
    float* fr = &want_f[r * n];
    if (op == FakeQuantOp::kWin) quant::q_win_encode(xr, n, wr), quant::q_win_decode(wr, n, fr);
    if (op == FakeQuantOp::kKv) quant::q_kv_encode(xr, n, wr), quant::q_kv_decode(wr, n, fr);
    if (op == FakeQuantOp::kIdx) quant::q_idx_encode(xr, n, wr), quant::q_idx_decode(wr, n, fr);
  }
  DevBuf<float> dx(n * rows), df(n * rows);
  DevBuf<uint8_t> drow(rb * rows);
  DevBuf<uint16_t> dh(n * rows);
  ASSERT_TRUE(dx.p && df.p && drow.p && dh.p);
  to_dev(dx.p, x);
  ASSERT_TRUE(run_fake_quant_encode(*plan, dx.p, drow.p, nullptr).ok());
  auto got = from_dev(drow.p, rb * rows);
  size_t bad = 0;
  for (size_t j = 0; j < got.size(); ++j)
    if (got[j] != want[j] && ++bad <= 10)
      ADD_FAILURE() << "op " << int(op) << " row " << j / rb << " byte " << j % rb << ": gpu 0x" << std::hex
                    << int{got[j]} << " cpu 0x" << int{want[j]} << std::dec;
  EXPECT_EQ(bad, 0u);
  ASSERT_TRUE(run_fake_quant_decode(*plan, drow.p, DType::kF32, df.p, nullptr).ok());
  auto gf = from_dev(df.p, n * rows);
  ASSERT_TRUE(run_fake_quant_decode(*plan, drow.p, DType::kBF16, dh.p, nullptr).ok());
  auto gh = from_dev(dh.p, n * rows);
  bad = 0;
  for (size_t i = 0; i < gf.size(); ++i)
    if ((!same_f32(gf[i], want_f[i]) || !same_bf16(gh[i], f32_to_bf16(want_f[i]))) && ++bad <= 10)
      ADD_FAILURE() << "op " << int(op) << " decode i " << i << ": gpu " << gf[i] << " cpu " << want_f[i];
  EXPECT_EQ(bad, 0u);
}

TEST(CudaParity, QWinRows) {
  SKIP_WITHOUT_GPU();
  check_fake_quant(FakeQuantOp::kWin, 512, 4099);
}
TEST(CudaParity, QKvRows) {
  SKIP_WITHOUT_GPU();
  check_fake_quant(FakeQuantOp::kKv, 512, 4099);
  check_fake_quant(FakeQuantOp::kKv, 48, 33);  // n not a multiple of 32: blocks straddle warps
}
// --numerics fp8-act's activation quantization against quant::act_quant_fp8_rows, bit for bit, at the
// released K of the FP8 / FP4 linears (5120, 2304, 1280, 4096 per wo_a group), a K with a short last
// block (40: 32 + 8), and one row; the specials of fake_quant_input (zeros, -0, ties, NaN, inf), in
// place too.
TEST(CudaParity, ActQuantRows) {
  SKIP_WITHOUT_GPU();
  for (auto [k, rows] : std::vector<std::pair<int64_t, int64_t>>{{5120, 67}, {2304, 129}, {1280, 5}, {4096, 16},
                                                                  {40, 334}, {5120, 1}}) {  // k * rows: multiples of 16 (fake_quant_input)
    SCOPED_TRACE("k " + std::to_string(k) + " rows " + std::to_string(rows));
    auto x = fake_quant_input(k, rows, 7 + static_cast<uint32_t>(k));
    std::vector<float> want(x.size());
    quant::act_quant_fp8_rows(x.data(), rows, k, want.data());
    DevBuf<float> dx(k * rows), dy(k * rows);
    ASSERT_TRUE(dx.p && dy.p);
    to_dev(dx.p, x);
    ASSERT_TRUE(run_act_quant_rows(dx.p, rows, k, dy.p, nullptr).ok());
    ASSERT_TRUE(run_act_quant_rows(dx.p, rows, k, dx.p, nullptr).ok());  // in place
    auto got = from_dev(dy.p, k * rows), got_in_place = from_dev(dx.p, k * rows);
    size_t bad = 0, changed = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      changed += !same_f32(want[i], x[i]);
      if ((!same_f32(got[i], want[i]) || !same_f32(got_in_place[i], want[i])) && ++bad <= 10)
        ADD_FAILURE() << "i " << i << " x " << x[i] << ": gpu " << got[i] << " / " << got_in_place[i] << " cpu "
                      << want[i];
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_GT(changed, got.size() / 4);
  }
  EXPECT_FALSE(run_act_quant_rows(nullptr, 1, 0, nullptr, nullptr).ok());
}

TEST(CudaParity, QIdxRows) {
  SKIP_WITHOUT_GPU();
  check_fake_quant(FakeQuantOp::kIdx, 128, 16411);
}

// Golden vectors (tests/unit/quant/vectors, made with ml_dtypes) through the CUDA encoders.
TEST(CudaParity, GoldenVectorsThroughCuda) {
  SKIP_WITHOUT_GPU();
  const char* env = std::getenv("DS41_QUANT_VECTORS_DIR");
  std::string dir = env ? env : std::string(DS41_SOURCE_DIR) + "/tests/unit/quant/vectors";
  const char* files[3] = {"q_win.bin", "q_kv.bin", "q_idx.bin"};
  for (int op = 0; op < 3; ++op) {
    std::ifstream in(dir + "/" + files[op], std::ios::binary);
    std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(b.size(), 24u) << dir << "/" << files[op];
    uint32_t hdr[4];
    std::memcpy(hdr, &b[8], 16);
    const int64_t n = hdr[1], rows = hdr[2], rb = hdr[3];
    std::vector<float> x(n * rows);
    std::memcpy(x.data(), &b[24], x.size() * 4);
    const uint8_t* want = &b[24 + x.size() * 4];
    auto plan = plan_fake_quant(static_cast<FakeQuantOp>(op), n, rows);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->row_bytes, rb);
    DevBuf<float> dx(x.size());
    DevBuf<uint8_t> drow(rb * rows);
    to_dev(dx.p, x);
    ASSERT_TRUE(run_fake_quant_encode(*plan, dx.p, drow.p, nullptr).ok());
    auto got = from_dev(drow.p, rb * rows);
    size_t bad = 0;
    for (int64_t j = 0; j < rb * rows; ++j)
      if (got[j] != want[j] && ++bad <= 10)
        ADD_FAILURE() << files[op] << " byte " << j << ": gpu 0x" << std::hex << int{got[j]} << " golden 0x"
                      << int{want[j]} << std::dec;
    EXPECT_EQ(bad, 0u) << files[op];
  }
}

// ---------------------------------------------------------------------------------------------
std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, int lo = 0, int hi = 255) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(lo + rng() % (hi - lo + 1));
  return v;
}

template <typename Launch>
void compare_dequant(const std::vector<float>& want, int64_t count, Launch launch, const char* what) {
  DevBuf<float> df(count);
  DevBuf<uint16_t> dh(count);
  ASSERT_TRUE(df.p && dh.p);
  ASSERT_TRUE(launch(DType::kF32, static_cast<void*>(df.p)));
  auto gf = from_dev(df.p, count);
  ASSERT_TRUE(launch(DType::kBF16, static_cast<void*>(dh.p)));
  auto gh = from_dev(dh.p, count);
  size_t bad = 0;
  for (int64_t i = 0; i < count; ++i)
    if ((!same_f32(gf[i], want[i]) || !same_bf16(gh[i], f32_to_bf16(want[i]))) && ++bad <= 10)
      ADD_FAILURE() << what << " i " << i << ": gpu " << gf[i] << " cpu " << want[i];
  EXPECT_EQ(bad, 0u) << what;
}

void check_fp8(int64_t out, int64_t in, int64_t r0, int64_t r1, size_t misalign) {
  const int64_t to = quant::ceil_div(out, 32), ti = quant::ceil_div(in, 32);
  auto w = random_bytes(out * in, 11);         // includes the NaN codes 0x7f / 0xff
  auto s = random_bytes(to * ti, 12, 0, 255);  // includes 0 (2^-127), 0xff (NaN) and overflow to inf
  std::vector<float> want((r1 - r0) * in);
  quant::fp8_tiles_dequant_rows(w.data(), s.data(), out, in, r0, r1, want.data());
  DevBuf<uint8_t> dw(w.size(), misalign), ds(s.size());
  ASSERT_TRUE(dw.p && ds.p);
  uint8_t* wp = dw.p + misalign;
  ASSERT_EQ(cudaMemcpy(wp, w.data(), w.size(), cudaMemcpyHostToDevice), cudaSuccess);
  to_dev(ds.p, s);
  auto plan = plan_fp8_tiles_dequant(out, in, r0, r1, DType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  compare_dequant(
      want, (r1 - r0) * in,
      [&](DType t, void* o) {
        auto p = *plan;
        p.out_dtype = t;
        return run_fp8_tiles_dequant(p, wp, ds.p, o, nullptr).ok();
      },
      "fp8 tiles");
}

TEST(CudaParity, Fp8TileDequant) {
  SKIP_WITHOUT_GPU();
  check_fp8(1000, 1056, 0, 1000, 0);  // vector path, partial last row tile
  check_fp8(1000, 1056, 37, 300, 0);  // row range
  check_fp8(70, 100, 0, 70, 0);       // in_dim % 16 != 0: per-element path
  check_fp8(64, 256, 0, 64, 3);       // unaligned weights: per-element fallback
}

TEST(CudaParity, Fp4ExpertDequant) {
  SKIP_WITHOUT_GPU();
  const int64_t out = 2304, in = 5120;  // ffn.experts.{e}.w1 logical shape (MODEL_SPEC 2.3)
  auto packed = random_bytes(out * in / 2, 21);
  auto s = random_bytes(out * in / 32, 22, 0, 255);
  for (int64_t r0 : {int64_t{0}, int64_t{1000}}) {
    int64_t r1 = r0 == 0 ? out : 1017;
    std::vector<float> want((r1 - r0) * in);
    quant::fp4_rows_dequant_rows(packed.data(), s.data(), out, in, r0, r1, want.data());
    DevBuf<uint8_t> dp(packed.size()), ds(s.size());
    to_dev(dp.p, packed);
    to_dev(ds.p, s);
    auto plan = plan_fp4_rows_dequant(out, in, r0, r1, DType::kF32);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    compare_dequant(
        want, (r1 - r0) * in,
        [&](DType t, void* o) {
          auto p = *plan;
          p.out_dtype = t;
          return run_fp4_rows_dequant(p, dp.p, ds.p, o, nullptr).ok();
        },
        "fp4 rows");
  }
}

TEST(CudaParity, EngramRowGather) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 5000, dim = 256, n_ids = 3000;
  auto q = random_bytes(rows * dim, 31);
  auto s = random_bytes(rows * dim / 32, 32, 90, 140);
  std::mt19937 rng(33);
  std::vector<int64_t> ids(n_ids);
  for (auto& id : ids) id = rng() % rows;
  ids[5] = ids[6];
  ids[7] = rows - 1;
  std::vector<float> want(n_ids * dim);
  for (int64_t r = 0; r < n_ids; ++r)
    quant::engram_row_dequant(&q[ids[r] * dim], &s[ids[r] * 8], dim, &want[r * dim]);
  ids[9] = rows;  // out of range -> NaN row (documented poison)
  for (int64_t c = 0; c < dim; ++c) want[9 * dim + c] = NAN;
  DevBuf<uint8_t> dq(q.size()), ds(s.size());
  DevBuf<int64_t> di(ids.size());
  to_dev(dq.p, q);
  to_dev(ds.p, s);
  to_dev(di.p, ids);
  auto plan = plan_engram_rows_dequant(rows, dim, n_ids, DType::kF32);
  ASSERT_TRUE(plan.ok());
  compare_dequant(
      want, n_ids * dim,
      [&](DType t, void* o) {
        auto p = *plan;
        p.out_dtype = t;
        return run_engram_rows_dequant(p, dq.p, ds.p, di.p, o, nullptr).ok();
      },
      "engram rows");
}

TEST(CudaParity, PlansRejectBadShapes) {
  // Pure CPU validation; runs without a device too.
  EXPECT_FALSE(plan_fp8_tiles_dequant(0, 32, 0, 0, DType::kF32).ok());
  EXPECT_FALSE(plan_fp8_tiles_dequant(64, 64, 10, 70, DType::kF32).ok());
  EXPECT_FALSE(plan_fp8_tiles_dequant(64, 64, 0, 64, DType::kI8).ok());
  EXPECT_FALSE(plan_fp4_rows_dequant(64, 48, 0, 64, DType::kF32).ok());
  EXPECT_FALSE(plan_engram_rows_dequant(10, 40, 1, DType::kF32).ok());
  EXPECT_FALSE(plan_fake_quant(FakeQuantOp::kWin, 48, 2).ok());
  EXPECT_FALSE(plan_fake_quant(FakeQuantOp::kKv, 24, 2).ok());
  EXPECT_FALSE(plan_fake_quant(FakeQuantOp::kIdx, 128, 0).ok());
  auto p = plan_fake_quant(FakeQuantOp::kKv, 512, 1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->row_bytes, 288);
  EXPECT_EQ(plan_fake_quant(FakeQuantOp::kWin, 512, 1)->row_bytes, 528);
  EXPECT_EQ(plan_fake_quant(FakeQuantOp::kIdx, 128, 1)->row_bytes, 68);
}

// Not an assertion: the dequantizer's bandwidth on one full-size shared-expert weight, printed
// for the report (bytes read + written over kernel time, CUDA events).
TEST(CudaParity, Fp8DequantThroughputReport) {
  SKIP_WITHOUT_GPU();
  const int64_t out = 32768, in = 1280;  // attn.wq_b
  DevBuf<uint8_t> dw(out * in), ds((out / 32) * (in / 32));
  DevBuf<uint16_t> dh(out * in);
  ASSERT_TRUE(dw.p && ds.p && dh.p);
  cudaMemset(dw.p, 0x38, out * in);
  cudaMemset(ds.p, 127, (out / 32) * (in / 32));
  auto plan = plan_fp8_tiles_dequant(out, in, 0, out, DType::kBF16);
  ASSERT_TRUE(plan.ok());
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(run_fp8_tiles_dequant(*plan, dw.p, ds.p, dh.p, nullptr).ok());
  cudaEventRecord(a);
  const int iters = 20;
  for (int i = 0; i < iters; ++i) ASSERT_TRUE(run_fp8_tiles_dequant(*plan, dw.p, ds.p, dh.p, nullptr).ok());
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  double bytes = static_cast<double>(out) * in * 3 * iters;
  std::printf("fp8 tile dequant -> bf16 [%lld x %lld]: %.3f us/call, %.0f GB/s\n",
              static_cast<long long>(out), static_cast<long long>(in), ms * 1000 / iters,
              bytes / (ms * 1e-3) / 1e9);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

}  // namespace
}  // namespace ds41::cuda
