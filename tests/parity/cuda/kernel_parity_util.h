// ds41 tests/parity/cuda: helpers of the kernel parity tables (dense / MoE / mHC / Engram):
// device buffers owned by the test, seeded generators of inputs and quantized weights, the
// float metrics and the one-line-per-case report `op shape err tol reason`.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_weight.h"
#include "core/thread_pool.h"
#include "ops/weight_ref.h"
#include "quant/weight_format.h"

namespace ds41::cuda::parity {

#define DS41_SKIP_WITHOUT_GPU() \
  if (::ds41::cuda::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Device buffer owned by the test (tests may allocate; kernels never do).
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess)
      p = nullptr;
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  ~Dev() {
    if (p) cudaFree(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& h) {
    if (p && !h.empty()) cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    if (p && n) cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// Fast seeded bytes / floats (splitmix64), so the released widths stay cheap to generate.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }  // [0, 1)
  float sym() { return 2.0f * uniform() - 1.0f; }                          // [-1, 1)
  float normal() {                                                         // Box-Muller
    float u1 = std::max(uniform(), 1e-7f), u2 = uniform();
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
};

inline std::vector<float> rand_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = r.sym() * scale;
  return v;
}

inline std::vector<uint8_t> rand_bytes(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t z = r.next();
    std::memcpy(&v[i], &z, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(r.next());
  return v;
}

// E4M3 payload without NaN codes (0x7f / 0xff -> 0x7e / 0xfe).
inline std::vector<uint8_t> rand_e4m3(size_t n, uint64_t seed) {
  auto v = rand_bytes(n, seed);
  for (auto& b : v)
    if ((b & 0x7f) == 0x7f) b = static_cast<uint8_t>(b - 1);
  return v;
}

// E8M0 scales 2^(lo-127) .. 2^(hi-127).
inline std::vector<uint8_t> rand_e8m0(size_t n, uint64_t seed, int lo, int hi) {
  Rng r(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v)
    b = static_cast<uint8_t>(lo + static_cast<int>(r.next() % static_cast<uint64_t>(hi - lo + 1)));
  return v;
}

inline uint16_t bf16_of(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit equality, any NaN matching any NaN.
inline bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Number of elements that are not bit-identical.
inline size_t count_bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += !same_bits(a[i], b[i]);
  return d;
}

// max |got - want| / max(max |want|, floor): the error relative to the output's scale (NaN
// positions must match; a NaN mismatch or a non-finite difference returns +inf).
inline double rel_to_max(const std::vector<float>& got, const std::vector<float>& want,
                         double floor = 1e-30) {
  if (got.size() != want.size()) return INFINITY;
  double mx = floor, err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isfinite(want[i])) mx = std::max(mx, std::fabs(static_cast<double>(want[i])));
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) || std::isnan(got[i])) {
      if (std::isnan(want[i]) != std::isnan(got[i])) return INFINITY;
      continue;
    }
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (want[i] != got[i]) return INFINITY;
      continue;
    }
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return err / mx;
}

// max over elements of |got - want| / max(|want|, floor) (element-wise relative error).
inline double rel_elem(const std::vector<float>& got, const std::vector<float>& want, double floor = 1e-30) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) || std::isnan(got[i])) {
      if (std::isnan(want[i]) != std::isnan(got[i])) return INFINITY;
      continue;
    }
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (want[i] != got[i]) return INFINITY;
      continue;
    }
    err = std::max(
        err, std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(std::fabs(double{want[i]}), floor));
  }
  return err;
}

// One report line per case; fails the test when err > tol.
inline void report(const std::string& op, const std::string& shape, double err, double tol,
                   const std::string& reason) {
  std::printf("%-18s %-44s err %-11.3g tol %-9.3g %s\n", op.c_str(), shape.c_str(), err, tol, reason.c_str());
  std::fflush(stdout);
  EXPECT_LE(err, tol) << op << " " << shape << " (" << reason << ")";
}

// A host thread pool for the CPU reference (the device host has many cores).
inline ThreadPool& ref_pool() {
  static ThreadPool pool(static_cast<int>(std::max(1u, std::min(32u, std::thread::hardware_concurrency()))));
  return pool;
}

inline std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

// A linear weight in its checkpoint format on the host, with seeded random contents (FP8: E4M3
// without NaN codes, scales 2^-9..2^-3; FP4: any code, scales 2^-7..2^-1; BF16 / F32: U(-0.05, 0.05)).
struct HostWeight {
  quant::WeightFormat format = quant::WeightFormat::kNone;
  int64_t out = 0, in = 0;
  std::vector<uint8_t> data, scale;
};

inline HostWeight make_weight(quant::WeightFormat f, int64_t out, int64_t in, uint64_t seed) {
  HostWeight w{f, out, in, {}, {}};
  switch (f) {
    case quant::WeightFormat::kFp8Tiles:
      w.data = rand_e4m3(static_cast<size_t>(out * in), seed);
      w.scale = rand_e8m0(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)), seed + 1, 118, 124);
      break;
    case quant::WeightFormat::kFp4Rows:
      w.data = rand_bytes(static_cast<size_t>(out * in / 2), seed);
      w.scale = rand_e8m0(static_cast<size_t>(out * (in / 32)), seed + 1, 120, 126);
      break;
    case quant::WeightFormat::kBF16: {
      Rng r(seed);
      w.data.resize(static_cast<size_t>(out * in * 2));
      uint16_t* p = reinterpret_cast<uint16_t*>(w.data.data());
      for (int64_t i = 0; i < out * in; ++i) p[i] = bf16_of(r.sym() * 0.05f);
      break;
    }
    case quant::WeightFormat::kF32: {
      auto v = rand_floats(static_cast<size_t>(out * in), seed, 0.05f);
      w.data.resize(v.size() * 4);
      std::memcpy(w.data.data(), v.data(), w.data.size());
      break;
    }
    default: break;
  }
  return w;
}

// The weight on the device, its payload at byte offset `misalign` (to reach the scalar paths).
struct DevWeight {
  std::unique_ptr<Dev<uint8_t>> data, scale;
  DeviceWeight dw;
  DevWeight(const HostWeight& w, int misalign = 0) {
    data = std::make_unique<Dev<uint8_t>>(w.data.size() + 16);
    cudaMemcpy(data->p + misalign, w.data.data(), w.data.size(), cudaMemcpyHostToDevice);
    if (!w.scale.empty()) scale = std::make_unique<Dev<uint8_t>>(w.scale);
    dw.format = w.format;
    dw.out_dim = w.out;
    dw.in_dim = w.in;
    dw.data = data->p + misalign;
    dw.scale = scale ? scale->p : nullptr;
  }
};

// Weights on the device and the device array of their descriptors (the weight list that
// run_experts_dequant_bf16 / _f16 index by expert id).
struct DevWeightList {
  std::vector<std::unique_ptr<DevWeight>> weights;
  std::unique_ptr<Dev<DeviceWeight>> list;
  explicit DevWeightList(const std::vector<HostWeight>& hw) {
    std::vector<DeviceWeight> d;
    for (const HostWeight& h : hw) {
      weights.push_back(std::make_unique<DevWeight>(h));
      d.push_back(weights.back()->dw);
    }
    list = std::make_unique<Dev<DeviceWeight>>(d);
  }
  const DeviceWeight* p() const { return list->p; }
};

inline ops::WeightRef host_ref(const HostWeight& w, const uint8_t* data, const uint8_t* scale) {
  ops::WeightRef r;
  r.format = w.format;
  r.data = data;
  r.scale = scale;
  r.out_dim = w.out;
  r.in_dim = w.in;
  r.name = "parity";
  return r;
}

}  // namespace ds41::cuda::parity
