// tests/gpu/model: what the device-model test files share (one definition each: a unity translation
// unit may hold several of them, CMakeLists.txt "Unity builds").
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_status.h"

#define SKIP_WITHOUT_GPU() \
  if (::ds41::cuda::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace ds41::gpu {

// `bytes` bytes of device memory at p, copied to the host.
inline std::vector<uint8_t> from_device(const void* p, uint64_t bytes) {
  std::vector<uint8_t> h(bytes);
  if (bytes) {
    EXPECT_EQ(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

}  // namespace ds41::gpu
