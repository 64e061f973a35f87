// Helpers of the attention / indexer / selection / KV-row parity tests (tests/parity/cuda): device
// buffers owned by the test (tests may allocate; kernels never do), copies, bit comparisons, and
// the one-line case report `op shape err tol reason` of docs/gpu_engine_contract.md "Tests".
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/cuda_status.h"

namespace ds41::cuda::kc_test {

#define KC_SKIP_WITHOUT_GPU() \
  if (::ds41::cuda::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Device buffer of count T's (plus slack), freed at scope exit.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), count * sizeof(T) + 16) != cudaSuccess) p = nullptr;
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
template <typename T>
std::unique_ptr<DevBuf<T>> upload(const std::vector<T>& h) {
  auto b = std::make_unique<DevBuf<T>>(h.size());
  if (b->p) to_dev(b->p, h);
  return b;
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Bit equality, any NaN matching any NaN (payloads are not part of the contract).
inline bool same_f32(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits(a) == bits(b); }

// Number of positions where a and b differ bit for bit.
inline int64_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += !same_f32(a[i], b[i]);
  return bad;
}

// max |a - b| / max(scale, tiny) over finite pairs; a non-finite mismatch is infinite error.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& want, double scale) {
  double e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i])) {
      if (!same_f32(got[i], want[i])) return INFINITY;
      continue;
    }
    e = std::max(e, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return e / std::max(scale, 1e-30);
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// The case line of the parity table.
inline void report(const char* op, const std::string& shape, double err, double tol, const char* reason) {
  std::printf("%-20s %-44s err %-10.3g tol %-8.3g %s\n", op, shape.c_str(), err, tol, reason);
  std::fflush(stdout);
}

#define KC_OK(expr)                                     \
  do {                                                  \
    ::ds41::Status _s = (expr);                         \
    ASSERT_TRUE(_s.ok()) << #expr ": " << _s.message(); \
  } while (0)

}  // namespace ds41::cuda::kc_test
