// Bit-exact comparison of Q_win / Q_kv / Q_idx (MODEL_SPEC 3.9) and the scalar E4M3 / E2M1
// encoders with golden vectors made by an independent implementation (numpy float32 + ml_dtypes
// casts, gen_vectors.py, run on the GPU machine). Vectors live in vectors/ (format in
// gen_vectors.py); DS41_QUANT_VECTORS_DIR overrides the folder (used to check freshly generated
// vectors before they are committed).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/fake_quant.h"
#include "support/float_bits.h"

namespace ds41::quant {
namespace {

std::string vectors_dir() {
  if (const char* d = std::getenv("DS41_QUANT_VECTORS_DIR")) return d;
  return std::string(DS41_SOURCE_DIR) + "/tests/unit/quant/vectors";
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

uint32_t rd32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24; }

using ds41::testing::bits;

struct OpVectors {
  uint32_t op = 0, n = 0, rows = 0, row_bytes = 0;
  std::vector<float> x, xhat;
  std::vector<uint8_t> row;
};

// Little-endian host assumed (x86-64 / aarch64), as everywhere in ds41.
::testing::AssertionResult load_op(const std::string& file, OpVectors* v) {
  auto b = read_all(vectors_dir() + "/" + file);
  if (b.size() < 24 || std::memcmp(b.data(), "DS41QV01", 8) != 0)
    return ::testing::AssertionFailure() << vectors_dir() << "/" << file << ": missing or bad magic";
  v->op = rd32(&b[8]);
  v->n = rd32(&b[12]);
  v->rows = rd32(&b[16]);
  v->row_bytes = rd32(&b[20]);
  size_t vals = size_t{v->rows} * v->n;
  size_t want = 24 + vals * 8 + size_t{v->rows} * v->row_bytes;
  if (b.size() != want)
    return ::testing::AssertionFailure() << file << ": " << b.size() << " bytes, expected " << want;
  v->x.resize(vals);
  v->xhat.resize(vals);
  v->row.resize(size_t{v->rows} * v->row_bytes);
  std::memcpy(v->x.data(), &b[24], vals * 4);
  std::memcpy(v->row.data(), &b[24 + vals * 4], v->row.size());
  std::memcpy(v->xhat.data(), &b[24 + vals * 4 + v->row.size()], vals * 4);
  return ::testing::AssertionSuccess();
}

using EncodeFn = void (*)(const float*, int64_t, uint8_t*);
using DecodeFn = void (*)(const uint8_t*, int64_t, float*);
using InplaceFn = void (*)(float*, int64_t);
using PackFn = Status (*)(const float*, int64_t, uint8_t*);

void check_op(const char* file, uint32_t op, int64_t n, int64_t row_bytes, EncodeFn enc, DecodeFn dec,
              InplaceFn inplace, PackFn pack) {
  OpVectors v;
  ASSERT_TRUE(load_op(file, &v));
  ASSERT_EQ(v.op, op);
  ASSERT_EQ(v.n, n);
  ASSERT_EQ(v.row_bytes, row_bytes);
  ASSERT_GE(v.rows, 16u);
  int byte_mismatch = 0, value_mismatch = 0;
  std::vector<uint8_t> row(row_bytes);
  std::vector<float> y(n), z(n);
  for (uint32_t r = 0; r < v.rows; ++r) {
    const float* x = &v.x[r * n];
    const float* xhat = &v.xhat[r * n];
    const uint8_t* want = &v.row[r * row_bytes];
    enc(x, n, row.data());
    for (int64_t j = 0; j < row_bytes; ++j)
      if (row[j] != want[j] && ++byte_mismatch <= 10)
        ADD_FAILURE() << file << " row " << r << " byte " << j << ": got 0x" << std::hex << int{row[j]}
                      << " want 0x" << int{want[j]} << std::dec;
    dec(want, n, y.data());
    std::memcpy(z.data(), x, n * 4);
    inplace(z.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if ((bits(y[i]) != bits(xhat[i]) || bits(z[i]) != bits(xhat[i])) && ++value_mismatch <= 10)
        ADD_FAILURE() << file << " row " << r << " i " << i << ": x=" << x[i] << " want " << xhat[i]
                      << " decode " << y[i] << " inplace " << z[i];
    }
    // Lossless storage of the golden fake-quantized values (MODEL_SPEC 5.2).
    Status s = pack(xhat, n, row.data());
    ASSERT_TRUE(s.ok()) << file << " row " << r << ": " << s.message();
    dec(row.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(y[i]), bits(xhat[i])) << file << " pack_on_grid row " << r;
  }
  EXPECT_EQ(byte_mismatch, 0) << file;
  EXPECT_EQ(value_mismatch, 0) << file;
}

TEST(GoldenVectors, QWin) {
  check_op("q_win.bin", 0, 512, 528, q_win_encode, q_win_decode, q_win_inplace, q_win_pack_on_grid);
}
TEST(GoldenVectors, QKv) {
  check_op("q_kv.bin", 1, 512, 288, q_kv_encode, q_kv_decode, q_kv_inplace, q_kv_pack_on_grid);
}
TEST(GoldenVectors, QIdx) {
  check_op("q_idx.bin", 2, 128, 68, q_idx_encode, q_idx_decode, q_idx_inplace, q_idx_pack_on_grid);
}

void check_sweep(const char* file, uint32_t kind, uint8_t (*enc)(float)) {
  auto b = read_all(vectors_dir() + "/" + file);
  ASSERT_GE(b.size(), 16u) << vectors_dir() << "/" << file << " missing";
  ASSERT_EQ(std::memcmp(b.data(), "DS41SV01", 8), 0);
  ASSERT_EQ(rd32(&b[8]), kind);
  uint32_t count = rd32(&b[12]);
  ASSERT_EQ(b.size(), 16 + size_t{count} * 5);
  ASSERT_GT(count, 1000u);
  int bad = 0;
  for (uint32_t i = 0; i < count; ++i) {
    float x;
    std::memcpy(&x, &b[16 + 4 * i], 4);
    uint8_t want = b[16 + 4 * size_t{count} + i];
    uint8_t got = enc(x);
    if (got != want && ++bad <= 10)
      ADD_FAILURE() << file << ": x=" << x << " (0x" << std::hex << bits(x) << ") got 0x" << int{got}
                    << " want 0x" << int{want} << std::dec;
  }
  EXPECT_EQ(bad, 0);
}

TEST(GoldenVectors, E4M3Sweep) { check_sweep("e4m3_sweep.bin", 0, e4m3_from_float); }
TEST(GoldenVectors, E2M1Sweep) { check_sweep("e2m1_sweep.bin", 1, e2m1_from_float); }

}  // namespace
}  // namespace ds41::quant
