// ds41 backends/cuda: the current device's SM count, queried once (132, an H100/H200's, when the
// query fails). The launchers size persistent grids with it (linear_kernels.cu, tc_gemv_kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

namespace ds41::cuda {

inline int sm_count() {
  static const int n = [] {
    int d = 0, c = 0;
    if (cudaGetDevice(&d) != cudaSuccess || cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, d) != cudaSuccess ||
        c <= 0)
      return 132;
    return c;
  }();
  return n;
}

}  // namespace ds41::cuda
