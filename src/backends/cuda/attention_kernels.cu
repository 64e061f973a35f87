// ds41 backends/cuda: sparse attention core (MODEL_SPEC 3.4.7) over per-row entry lists (window rows
// plus selected compressed entries, or prefill rows): s_j = scale * q_h . v_j, the sink enlarging
// the denominator only, a row without entries -> 0. Single shared latent: each entry is key and value.
//
// One CTA per (query row, group of kHeads heads): the group shares the row's entries, so each entry
// tile is loaded into shared memory once for kHeads heads. Entries are walked in tiles of kTile with
// an online softmax (running max m seeded with the sink, running denominator l seeded with
// exp(sink - sink) = 1, accumulator rescaled when m grows), which equals the CPU's two-pass
// max-then-sum form up to rounding. Scores are warp dot products over head_dim; the P.V product keeps
// kHeads x ceil(head_dim / 256) float accumulators per thread.
//
// Float accumulation (the CPU uses double): the output is a convex combination of <= 640 entries, so
// the float sums add a relative error of at most ~640 * 2^-24 ~ 4e-5 of max|v| (typically ~1e-6);
// the parity test's tolerance (tests/parity/cuda/attention_parity_test.cpp) says so.
#include <cmath>
#include <string>

#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/cuda_status.h"

namespace ds41::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kHeads = 4;     // heads per CTA
constexpr int kTile = 16;     // entries per shared-memory tile
constexpr int kMaxDim = 512;  // head_dim limit (registers: kMaxDim / kThreads per head)
constexpr int kDimPerThread = kMaxDim / kThreads;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

size_t smem_bytes(int64_t d) {
  return sizeof(float) * (static_cast<size_t>(kHeads + kTile) * d + kHeads * kTile + 2 * kHeads);
}

__global__ void __launch_bounds__(kThreads)
    sparse_attention_kernel(int64_t n_heads, int64_t d, const float* __restrict__ q,
                            const int64_t* __restrict__ kv_offsets, const int32_t* __restrict__ kv_index,
                            const float* __restrict__ kv, const float* __restrict__ sink, float scale,
                            float* __restrict__ out) {
  extern __shared__ float smem[];
  float* q_s = smem;                     // [kHeads][d]
  float* kv_s = q_s + kHeads * d;        // [kTile][d]
  float* p_s = kv_s + kTile * d;         // [kHeads][kTile]: scores, then probabilities
  float* corr_s = p_s + kHeads * kTile;  // [kHeads]: rescale factor of this tile
  float* l_s = corr_s + kHeads;          // [kHeads]: final denominators

  const int64_t groups = (n_heads + kHeads - 1) / kHeads;
  const int64_t r = blockIdx.x / groups;
  const int64_t h0 = (blockIdx.x % groups) * kHeads;
  const int nh = static_cast<int>(min(static_cast<int64_t>(kHeads), n_heads - h0));
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t k0 = kv_offsets[r], k1 = kv_offsets[r + 1];
  float* o = out + (r * n_heads + h0) * d;

  if (k1 <= k0) {  // a row without entries yields 0 (uniform over the CTA)
    for (int64_t i = tid; i < nh * d; i += kThreads) o[i] = 0.0f;
    return;
  }
  const float* qr = q + (r * n_heads + h0) * d;
  for (int64_t i = tid; i < kHeads * d; i += kThreads) q_s[i] = i < nh * d ? qr[i] : 0.0f;

  // Softmax state of head `warp` (warps 0..kHeads-1, replicated over lanes).
  float m = warp < nh ? sink[h0 + warp] : 0.0f;
  float l = 1.0f;
  float acc[kHeads][kDimPerThread];
#pragma unroll
  for (int h = 0; h < kHeads; ++h)
#pragma unroll
    for (int j = 0; j < kDimPerThread; ++j) acc[h][j] = 0.0f;

  for (int64_t e0 = k0; e0 < k1; e0 += kTile) {
    const int ne = static_cast<int>(min(static_cast<int64_t>(kTile), k1 - e0));
    for (int64_t i = tid; i < ne * d; i += kThreads) {
      const int64_t e = i / d, c = i % d;
      kv_s[i] = kv[static_cast<int64_t>(kv_index[e0 + e]) * d + c];
    }
    __syncthreads();
    // Scores: one warp per (head, entry) pair, lanes strided over head_dim.
    for (int p = warp; p < kHeads * kTile; p += kWarps) {
      const int h = p / kTile, e = p % kTile;
      if (h < nh && e < ne) {  // uniform over the warp
        float s = 0.0f;
        for (int64_t c = lane; c < d; c += 32) s += q_s[h * d + c] * kv_s[e * d + c];
        s = warp_sum(s);
        if (lane == 0) p_s[p] = s * scale;
      } else if (lane == 0) {
        p_s[p] = -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax update: warp h handles head h, lanes over the tile's entries.
    if (warp < kHeads) {
      const float s = lane < kTile ? p_s[warp * kTile + lane] : -INFINITY;
      const float new_m = fmaxf(m, warp_max(s));
      const float p = (lane < kTile && s != -INFINITY) ? expf(s - new_m) : 0.0f;
      const float sum = warp_sum(p);
      const float corr = new_m == m ? 1.0f : expf(m - new_m);
      l = l * corr + sum;
      m = new_m;
      if (lane < kTile) p_s[warp * kTile + lane] = p;
      if (lane == 0) corr_s[warp] = corr;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kDimPerThread; ++j) {
      const int64_t c = tid + j * kThreads;
      if (c >= d) break;
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        float a = acc[h][j] * corr_s[h];
        for (int e = 0; e < ne; ++e) a += p_s[h * kTile + e] * kv_s[e * d + c];
        acc[h][j] = a;
      }
    }
    __syncthreads();  // the next tile overwrites kv_s and p_s
  }
  if (warp < kHeads && lane == 0) l_s[warp] = l;
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kDimPerThread; ++j) {
    const int64_t c = tid + j * kThreads;
    if (c >= d) break;
#pragma unroll
    for (int h = 0; h < kHeads; ++h)
      if (h < nh) o[h * d + c] = acc[h][j] / l_s[h];
  }
}

}  // namespace

Status run_sparse_attention(const SparseAttentionArgs& a, cudaStream_t stream) {
  if (a.n < 0) return invalid_argument("sparse_attention: n " + std::to_string(a.n) + " is negative");
  if (a.n_heads <= 0)
    return invalid_argument("sparse_attention: n_heads " + std::to_string(a.n_heads) + " must be positive");
  if (a.head_dim <= 0 || a.head_dim > kMaxDim)
    return invalid_argument("sparse_attention: head_dim " + std::to_string(a.head_dim) + " outside [1, " +
                            std::to_string(kMaxDim) + "]");
  if (a.max_entries_per_row < 0)
    return invalid_argument("sparse_attention: max_entries_per_row " + std::to_string(a.max_entries_per_row) +
                            " is negative");
  if (a.n == 0) return ok_status();
  if (!a.q || !a.kv_offsets || !a.sink || !a.out || (a.max_entries_per_row > 0 && (!a.kv_index || !a.kv)))
    return invalid_argument("sparse_attention: null q, kv_offsets, kv_index, kv, sink or out");
  const int64_t groups = (a.n_heads + kHeads - 1) / kHeads;
  if (a.n * groups > 0x7fffffff)
    return invalid_argument("sparse_attention: n " + std::to_string(a.n) + " x head groups too large");
  sparse_attention_kernel<<<static_cast<unsigned>(a.n * groups), kThreads, smem_bytes(a.head_dim), stream>>>(
      a.n_heads, a.head_dim, a.q, a.kv_offsets, a.kv_index, a.kv, a.sink, a.scale, a.out);
  return last_launch_status("sparse_attention");
}

}  // namespace ds41::cuda
