// ds41 backends/cuda: sparse attention (MODEL_SPEC 3.4.7) on the tensor cores, for prefill-shaped
// calls (many rows) whose entries lie on a bf16 grid (every attended row is fake-quantized: Q_win
// values are E4M3 x 2^k, Q_kv values E2M1 x E4M3, both at most 6 significant bits, 3.9), so a row
// of entries is exact in bf16. Same semantics as the float kernels of attention_kernels.cu: s_j =
// scale * q_h . v_j, the sink enlarging the denominator only, a row without entries -> 0.
//
// Exactness: q (float) is split into three bf16 parts hi + mid + lo = q exactly (8 + 8 + 8
// significant bits; each part the round-to-nearest of what the previous left), so every product
// part x entry is exact in float and the mma's float accumulation only reorders the sums; the
// probabilities p (float, in [0, 1]) are split the same way for P.V. Errors are therefore those of
// float sums, as in the float kernels (the parity table's tolerance says so).
//
// Shape: one CTA per (row, 16 heads) — the heads are the mma's M, the row's entries its N (scores)
// and K (P.V); 4 warps, warp w owning head_dim / 4 channels. Per tile of 16 entries:
//   1. the tile's rows (float, gathered by kv_index) were prefetched into registers during the
//      previous tile's maths; they are rounded to bf16 (exact) into shared memory;
//   2. QK: each warp multiplies its channel quarter (3 parts of q x the tile) into a partial 16 x 16
//      score tile, written to shared memory and summed over the 4 warps in warp order (every warp
//      then holds the same scores, so the same probabilities: deterministic);
//   3. online softmax per head row (running max m seeded by the sink, running denominator l with the
//      sink's exp(sink - m)), the accumulator rescaled when m grows;
//   4. P.V: the score fragment is the A operand of the next mma directly (3 parts), V comes from the
//      same shared tile through ldmatrix.trans; warp w accumulates its channel quarter.
// Shared-memory rows are 16-byte-chunk swizzled (chunk c of row i at c ^ (i & 7)) so ldmatrix reads
// are conflict-free. Without a device (the host SIMT emulator) the mma and ldmatrix are emulated
// with the same arithmetic through plain loads and warp shuffles.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/sparse_attention_tc_kernels.h"
#include "backends/cuda/tc_mma.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {
using namespace dev;

constexpr int kTcThreads = 128;  // 4 warps
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kTcHeads = 16;     // heads per CTA: the mma's M
constexpr int kTcTile = 16;      // entries per tile: two n8 score tiles, one k16 step of P.V

template <int D>
constexpr size_t tc_smem_bytes() {
  return sizeof(uint16_t) * (3 * kTcHeads * D + kTcTile * D) + sizeof(float) * kTcWarps * 32 * 8;
}

template <int D>
__global__ void __launch_bounds__(kTcThreads, 2)
    sparse_attention_tc_kernel(int64_t n_heads, const float* __restrict__ q, const int64_t* __restrict__ kv_offsets,
                               const int32_t* __restrict__ kv_index, const float* __restrict__ kv,
                               const float* __restrict__ sink, float scale, float* __restrict__ out) {
  dev::pdl_enter();
  static_assert(D % 64 == 0 && D <= 512, "4 warps x a multiple of 16 channels");
  constexpr int kQuarter = D / 4;        // channels per warp
  constexpr int kKSteps = kQuarter / 16;  // QK k-steps per warp
  constexpr int kONt = kQuarter / 8;      // P.V n8 tiles per warp
  constexpr int kLoads = D / 32;          // float4 loads per thread per tile (8 threads per entry)
  extern __shared__ __align__(16) float smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [3][16][D] bf16, swizzled
  uint16_t* ks = qs + 3 * kTcHeads * D;                // [16][D] bf16, swizzled
  float* sp = reinterpret_cast<float*>(ks + kTcTile * D);  // [warp][lane][8] partial scores

  const int64_t groups = (n_heads + kTcHeads - 1) / kTcHeads;
  const int64_t r = blockIdx.x / groups;
  const int64_t h0 = (blockIdx.x % groups) * kTcHeads;
  const int nh = static_cast<int>(min(static_cast<int64_t>(kTcHeads), n_heads - h0));
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int64_t k0 = kv_offsets[r], k1 = kv_offsets[r + 1];
  float* o = out + (r * n_heads + h0) * D;
  if (k1 <= k0) {  // a row without entries yields 0 (uniform over the CTA)
    for (int i = tid; i < nh * D; i += kTcThreads) o[i] = 0.0f;
    return;
  }

  // q of the 16 heads, split into 3 bf16 parts (padding heads: zeros).
  const float* qr = q + (r * n_heads + h0) * D;
  for (int i = tid; i < kTcHeads * D / 2; i += kTcThreads) {
    const int h = (2 * i) / D, c = (2 * i) % D;
    float x0 = 0.0f, x1 = 0.0f;
    if (h < nh) {
      x0 = qr[h * D + c];
      x1 = qr[h * D + c + 1];
    }
    float a0, a1, a2, b0, b1, b2;
    split3(x0, a0, a1, a2);
    split3(x1, b0, b1, b2);
    const uint32_t e = swz(h, c, D);
    *reinterpret_cast<uint32_t*>(qs + e) = pack_bf16(a0, b0);
    *reinterpret_cast<uint32_t*>(qs + kTcHeads * D + e) = pack_bf16(a1, b1);
    *reinterpret_cast<uint32_t*>(qs + 2 * kTcHeads * D + e) = pack_bf16(a2, b2);
  }

  // Tile loads: thread -> entry tid / 8, float4 groups (tid % 8) + 8 i.
  const int le = tid >> 3, lsub = tid & 7;
  float4 pre[kLoads];
  auto load_tile = [&](int64_t e0) {
    const int64_t e = e0 + le;
    if (e < k1) {
      const float4* src = reinterpret_cast<const float4*>(kv + static_cast<int64_t>(kv_index[e]) * D);
#pragma unroll
      for (int i = 0; i < kLoads; ++i) pre[i] = src[lsub + 8 * i];
    } else {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) pre[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  auto store_tile = [&]() {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = 4 * (lsub + 8 * i);
      uint2 v;
      v.x = pack_bf16(pre[i].x, pre[i].y);
      v.y = pack_bf16(pre[i].z, pre[i].w);
      *reinterpret_cast<uint2*>(ks + swz(le, c, D)) = v;
    }
  };

  // Softmax state of rows g (index 0) and g + 8 (index 1): m seeded with the sink, l with its
  // exp(sink - m) = 1 counted once per quad (lane t4 == 0); the quad's partial l are summed at the end.
  float m_run[2], l_run[2];
  for (int j = 0; j < 2; ++j) {
    const int h = g + 8 * j;
    m_run[j] = h < nh ? sink[h0 + h] : 0.0f;
    l_run[j] = t4 == 0 ? 1.0f : 0.0f;
  }
  float acc[kONt][4];
#pragma unroll
  for (int nt = 0; nt < kONt; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;

  const int cw = warp * kQuarter;  // this warp's channels
  load_tile(k0);
  for (int64_t e0 = k0; e0 < k1; e0 += kTcTile) {
    __syncthreads();  // the previous tile's P.V (and partial-score reads) are done
    store_tile();
    __syncthreads();
    if (e0 + kTcTile < k1) load_tile(e0 + kTcTile);  // in flight during this tile's maths

    // QK over this warp's channel quarter: s[nt] = 16 heads x entries nt*8 .. nt*8+7.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const int kc = cw + 16 * kk;
      uint32_t b[4];  // entries 0-7 | 8-15 (bit 1) x channels kc | kc + 8 (bit 0): b0, b1 of two n-tiles
      ldsm_x4<false, 1>(b, ks, D, kc);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        uint32_t a[4];  // heads 0-7 | 8-15 (bit 0) x channels kc | kc + 8 (bit 1): a0..a3
        ldsm_x4<false, 0>(a, qs + p * kTcHeads * D, D, kc);
        mma_bf16(s[0], a, b[0], b[1]);
        mma_bf16(s[1], a, b[2], b[3]);
      }
    }
    float* spw = sp + (warp * 32 + lane) * 8;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      spw[i] = s[0][i];
      spw[4 + i] = s[1][i];
    }
    __syncthreads();
    // Full scores: the 4 warps' partials in warp order (the same fragment positions in every warp).
    float sc[2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float v = sp[lane * 8 + i];
#pragma unroll
      for (int w = 1; w < kTcWarps; ++w) v += sp[(w * 32 + lane) * 8 + i];
      const int nt = i >> 2, ii = i & 3;
      const int64_t e = e0 + nt * 8 + 2 * t4 + (ii & 1);
      sc[nt][ii] = e < k1 ? v * scale : -INFINITY;
    }
    // Online softmax per row (g: elements 0, 1 of each n-tile; g + 8: elements 2, 3).
    float corr[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mx = fmaxf(fmaxf(sc[0][2 * j], sc[0][2 * j + 1]), fmaxf(sc[1][2 * j], sc[1][2 * j + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      const float new_m = fmaxf(m_run[j], mx);
      corr[j] = new_m == m_run[j] ? 1.0f : expf(m_run[j] - new_m);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float& v = sc[nt][2 * j + i];
          v = v == -INFINITY ? 0.0f : expf(v - new_m);
          sum += v;
        }
      l_run[j] = l_run[j] * corr[j] + sum;
      m_run[j] = new_m;
    }
#pragma unroll
    for (int nt = 0; nt < kONt; ++nt) {
      acc[nt][0] *= corr[0];
      acc[nt][1] *= corr[0];
      acc[nt][2] *= corr[1];
      acc[nt][3] *= corr[1];
    }
    // P as the A operand (16 heads x 16 entries), three bf16 parts.
    uint32_t pa[3][4];
    {
      const int src[4][2] = {{0, 0}, {0, 2}, {1, 0}, {1, 2}};  // (n-tile, first element) of a[0..3]
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float x0[3], x1[3];
        split3(sc[src[k][0]][src[k][1]], x0[0], x0[1], x0[2]);
        split3(sc[src[k][0]][src[k][1] + 1], x1[0], x1[1], x1[2]);
#pragma unroll
        for (int p = 0; p < 3; ++p) pa[p][k] = pack_bf16(x0[p], x1[p]);
      }
    }
    // P.V over this warp's channels: V (entries x channels) from the shared tile, transposed.
#pragma unroll
    for (int dn = 0; dn < kONt / 2; ++dn) {
      const int nc = cw + 16 * dn;
      uint32_t b[4];  // entries 0-7 | 8-15 (bit 0) x channels nc | nc + 8 (bit 1), transposed
      ldsm_x4<true, 0>(b, ks, D, nc);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        mma_bf16(acc[2 * dn], pa[p], b[0], b[1]);
        mma_bf16(acc[2 * dn + 1], pa[p], b[2], b[3]);
      }
    }
  }
  // Denominators: the quad's partial sums.
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l_run[j] += __shfl_xor_sync(kFullMask, l_run[j], 1);
    l_run[j] += __shfl_xor_sync(kFullMask, l_run[j], 2);
  }
#pragma unroll
  for (int nt = 0; nt < kONt; ++nt) {
    const int c = cw + nt * 8 + 2 * t4;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = g + 8 * j;
      if (h < nh) {
        float2 v;
        v.x = acc[nt][2 * j] / l_run[j];
        v.y = acc[nt][2 * j + 1] / l_run[j];
        *reinterpret_cast<float2*>(o + h * D + c) = v;
      }
    }
  }
}

template <int D>
Status launch_tc(const SparseAttentionArgs& a, cudaStream_t stream) {
  const int64_t groups = (a.n_heads + kTcHeads - 1) / kTcHeads;
  if (a.n * groups > 0x7fffffff)
    return invalid_argument("sparse_attention_tc: n " + std::to_string(a.n) + " x head groups too large");
  constexpr size_t smem = tc_smem_bytes<D>();
  // Per launch (cheap, and right for whichever device is current).
  DS41_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(sparse_attention_tc_kernel<D>),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "sparse_attention_tc: shared memory attribute"));
  launch(sparse_attention_tc_kernel<D>, static_cast<unsigned>(a.n * groups), kTcThreads, smem, stream, a.n_heads, a.q, a.kv_offsets, a.kv_index, a.kv, a.sink, a.scale, a.out);
  return last_launch_status("sparse_attention_tc");
}

}  // namespace

bool sparse_attention_tc_supported(const SparseAttentionArgs& a) {
  return a.entries_on_bf16_grid && (a.head_dim == 512 || a.head_dim == 128 || a.head_dim == 64) &&
         a.n_heads > 0;
}

Status run_sparse_attention_tc(const SparseAttentionArgs& a, cudaStream_t stream) {
  if (!sparse_attention_tc_supported(a))
    return invalid_argument("sparse_attention_tc: needs entries on the bf16 grid and head_dim 64, 128 or 512, got " +
                            std::to_string(a.head_dim));
  if (a.n == 0) return ok_status();
  if (reinterpret_cast<uintptr_t>(a.kv) % 16 != 0 || reinterpret_cast<uintptr_t>(a.out) % 8 != 0)
    return invalid_argument("sparse_attention_tc: kv must be 16-byte and out 8-byte aligned");
  switch (a.head_dim) {
    case 512: return launch_tc<512>(a, stream);
    case 128: return launch_tc<128>(a, stream);
    default: return launch_tc<64>(a, stream);
  }
}

}  // namespace ds41::cuda
