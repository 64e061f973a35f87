// ds41 backends/cuda: the device code of the MoE router (moe_kernels.cu has the design notes),
// shared by router_kernel (moe_kernels.cu) and the fused routing kernel (fused_moe_kernels.cu), so
// both select and weigh experts with the same operations in the same order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::moe {

constexpr int kThreads = 256;
constexpr int kChunk = 256;  // pairs per bucketing chunk (one block)
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxK = 32;

__device__ __forceinline__ float softplus_ref(float x) {
  const double d = x;
  return static_cast<float>((d < 0.0 ? 0.0 : d) + log1p(exp(-fabs(d))));
}

// (v, i) better than (bv, bi) in the house tie order; i < 0 means "none".
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// The shared memory of route_row.
struct RouterSmem {
  float sc[kMaxExperts];
  float bs[kMaxExperts];
  float wv[kThreads / 32];
  int wi[kThreads / 32];
  int sel[kMaxK];
};

// Row r's routing by one kThreads-thread block (every thread calls it: barriers).
__device__ __forceinline__ void route_row(const float* __restrict__ logits, int64_t E,
                                          const float* __restrict__ bias, const float* __restrict__ bias_vl,
                                          const uint8_t* __restrict__ vl, int64_t k, float temp,
                                          float route_scale, int32_t* __restrict__ experts,
                                          float* __restrict__ weights, int64_t r, RouterSmem& sm) {
  float* sc = sm.sc;
  float* bs = sm.bs;
  float* wv = sm.wv;
  int* wi = sm.wi;
  int* sel = sm.sel;
  const float* bvec = (vl && vl[r] && bias_vl) ? bias_vl : bias;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    const float lg = logits[r * E + e], bias_e = bvec ? bvec[e] : 0.0f;  // both loads before the math
    const float s = sqrtf(softplus_ref(__fdiv_rn(lg, temp)));
    sc[e] = s;
    bs[e] = __fadd_rn(s, bias_e);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float ninf = -__int_as_float(0x7f800000);
  for (int64_t j = 0; j < k; ++j) {
    float bv = 0.0f;
    int bi = -1;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      const float v = bs[e];
      if (v == ninf) continue;  // -inf (and already selected) entries are never selected
      if (better(v, static_cast<int>(e), bv, bi)) {
        bv = v;
        bi = static_cast<int>(e);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      wv[warp] = bv;
      wi[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = wv[0];
      int i = wi[0];
      for (int w = 1; w < kThreads / 32; ++w)
        if (better(wv[w], wi[w], v, i)) {
          v = wv[w];
          i = wi[w];
        }
      sel[j] = i;
      if (i >= 0) bs[i] = ninf;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (sel[j] >= 0) sum = __fadd_rn(sum, sc[sel[j]]);
    for (int64_t j = 0; j < k; ++j) {
      const int i = sel[j];
      experts[r * k + j] = i;
      weights[r * k + j] = i >= 0 ? __fmul_rn(__fdiv_rn(sc[i], __fadd_rn(sum, 1e-20f)), route_scale) : 0.0f;
    }
  }
}

}  // namespace ds41::cuda::moe
