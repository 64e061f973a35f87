// ds41 backends/cuda: fused MoE kernels of the decode step (fused_moe_kernels.h).
//
// moe_route: grid n, 256 threads. Block r routes row r with moe::route_row (router_kernel's code;
//   the two-stage selection where E <= 512 and k <= 8, router_selection()).
//   Each block fences its row's experts / weights and counts itself; the last one resets the
//   counter and buckets all pairs (n * k <= 256) as one bucketing chunk: the pair's rank among
//   earlier pairs of its expert, a shared-memory histogram, an exclusive scan over the experts,
//   positions base + rank. The results are integers and copied weights: equal to bucket_count /
//   bucket_scan / bucket_place by construction (the stable order by expert, then row and slot).
// moe_combine_expand: combine_kernel's sorted float32 sum, the shared expert's add, then
//   hc_expand_kernel's float32 order per (row, channel).
// swiglu_pair: swiglu_kernel's operations (fp64 SiLU, std::min / std::clamp NaN semantics) over
//   two row sets, the first's blocks first; a float4 per thread where both sets allow it.
#include <algorithm>
#include <atomic>
#include <string>

#include "backends/cuda/block_scan.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/mhc_kernels.h"
#include "backends/cuda/moe_bucket_device.cuh"
#include "backends/cuda/moe_device.cuh"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rms_norm_device.cuh"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/swiglu_device.cuh"
#include "backends/cuda/tc_gemv_kernels.h"

namespace ds41::cuda {
namespace {

constexpr int kThreads = moe::kThreads;
constexpr int64_t kMaxHcC = 8;
constexpr int64_t kNextMaxH = 12288;  // the next collapse's row in dynamic shared memory (48 KB)

__global__ void __launch_bounds__(kThreads) moe_route_kernel(MoeRouteArgs a, int sel_mode) {
  dev::pdl_enter();
  __shared__ moe::RouterSmem sm;
  __shared__ int ex[moe::kChunk];
  __shared__ int part[kThreads];
  __shared__ int last;
  const int64_t E = a.n_experts, k = a.k;
  moe::route_row(a.logits, E, a.bias, a.bias_vl, a.vl, k, a.temp, a.route_scale, a.experts, a.weights,
                 blockIdx.x, sm, sel_mode);
  const bool alone = gridDim.x == 1;  // a one-row call is its own last block: no count, no fence
  if (!alone) __threadfence();  // this row's experts / weights, visible before it is counted or read below
  __syncthreads();
  if (!alone) {
    if (threadIdx.x == 0) {
      const uint32_t done = atomicAdd(&a.counters[0], 1u);
      last = done + 1 == static_cast<uint32_t>(a.n);
      if (last) a.counters[0] = 0;  // zero again for the next call
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
  }
  // Bucketing of the n * k pairs by the last block (one chunk). Alone: the pairs are this block's
  // picks, still in shared memory (no L2 round trip).
  moe::bucket_pairs(a, sm, ex, part, alone);
}

// The row's tail of moe_combine_expand_kernel<true>: the block of row r that finishes last (its counter)
// normalizes the collapsed row as hc_collapse_norm_quads does (the row through L2: every block wrote its
// channels), then zeroes the counter. Every thread of the block calls it (barriers).
__device__ __forceinline__ void next_norm_tail(const NextCollapse& nc, int64_t r, int64_t h, unsigned blocks,
                                               float* row /* h floats of shared memory */) {
  __shared__ int last;
  __shared__ double scratch[32];
  __threadfence();  // this block's channels of x, visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t done = atomicAdd(&nc.counters[r], 1u);
    last = done + 1 == blocks;
    if (last) nc.counters[r] = 0;  // zero again for the next call (kernels of the stream run in order)
  }
  __syncthreads();
  if (!last) return;  // block-uniform
  __threadfence();
  float* xr = nc.x + r * h;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) row[i] = __ldcg(xr + i);
  __syncthreads();
  const float inv = dev::rms_inv_like_rms_norm([&](int64_t i) { return row[i]; }, h, nc.sum_threads, nc.eps, scratch);
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x)
    xr[i] = __fmul_rn(row[i], inv) * (nc.norm_weight ? nc.norm_weight[i] : 1.0f);
}

// Channel i of row r: combine_kernel's sorted sum, the add, hc_expand_kernel's streams; with nw4 (kNext) the
// next collapse of the new stream values into x (hc_collapse_kernel's order: 0 + w0 s0 + w1 s1 + w2 s2 + w3 s3).
__device__ __forceinline__ void combine_expand_channel(const float* __restrict__ out_perm, const int64_t* pos, int cnt,
                                                       const float* pc, int64_t i, int64_t r, int64_t h,
                                                       const float* __restrict__ add, float ad, float* __restrict__ y,
                                                       float* S, int64_t c, const float (&old)[kMaxHcC],
                                                       const float* nw4, float* x) {
  float s = 0.0f;
  for (int q0 = 0; q0 < cnt; q0 += 8) {
    float o[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) o[u] = q0 + u < cnt ? out_perm[pos[q0 + u] * h + i] : 0.0f;
#pragma unroll
    for (int u = 0; u < 8; ++u)
      if (q0 + u < cnt) s = __fadd_rn(s, o[u]);
  }
  if (add) s = __fadd_rn(s, ad);
  y[r * h + i] = s;
  const float* cb = pc + c;
  float xv = 0.0f;
  for (int64_t kk = 0; kk < c; ++kk) {
    float v = __fmul_rn(pc[kk], s);
#pragma unroll
    for (int j = 0; j < kMaxHcC; ++j)
      if (j < c) v = __fadd_rn(v, __fmul_rn(cb[j * c + kk], old[j]));
    S[kk * h + i] = v;
    if (nw4) xv = __fadd_rn(xv, __fmul_rn(nw4[kk], v));  // c == 4 (the launcher's check)
  }
  if (nw4) x[r * h + i] = xv;
}

template <bool kNext>
__global__ void __launch_bounds__(kThreads)
    moe_combine_expand_kernel(const float* __restrict__ out_perm, const int64_t* __restrict__ slot_pos,
                              const int32_t* __restrict__ experts, int64_t k, int64_t h,
                              const float* __restrict__ add, float* __restrict__ y, float* streams,
                              const float* __restrict__ post, const float* __restrict__ comb, int64_t c,
                              NextCollapse nc) {
  dev::pdl_enter();
  // Every load of a round is issued before the arithmetic that waits for it (ncu: 7 us per call at
  // one row when thread 0's sort and each thread's sum, stream and comb loads were one L2 round trip
  // per loop iteration); the operations and their order are unchanged.
  __shared__ int64_t pos[moe::kMaxK];
  __shared__ float pc[kMaxHcC + kMaxHcC * kMaxHcC];  // post[r], then comb[r]
  __shared__ int cnt;
  const int64_t r = blockIdx.y;
  if (threadIdx.x == 0) {  // combine_kernel's insertion sort by expert id (stable)
    constexpr int kB = 8;  // slots loaded per round
    int32_t ex[moe::kMaxK];
    int m = 0;
    for (int64_t j0 = 0; j0 < k; j0 += kB) {
      int64_t ps[kB];
      int32_t es[kB];
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        ps[u] = j0 + u < k ? slot_pos[r * k + j0 + u] : -1;
        es[u] = j0 + u < k ? experts[r * k + j0 + u] : 0;
      }
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const int64_t p = ps[u];
        if (p < 0) continue;
        const int32_t e = es[u];
        int q = m++;
        while (q > 0 && ex[q - 1] > e) {
          ex[q] = ex[q - 1];
          pos[q] = pos[q - 1];
          --q;
        }
        ex[q] = e;
        pos[q] = p;
      }
    }
    cnt = m;
  }
  for (int64_t j = threadIdx.x; j < c + c * c; j += blockDim.x) pc[j] = j < c ? post[r * c + j] : comb[r * c * c + j - c];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool in = i < h;
  float* S = streams + r * c * h;
  float old[kMaxHcC];
#pragma unroll
  for (int j = 0; j < kMaxHcC; ++j) old[j] = (in && j < c) ? S[j * h + i] : 0.0f;
  const float ad = (in && add) ? add[r * h + i] : 0.0f;
  float nw4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // kNext: the next collapse's weights of row r
  if constexpr (kNext) {
#pragma unroll
    for (int j = 0; j < 4; ++j) nw4[j] = nc.collapse_w[r * 4 + j];
  }
  __syncthreads();
  if (!kNext && !in) return;
  if (in) combine_expand_channel(out_perm, pos, cnt, pc, i, r, h, add, ad, y, S, c, old, kNext ? nw4 : nullptr, nc.x);
  if constexpr (kNext) {
    extern __shared__ __align__(16) float smem[];  // h floats (the name the host emulator's rewrite knows)
    next_norm_tail(nc, r, h, gridDim.x, smem);
  }
}


// swiglu_kernel's operations on one element (swiglu_device.cuh).
using dev::swiglu_value;

// Element i of one of two row sets (grid over both): any shape.
__device__ __forceinline__ void swiglu_elem(const SwigluRows& x, int64_t i, float limit) {
  const float a = swiglu_value(x.g[i], x.u[i], limit);
  x.out[i] = x.row_scale ? __fmul_rn(x.row_scale[i / x.dim], a) : a;
}

__global__ void __launch_bounds__(kThreads)
    swiglu_pair_kernel(SwigluRows a, SwigluRows b, int64_t blocks_a, float limit) {
  dev::pdl_enter();
  const bool first = blockIdx.x < blocks_a;
  const SwigluRows& x = first ? a : b;
  const int64_t i = (static_cast<int64_t>(blockIdx.x) - (first ? 0 : blocks_a)) * blockDim.x + threadIdx.x;
  if (i < x.n * x.dim) swiglu_elem(x, i, limit);
}

// The prefill shape (ncu: the element kernel spent its time on the 64-bit index and row division,
// 6 ms for 16K rows): one float4 of one row per thread, 32-bit quad indices and one 32-bit row
// division per quad. Needs dim % 4 == 0, 16-byte aligned g / u / out and n * dim / 4 < 2^32 for
// both sets (run_swiglu_pair checks); the values are swiglu_value's, so the bits are the same.
__global__ void __launch_bounds__(kThreads)
    swiglu_pair_quads_kernel(SwigluRows a, SwigluRows b, uint32_t blocks_a, float limit) {
  dev::pdl_enter();
  const bool first = blockIdx.x < blocks_a;
  const SwigluRows& x = first ? a : b;
  const uint32_t q = (blockIdx.x - (first ? 0u : blocks_a)) * blockDim.x + threadIdx.x;
  const uint32_t quads_per_row = static_cast<uint32_t>(x.dim >> 2);
  if (q >= static_cast<uint32_t>(x.n) * quads_per_row) return;
  const float4 g = reinterpret_cast<const float4*>(x.g)[q];
  const float4 u = reinterpret_cast<const float4*>(x.u)[q];
  float4 o = make_float4(swiglu_value(g.x, u.x, limit), swiglu_value(g.y, u.y, limit),
                         swiglu_value(g.z, u.z, limit), swiglu_value(g.w, u.w, limit));
  if (x.row_scale) {
    const float s = x.row_scale[q / quads_per_row];
    o = make_float4(__fmul_rn(s, o.x), __fmul_rn(s, o.y), __fmul_rn(s, o.z), __fmul_rn(s, o.w));
  }
  reinterpret_cast<float4*>(x.out)[q] = o;
}

bool swiglu_quads_fit(const SwigluRows& x) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return x.n == 0 || (x.dim % 4 == 0 && x.n * (x.dim / 4) < (int64_t{1} << 32) - 1024 && al(x.g) && al(x.u) &&
                      al(x.out));
}

}  // namespace

Status run_swiglu_pair(const SwigluRows& a, const SwigluRows& b, float limit, cudaStream_t stream) {
  if (a.n < 0 || b.n < 0 || a.dim <= 0 || b.dim <= 0)
    return invalid_argument("swiglu_pair: n/dim out of range");
  const int64_t ba = (a.n * a.dim + kThreads - 1) / kThreads, bb = (b.n * b.dim + kThreads - 1) / kThreads;
  if (ba + bb == 0) return ok_status();
  if (ba + bb > 0x7fffffff) {
    DS41_RETURN_IF_ERROR(run_swiglu(a.g, a.u, a.n, a.dim, limit, a.row_scale, a.out, stream));
    return run_swiglu(b.g, b.u, b.n, b.dim, limit, b.row_scale, b.out, stream);
  }
  if (swiglu_quads_fit(a) && swiglu_quads_fit(b)) {
    const int64_t qa = (a.n * (a.dim / 4) + kThreads - 1) / kThreads;
    const int64_t qb = (b.n * (b.dim / 4) + kThreads - 1) / kThreads;
    if (qa + qb == 0) return ok_status();
    launch(swiglu_pair_quads_kernel, dim3(static_cast<unsigned>(qa + qb)), dim3(kThreads), 0, stream, a, b,
           static_cast<uint32_t>(qa), limit);
    return last_launch_status("swiglu_pair");
  }
  launch(swiglu_pair_kernel, dim3(static_cast<unsigned>(ba + bb)), dim3(kThreads), 0, stream, a, b, ba,
         limit);
  return last_launch_status("swiglu_pair");
}

Status run_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  const bool fused = a.counters && a.n > 0 && a.k > 0 && a.k <= moe::kMaxK && a.n_experts >= a.k &&
                     a.n_experts <= moe::kMaxExperts && a.n * a.k <= moe::kChunk;
  if (!fused) {
    DS41_RETURN_IF_ERROR(run_router(a.logits, a.n, a.n_experts, a.bias, a.bias_vl, a.vl, a.k, a.temp,
                                    a.route_scale, a.experts, a.weights, stream));
    return run_moe_bucket(a.experts, a.weights, a.n, a.k, a.n_experts, a.offsets, a.perm_rows, a.perm_weight,
                          a.slot_pos, a.workspace, stream);
  }
  launch(moe_route_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, stream, a, router_selection());
  return last_launch_status("moe_route");
}

namespace {
int g_moe_entry = -1;
std::atomic<uint64_t> g_moe_entry_fused{0};
}  // namespace

// On unless DS41_MOE_ENTRY=0. Measured on an H100 (docs/perf/README.md, session of 2026-12-06 15:19 UTC):
// with the expert early start, batch-1 layers 2,112-2,121 us against 2,143-2,155, steps 2.67-2.81 ms
// against 2.72-2.87, 198 kernels a step against 214; at 32K layers 2,387 against 2,435 us.
bool moe_entry_enabled() {
  static const bool env = switch_on("DS41_MOE_ENTRY");
  return g_moe_entry >= 0 ? g_moe_entry != 0 : env;
}
void set_moe_entry_for_tests(int mode) { g_moe_entry = mode < 0 ? -1 : (mode ? 1 : 0); }
uint64_t moe_entry_fused_launches() { return g_moe_entry_fused.load(); }

Status run_moe_entry(const DeviceWeight& gate, const MoeEntryArgs& a, cudaStream_t stream) {
  const MoeRouteArgs& r = a.route;
  if (r.n != 1) return invalid_argument("moe_entry: one row only (route.n " + std::to_string(r.n) + ")");
  const CollapseRow& c = a.row;
  if (!c.streams || !c.collapse_w || !c.x || !r.logits)
    return invalid_argument("moe_entry: streams / collapse_w / x / logits is null");
  if (gate.out_dim != r.n_experts)
    return invalid_argument("moe_entry: the gate has " + std::to_string(gate.out_dim) + " rows for " +
                            std::to_string(r.n_experts) + " experts");
  if (tcg::try_moe_entry(gate, a, stream)) {
    g_moe_entry_fused.fetch_add(1, std::memory_order_relaxed);
    return last_launch_status("moe_entry");
  }
  // The same operations as three launches: the collapse and its norm, the gate, the router.
  const int64_t h = gate.in_dim;
  DS41_RETURN_IF_ERROR(run_hc_collapse(c.streams, c.collapse_w, 1, 4, h, c.x, stream));
  DS41_RETURN_IF_ERROR(run_rms_norm(c.x, 1, h, c.norm_weight, c.eps, c.x, stream));
  float* logits = const_cast<float*>(r.logits);  // the router's input: the gate writes it first
  DS41_RETURN_IF_ERROR(run_linear(gate, c.x, 1, logits, stream, /*row_invariant=*/true));
  return run_moe_route(r, stream);
}

Status run_moe_combine_expand(const float* out_perm, const int64_t* slot_pos, const int32_t* experts,
                              int64_t n, int64_t k, int64_t h, const float* add, float* y, float* streams,
                              const float* post, const float* comb, int64_t c, cudaStream_t stream) {
  if (n < 0) return invalid_argument("moe_combine_expand: n is negative");
  if (k <= 0 || k > moe::kMaxK) return invalid_argument("moe_combine_expand: k out of range");
  if (h <= 0) return invalid_argument("moe_combine_expand: h must be positive");
  if (c <= 0 || c > kMaxHcC) return invalid_argument("moe_combine_expand: c outside [1, 8]");
  if (n == 0) return ok_status();
  if (n > 65535) {  // grid.y: the unfused sequence
    DS41_RETURN_IF_ERROR(run_moe_combine(out_perm, slot_pos, experts, n, k, h, y, stream));
    if (add) DS41_RETURN_IF_ERROR(run_add_inplace(y, add, n * h, stream));
    return run_hc_expand(streams, y, post, comb, n, c, h, stream);
  }
  const dim3 grid(grid_1d(h, kThreads), static_cast<unsigned>(n));
  launch(moe_combine_expand_kernel<false>, grid, dim3(kThreads), 0, stream, out_perm, slot_pos, experts, k, h, add,
         y, streams, post, comb, c, NextCollapse{});
  return last_launch_status("moe_combine_expand");
}

namespace {
int g_combine_collapse = -1;
}  // namespace

// DS41_COMBINE_COLLAPSE=1 (opt-in: measured slower on an H100, session of 2026-12-07 12:01 UTC: batch-1 layers
// 2,116 us against 2,064-2,091, though 5 launches fewer per step; the last block's norm and the 5,120 threads'
// fences before the count cost more on the chain than the one-block collapse launch they replace).
bool combine_collapse_enabled() {
  if (g_combine_collapse >= 0) return g_combine_collapse != 0;
  static const bool on = switch_opt_in("DS41_COMBINE_COLLAPSE");
  return on;
}
void set_combine_collapse_for_tests(int mode) { g_combine_collapse = mode < 0 ? -1 : (mode ? 1 : 0); }

Status run_moe_combine_expand_collapse(const float* out_perm, const int64_t* slot_pos, const int32_t* experts,
                                       int64_t n, int64_t k, int64_t h, const float* add, float* y, float* streams,
                                       const float* post, const float* comb, int64_t c, const NextCollapse& next,
                                       cudaStream_t stream) {
  if (n < 0) return invalid_argument("moe_combine_expand_collapse: n is negative");
  if (k <= 0 || k > moe::kMaxK) return invalid_argument("moe_combine_expand_collapse: k out of range");
  if (c != 4) return invalid_argument("moe_combine_expand_collapse: the collapse takes c = 4 streams, not " + std::to_string(c));
  if (h <= 0 || h % 4 != 0 || h > kNextMaxH)
    return invalid_argument("moe_combine_expand_collapse: h " + std::to_string(h) + " outside (0, 12288] or not a multiple of 4");
  if (n > 65535) return invalid_argument("moe_combine_expand_collapse: more than 65535 rows");
  if (!next.collapse_w || !next.x || !next.counters || next.sum_threads < 32 || next.sum_threads % 32 != 0 ||
      next.sum_threads > 1024)
    return invalid_argument("moe_combine_expand_collapse: null collapse weights / x / counters or a bad sum_threads");
  if (n == 0) return ok_status();
  const dim3 grid(grid_1d(h, kThreads), static_cast<unsigned>(n));
  launch(moe_combine_expand_kernel<true>, grid, dim3(kThreads), static_cast<size_t>(h) * sizeof(float), stream,
         out_perm, slot_pos, experts, k, h, add, y, streams, post, comb, c, next);
  return last_launch_status("moe_combine_expand_collapse");
}

}  // namespace ds41::cuda
