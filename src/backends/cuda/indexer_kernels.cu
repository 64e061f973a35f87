// ds41 backends/cuda: indexer scores (MODEL_SPEC 3.4.6) over the visible compressed keys:
// out[r, t] = sum_h w[r, h] * relu(q[r, h] . key[key_begin[r] + t]) * scale, -inf past visible[r].
//
// Bit-exact with the CPU reference (backends/cpu indexer_scores): each dot product repeats
// dot_f32's arithmetic (8 float lane sums over channels i = l mod 8 in ascending order, the lanes
// then the tail added in double, rounded to float), then relu, the float scale, and the double sum
// over heads in head order. The build's --fmad=false keeps every product and sum separately rounded
// like the CPU's -ffp-contract=off. So the selection downstream (top-k, candidate pool) sees the
// same scores on both backends.
//
// Tiling: one CTA per (row, 32 consecutive keys), its 4 warps splitting the heads, one lane per key
// (indexer_scores_split_kernel; one CTA per 128 keys, a thread per key with every head, when the
// per-head values do not fit shared memory or there are fewer than 4 heads); the row's queries and
// head weights sit in shared memory (read as broadcasts), the thread's key in registers for
// head_dim 128 (the released width; other widths read it through L1).
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/fake_quant_device.cuh"
#include "backends/cuda/indexer_dot.cuh"
#include "backends/cuda/indexer_kernels.h"
#include "backends/cuda/indexer_tc_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/paged_rows.cuh"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {
using dev::dot_like_cpu;

constexpr int kThreads = 128;
constexpr size_t kMaxSmem = 48 * 1024;
constexpr int64_t kTcMinRows = 32;  // decode-shaped calls keep one thread per key

// The row's queries [n_heads][d] and head weights [n_heads] into shared memory (the block's
// threads), then a barrier.
__device__ __forceinline__ void stage_queries(const float* __restrict__ q, const float* __restrict__ w, int64_t r,
                                              int64_t n_heads, int64_t d, float* q_s, float* w_s) {
  const float* qr = q + r * n_heads * d;
  for (int64_t i = threadIdx.x; i < n_heads * d; i += blockDim.x) q_s[i] = qr[i];
  for (int64_t i = threadIdx.x; i < n_heads; i += blockDim.x) w_s[i] = w[r * n_heads + i];
  __syncthreads();
}

// f(h, relu(q_h . key) * scale) for the heads [h0, h1) in order: dot_f32's arithmetic, the key in
// registers for head_dim kD (the released 128), else read through L1.
// The same from a key already in registers (kD channels; the packed kernel decodes it there).
template <int kD, typename F>
__device__ __forceinline__ void head_values_regs(const float* q_s, const float (&kr)[kD], int64_t h0, int64_t h1,
                                                 float scale, F&& f) {
  for (int64_t h = h0; h < h1; ++h) {
    const float v = dot_like_cpu<kD>(q_s + h * kD, kr, kD);
    f(h, (v < 0.0f ? 0.0f : v) * scale);  // std::max(v, 0.0f) * scale, NaN kept
  }
}

template <int kD, typename F>
__device__ __forceinline__ void head_values(const float* q_s, const float* __restrict__ kp, int64_t d, int64_t h0,
                                            int64_t h1, float scale, F&& f) {
  if constexpr (kD > 0) {
    float kr[kD];
#pragma unroll
    for (int i = 0; i < kD; ++i) kr[i] = kp[i];
    head_values_regs<kD>(q_s, kr, h0, h1, scale, f);
  } else {
    for (int64_t h = h0; h < h1; ++h) {
      const float v = dot_like_cpu<0>(q_s + h * d, kp, d);
      f(h, (v < 0.0f ? 0.0f : v) * scale);
    }
  }
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    indexer_scores_kernel(int64_t n_heads, int64_t d, int64_t t_stride, int64_t tiles,
                          const float* __restrict__ q, const float* __restrict__ w,
                          const float* __restrict__ keys, const int64_t* __restrict__ key_begin,
                          const int64_t* __restrict__ visible, float scale, float* __restrict__ out) {
  dev::pdl_enter();
  extern __shared__ float smem[];
  float* q_s = smem;                // [n_heads][d]
  float* w_s = smem + n_heads * d;  // [n_heads]
  const int64_t r = blockIdx.x / tiles;
  const int64_t t = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  stage_queries(q, w, r, n_heads, d, q_s, w_s);
  if (t >= t_stride) return;
  const int64_t vis = min(visible[r], t_stride);
  float* o = out + r * t_stride + t;
  if (t >= vis) {
    *o = -INFINITY;
    return;
  }
  double sc = 0.0;
  head_values<kD>(q_s, keys + (key_begin[r] + t) * d, d, 0, n_heads, scale,
                  [&](int64_t h, float v) { sc += static_cast<double>(v) * static_cast<double>(w_s[h]); });
  *o = static_cast<float>(sc);
}

// The decode-shaped variant: a CTA serves (row, kSplitKeys consecutive keys) with its kHeadGroups
// warps splitting the heads (warp g: heads [g * hp, (g + 1) * hp), lane: the key), so a call of a few
// rows spreads over 4x the CTAs (ncu: 16 CTAs, 23.6 us at 2048 keys with one thread per key and all
// 32 heads). Each head's relu(q . k) * scale is the kernel above's; the per-head values meet in
// shared memory (head_values: the same arithmetic) and warp 0 adds them in head order in double, so
// the same bits.
constexpr int kHeadGroups = kThreads / 32;
constexpr int64_t kSplitKeys = 32;

// Warp 0's end of the split kernels: key t's score from its per-head values vr (the double sum over
// heads in head order, as indexer_scores_kernel), -inf past the row's visible keys.
__device__ __forceinline__ void split_score(int64_t t, int64_t t_stride, bool live, const float* vr,
                                            const float* w_s, int64_t n_heads, float* out_row) {
  if (t >= t_stride) return;
  if (!live) {
    out_row[t] = -INFINITY;
    return;
  }
  double sc = 0.0;
  for (int64_t h = 0; h < n_heads; ++h) sc += static_cast<double>(vr[h]) * static_cast<double>(w_s[h]);
  out_row[t] = static_cast<float>(sc);
}

template <int kD>
__global__ void __launch_bounds__(kThreads)
    indexer_scores_split_kernel(int64_t n_heads, int64_t d, int64_t t_stride, int64_t tiles,
                                const float* __restrict__ q, const float* __restrict__ w,
                                const float* __restrict__ keys, const int64_t* __restrict__ key_begin,
                                const int64_t* __restrict__ visible, float scale, float* __restrict__ out) {
  dev::pdl_enter();
  extern __shared__ float smem[];
  float* q_s = smem;                    // [n_heads][d]
  float* w_s = smem + n_heads * d;      // [n_heads]
  float* v_s = w_s + n_heads;           // [kSplitKeys][vstride]
  const int64_t vstride = n_heads | 1;  // odd: a warp's lanes write different banks
  const int64_t r = blockIdx.x / tiles;
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t t = (blockIdx.x % tiles) * kSplitKeys + lane;
  stage_queries(q, w, r, n_heads, d, q_s, w_s);
  const int64_t vis = min(visible[r], t_stride);
  const bool live = t < vis;
  const int64_t hp = (n_heads + kHeadGroups - 1) / kHeadGroups;
  const int64_t h0 = g * hp, h1 = min(n_heads, h0 + hp);
  if (live) {
    float* vr = v_s + lane * vstride;
    head_values<kD>(q_s, keys + (key_begin[r] + t) * d, d, h0, h1, scale, [&](int64_t h, float v) { vr[h] = v; });
  }
  __syncthreads();
  if (g == 0) split_score(t, t_stride, live, v_s + lane * vstride, w_s, n_heads, out + r * t_stride);
}

// The split kernel over packed keys: the CTA's 32 keys' Q_idx rows (68 bytes each at head_dim 128)
// are staged in shared memory by all threads (consecutive threads read consecutive bytes of a row:
// coalesced, where a lane reading its own float key made every load instruction touch 32 lines,
// ~4,096 L1 wavefronts per warp and key tile), then lane j decodes key j into registers with
// fake_quant_device's decode_code<kIdx> (the float run_decode_rows_gather writes) and
// computes indexer_scores_split_kernel's values from there: the same bits. Rows of 68 bytes are 17
// words apart, an odd number: a warp's word reads of its 32 rows are conflict-free.
constexpr int kPackedD = 128;
constexpr int kPackedRowBytes = kPackedD / 2 + kPackedD / 32;  // 68

// The packed kernel's staging, a thread's loads in flight together (ncu on the H100: 27 us a call at
// 4,096 keys when a byte loop made ~17 dependent rounds of a key offset and a key byte per thread, and
// the query loop rounds of 4 floats): the row's queries (float4 where 16-byte aligned, else
// stage_queries' loop) and the CTA's nk key offsets go out first; after a barrier that publishes the
// offsets, each thread's <= 5 words of the keys' 17-word rows (a byte at a time for a row that is not
// 4-byte aligned; a negative offset: the zero key, zero codes and scale byte 0). The same bytes in
// shared memory as the byte loop. Ends with a barrier.
__device__ __forceinline__ void stage_packed(const float* __restrict__ q, const float* __restrict__ w, int64_t r,
                                             int64_t n_heads, const uint8_t* __restrict__ key_base,
                                             const int64_t* __restrict__ offs, int64_t nk, float* q_s, float* w_s,
                                             uint8_t* k_s, float w_scale, const PagedRowsArgs& pg, int64_t seq,
                                             int64_t t0) {
  __shared__ int64_t off_s[kSplitKeys];
  const int tid = threadIdx.x;
  const float* qr = q + r * n_heads * kPackedD;
  const int64_t n4 = n_heads * kPackedD / 4;
  // offs null: the offsets from the pages (entry t0 + tid of sequence seq).
  if (tid < kSplitKeys) off_s[tid] = tid < nk ? (offs ? offs[tid] : dev::paged_offset(pg, seq, t0 + tid)) : -1;
  for (int64_t i = tid; i < n_heads; i += blockDim.x) w_s[i] = __fmul_rn(w[r * n_heads + i], w_scale);
  if ((reinterpret_cast<uintptr_t>(qr) & 15u) == 0) {
    constexpr int kLoads = 8;  // 32 heads: every float4 of the row in one round
    const float4* q4 = reinterpret_cast<const float4*>(qr);
    for (int64_t base = tid; base < n4; base += kLoads * blockDim.x) {
      float4 x[kLoads];
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t i = base + j * blockDim.x;
        if (i < n4) x[j] = q4[i];
      }
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        const int64_t i = base + j * blockDim.x;
        if (i < n4) reinterpret_cast<float4*>(q_s)[i] = x[j];
      }
    }
  } else {
    for (int64_t i = tid; i < n_heads * kPackedD; i += blockDim.x) q_s[i] = qr[i];
  }
  __syncthreads();  // off_s
  constexpr int kRowWords = kPackedRowBytes / 4;                                // 17
  constexpr int kKeyLoads = (kSplitKeys * kRowWords + kThreads - 1) / kThreads;  // 5
  static_assert(kPackedRowBytes % 4 == 0, "packed rows of whole words");
  uint32_t kw[kKeyLoads];
#pragma unroll
  for (int u = 0; u < kKeyLoads; ++u) {
    const int64_t i = tid + u * kThreads;
    kw[u] = 0u;
    if (i < nk * kRowWords) {
      const int64_t j = i / kRowWords, c = i - j * kRowWords, off = off_s[j];
      if (off >= 0) {
        const uint8_t* p = key_base + off + 4 * c;
        if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
          kw[u] = __ldg(reinterpret_cast<const uint32_t*>(p));
        } else {
          kw[u] = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                  (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
        }
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kKeyLoads; ++u) {
    const int64_t i = tid + u * kThreads;
    if (i < nk * kRowWords) reinterpret_cast<uint32_t*>(k_s)[i] = kw[u];
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    indexer_scores_packed_kernel(int64_t n_heads, int64_t t_stride, int64_t tiles, const float* __restrict__ q,
                                 const float* __restrict__ w, const uint8_t* __restrict__ key_base,
                                 const int64_t* __restrict__ key_offsets, const int64_t* __restrict__ key_begin,
                                 const int64_t* __restrict__ visible, float scale, float w_scale,
                                 PagedRowsArgs pg, const int32_t* __restrict__ row_seq, float* __restrict__ out) {
  dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;                    // [n_heads][128]
  float* w_s = smem + n_heads * kPackedD;  // [n_heads]
  float* v_s = w_s + n_heads;           // [kSplitKeys][vstride]
  const int64_t vstride = n_heads | 1;
  uint8_t* k_s = reinterpret_cast<uint8_t*>(v_s + kSplitKeys * vstride);  // [kSplitKeys][68]
  const int64_t r = blockIdx.x / tiles, t0 = (blockIdx.x % tiles) * kSplitKeys;
  const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
  const int64_t vis = min(visible[r], t_stride);
  const int64_t nk = max(int64_t{0}, min(static_cast<int64_t>(kSplitKeys), vis - t0));
  stage_packed(q, w, r, n_heads, key_base, key_offsets ? key_offsets + key_begin[r] + t0 : nullptr, nk, q_s, w_s,
               k_s, w_scale, pg, row_seq ? row_seq[r] : 0, t0);  // ends with a barrier
  const int64_t t = t0 + lane;
  const bool live = t < vis;
  const int64_t hp = (n_heads + kHeadGroups - 1) / kHeadGroups;
  const int64_t h0 = g * hp, h1 = min(n_heads, h0 + hp);
  if (live && h0 < h1) {
    float kr[kPackedD];
    const uint32_t* kw = reinterpret_cast<const uint32_t*>(k_s + lane * kPackedRowBytes);
    const uint32_t sw = kw[kPackedD / 8];  // the four E8M0 bytes (one per 32 channels)
#pragma unroll
    for (int c = 0; c < kPackedD / 8; ++c) {
      const uint32_t word = kw[c];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        kr[8 * c + j] = fq::decode_code<fq::kIdx>((word >> (4 * j)) & 15u, (sw >> (8 * (c / 4))) & 0xffu);
    }
    float* vr = v_s + lane * vstride;
    head_values_regs<kPackedD>(q_s, kr, h0, h1, scale, [&](int64_t h, float v) { vr[h] = v; });
  }
  __syncthreads();
  if (g == 0) split_score(t, t_stride, live, v_s + lane * vstride, w_s, n_heads, out + r * t_stride);
}

size_t packed_smem(int64_t n_heads) {
  return sizeof(float) * static_cast<size_t>(n_heads * kPackedD + n_heads + kSplitKeys * (n_heads | 1)) +
         static_cast<size_t>(kSplitKeys * kPackedRowBytes);
}

}  // namespace

bool indexer_scores_packed_supported(const IndexerDeviceArgs& a) {
  static const bool allowed = switch_on("DS41_PACKED_INDEXER");
  return allowed && a.head_dim == kPackedD && a.n_heads >= kHeadGroups && a.n < kTcMinRows &&
         packed_smem(a.n_heads) <= kMaxSmem;
}

Status run_indexer_scores(const IndexerDeviceArgs& a, cudaStream_t stream) {
  if (a.n < 0 || a.t_stride < 0)
    return invalid_argument("indexer_scores: n " + std::to_string(a.n) + " / t_stride " +
                            std::to_string(a.t_stride) + " negative");
  if (a.n_heads <= 0 || a.head_dim <= 0)
    return invalid_argument("indexer_scores: n_heads " + std::to_string(a.n_heads) + " / head_dim " +
                            std::to_string(a.head_dim) + " must be positive");
  const size_t smem = sizeof(float) * static_cast<size_t>(a.n_heads * a.head_dim + a.n_heads);
  if (smem > kMaxSmem)
    return invalid_argument("indexer_scores: n_heads x head_dim " + std::to_string(a.n_heads * a.head_dim) +
                            " does not fit the shared-memory query tile (48 KiB)");
  if (a.n == 0 || a.t_stride == 0) return ok_status();
  if (a.key_base != nullptr || a.key_offsets != nullptr || a.row_seq != nullptr) {  // packed keys
    const bool paged = a.key_offsets == nullptr;
    if (!a.key_base || (paged && !a.row_seq) || !a.q || !a.w || !a.key_begin || !a.visible || !a.out)
      return invalid_argument(
          "indexer_scores: packed keys need key_base, key_offsets (or row_seq and key_pages), q, w, key_begin, "
          "visible, out");
    if (paged) {  // check_paged_rows' geometry, rows wide enough for a Q_idx row, the page table
      Status geo = check_paged_rows(a.key_pages);
      if (geo.ok() && a.key_pages.row_bytes < kPackedRowBytes)
        geo = invalid_argument("rows of " + std::to_string(a.key_pages.row_bytes) + " bytes, a Q_idx row has " +
                               std::to_string(kPackedRowBytes));
      if (geo.ok() && (!a.key_pages.pages || !a.key_pages.seq_page_begin))
        geo = invalid_argument("null pages or seq_page_begin");
      if (!geo.ok()) return invalid_argument("indexer_scores: paged keys need a page geometry: " + geo.message());
    }
    if (a.head_dim != kPackedD || a.n_heads < kHeadGroups || packed_smem(a.n_heads) > kMaxSmem)
      return invalid_argument("indexer_scores: packed keys need head_dim 128 and 4.." +
                              std::to_string((kMaxSmem / sizeof(float)) / (kPackedD + 2)) + " heads, got " +
                              std::to_string(a.n_heads) + " x " + std::to_string(a.head_dim));
    const int64_t tiles = (a.t_stride + kSplitKeys - 1) / kSplitKeys;
    if (a.n * tiles > 0x7fffffff)
      return invalid_argument("indexer_scores: n " + std::to_string(a.n) + " x t_stride " +
                              std::to_string(a.t_stride) + " too large for one grid");
    launch(indexer_scores_packed_kernel, static_cast<unsigned>(a.n * tiles), kThreads, packed_smem(a.n_heads), stream,
           a.n_heads, a.t_stride, tiles, a.q, a.w, a.key_base, a.key_offsets, a.key_begin, a.visible, a.scale,
           a.w_scale, a.key_pages, a.row_seq, a.out);  // the kernel takes key_offsets where set
    return last_launch_status("indexer_scores (packed keys)");
  }
  if (a.w_scale != 1.0f)
    return invalid_argument("indexer_scores: w_scale " + std::to_string(a.w_scale) +
                            " is taken by the packed-key kernel only (scale the weights first)");
  if (!a.q || !a.w || !a.keys || !a.key_begin || !a.visible || !a.out)
    return invalid_argument("indexer_scores: null q, w, keys, key_begin, visible or out");
  // Prefill-shaped calls (rows of one sequence share their keys) take the tensor cores: the same
  // bits (indexer_tc_kernels.cu). DS41_TC_INDEXER=0 keeps this kernel (A/B measurements).
  static const bool tc_allowed = switch_on("DS41_TC_INDEXER");
  if (tc_allowed && a.n >= kTcMinRows && indexer_scores_tc_supported(a) &&
      reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && reinterpret_cast<uintptr_t>(a.keys) % 16 == 0)
    return run_indexer_scores_tc(a, stream);
  const size_t split_smem = smem + sizeof(float) * static_cast<size_t>(kSplitKeys * (a.n_heads | 1));
  if (a.n_heads >= kHeadGroups && split_smem <= kMaxSmem) {
    const int64_t split_tiles = (a.t_stride + kSplitKeys - 1) / kSplitKeys;
    if (a.n * split_tiles > 0x7fffffff)
      return invalid_argument("indexer_scores: n " + std::to_string(a.n) + " x t_stride " +
                              std::to_string(a.t_stride) + " too large for one grid");
    const unsigned g = static_cast<unsigned>(a.n * split_tiles);
    if (a.head_dim == 128)
      launch(indexer_scores_split_kernel<128>, g, kThreads, split_smem, stream, a.n_heads, a.head_dim, a.t_stride,
             split_tiles, a.q, a.w, a.keys, a.key_begin, a.visible, a.scale, a.out);
    else
      launch(indexer_scores_split_kernel<0>, g, kThreads, split_smem, stream, a.n_heads, a.head_dim, a.t_stride,
             split_tiles, a.q, a.w, a.keys, a.key_begin, a.visible, a.scale, a.out);
    return last_launch_status("indexer_scores");
  }
  const int64_t tiles = (a.t_stride + kThreads - 1) / kThreads;
  if (a.n * tiles > 0x7fffffff)
    return invalid_argument("indexer_scores: n " + std::to_string(a.n) + " x t_stride " +
                            std::to_string(a.t_stride) + " too large for one grid");
  const unsigned grid = static_cast<unsigned>(a.n * tiles);
  if (a.head_dim == 128)
    launch(indexer_scores_kernel<128>, grid, kThreads, smem, stream, a.n_heads, a.head_dim, a.t_stride, tiles, a.q, a.w, a.keys, a.key_begin, a.visible, a.scale, a.out);
  else
    launch(indexer_scores_kernel<0>, grid, kThreads, smem, stream, a.n_heads, a.head_dim, a.t_stride, tiles, a.q, a.w, a.keys, a.key_begin, a.visible, a.scale, a.out);
  return last_launch_status("indexer_scores");
}

}  // namespace ds41::cuda
