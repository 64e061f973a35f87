// ds41 backends/cuda: the indexer's dot product in the CPU reference's order (backends/cpu dot_f32),
// shared by the float and the tensor-core indexer kernels so both give the CPU's bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

// dot_f32(q, k, d) of backends/cpu, as float. K is an array-like of the key's d channels.
template <int kD, typename K>
__device__ __forceinline__ float dot_like_cpu(const float* q, const K& k, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  const int64_t dd = kD > 0 ? kD : d;
  if constexpr (kD > 0) {
#pragma unroll
    for (int j = 0; j + 8 <= kD; j += 8)
#pragma unroll
      for (int l = 0; l < 8; ++l) acc[l] += q[j + l] * k[j + l];
    i = kD / 8 * 8;
  } else {
    for (; i + 8 <= dd; i += 8)
#pragma unroll
      for (int l = 0; l < 8; ++l) acc[l] += q[i + l] * k[i + l];
  }
  double s = 0.0;
#pragma unroll
  for (int l = 0; l < 8; ++l) s += static_cast<double>(acc[l]);
  for (; i < dd; ++i) s += static_cast<double>(q[i]) * static_cast<double>(k[i]);
  return static_cast<float>(s);
}

}  // namespace ds41::cuda::dev
