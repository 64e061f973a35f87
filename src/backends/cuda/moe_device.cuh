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
  float wsel[kMaxK];  // the selected experts' weights (route_row's last step), for a caller in the block
};

// The one-warp selection (route_row): up to kWarpPer experts per lane, up to kWarpMaxK picks.
constexpr int kWarpPer = 16;
constexpr int64_t kWarpMaxK = 8;

// The best remaining (value, index) of the lane's experts e = lane + 32 i (ascending e, so the scan
// meets them in index order), -inf ones skipped, then the warp's best by the xor tree: every lane
// ends with the same (v, i) since better() is a total order on distinct indices.
__device__ __forceinline__ void warp_best(const float (&v)[kWarpPer], int lane, int64_t E, float ninf, float& bv,
                                          int& bi) {
  bv = 0.0f;
  bi = -1;
#pragma unroll
  for (int i = 0; i < kWarpPer; ++i) {
    const int e = lane + 32 * i;
    if (e < E && v[i] != ninf && better(v[i], e, bv, bi)) {
      bv = v[i];
      bi = e;
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
}

// Row r's routing by one kThreads-thread block (every thread calls it: barriers). The k picks are
// the k best of the biased scores in the house tie order (score desc, index asc), -inf never picked
// (a pick without a selectable expert is -1), as the CPU's best_k. Up to 32 kWarpPer experts and
// kWarpMaxK picks one warp selects from registers: k rounds of a lane scan and a 5-level xor tree,
// no block barrier between picks (ncu on the H200: the block-wide rounds, two barriers and a serial
// warp scan each, made the router a 12 us single-block kernel on the decode's critical path);
// larger shapes take the block-wide rounds. The same picks either way for every input without NaN.
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
  if (E <= 32 * kWarpPer && k <= kWarpMaxK) {
    if (warp == 0) {
      float v[kWarpPer];
#pragma unroll
      for (int i = 0; i < kWarpPer; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < E ? bs[e] : ninf;
      }
      for (int64_t j = 0; j < k; ++j) {
        float bv;
        int bi;
        warp_best(v, lane, E, ninf, bv, bi);
        if (lane == 0) sel[j] = bi;
        if (bi >= 0 && (bi & 31) == lane) {  // the owner drops the pick from its scan
#pragma unroll
          for (int i = 0; i < kWarpPer; ++i)
            if (i == (bi >> 5)) v[i] = ninf;
        }
      }
    }
    __syncthreads();
  } else {
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
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      if (sel[j] >= 0) sum = __fadd_rn(sum, sc[sel[j]]);
    for (int64_t j = 0; j < k; ++j) {
      const int i = sel[j];
      const float w = i >= 0 ? __fmul_rn(__fdiv_rn(sc[i], __fadd_rn(sum, 1e-20f)), route_scale) : 0.0f;
      experts[r * k + j] = i;
      weights[r * k + j] = w;
      sm.wsel[j] = w;
    }
  }
}

}  // namespace ds41::cuda::moe
