// ds41 backends/cuda: the mHC expand of one channel on the device (MODEL_SPEC 3.3): the sublayer output
// y of a row goes into its C residual streams, S'[k][i] = post[k] * y[i] + sum over j ascending of
// comb[j][k] * S[j][i], float32 products and additions in that order. One definition for hc_expand_kernel
// and the tensor-core GEMV's expand epilogue (wo_b writing the streams: tc_gemv_kernels.cu), so both give
// the same bits by construction. Every load is issued before the arithmetic (one round trip).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

constexpr int kHcExpandMaxC = 8;

// S: the row's streams (c rows of h floats); pst: its post [c]; cb: its comb [c][c]; channel i.
__device__ __forceinline__ void hc_expand_channel(float* S, float yv, const float* __restrict__ pst,
                                                  const float* __restrict__ cb, int64_t c, int64_t h, int64_t i) {
  if (c == 4) {  // the released C: unrolled, comb in registers
    float old[4], p[4], cm[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) old[j] = S[j * h + i], p[j] = pst[j];
#pragma unroll
    for (int j = 0; j < 16; ++j) cm[j] = cb[j];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float s = __fmul_rn(p[k], yv);
#pragma unroll
      for (int j = 0; j < 4; ++j) s = __fadd_rn(s, __fmul_rn(cm[j * 4 + k], old[j]));
      S[k * h + i] = s;
    }
    return;
  }
  float old[kHcExpandMaxC];
  for (int64_t j = 0; j < c; ++j) old[j] = S[j * h + i];
  for (int64_t k = 0; k < c; ++k) {
    float s = __fmul_rn(pst[k], yv);
    for (int64_t j = 0; j < c; ++j) s = __fadd_rn(s, __fmul_rn(cb[j * c + k], old[j]));
    S[k * h + i] = s;
  }
}

}  // namespace ds41::cuda::dev
