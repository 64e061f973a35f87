// ds41 backends/cuda: MoE routing, stable bucketing of the (row, slot) pairs by expert and the
// combine (MODEL_SPEC 3.5). All three are exact with respect to the CPU reference:
//   router  one 256-thread block per row: scores sqrt(softplus(logit / temp)) with the
//           reference's float64 softplus, then k rounds of a block arg-max in the house tie order
//           (larger biased score first, lower expert id on ties, -inf never selected); the weights
//           are summed in selection order in float32 by one thread, as the reference does.
//   bucket  three deterministic kernels (no order-dependent atomics): per chunk of 256 pairs a
//           shared-memory histogram and each pair's rank among earlier same-expert pairs of the
//           chunk; one block turns the per-chunk counts into per-chunk bases and the offsets; one
//           thread per pair writes its position. Pairs whose expert is outside [0, n_experts) get
//           slot_pos = -1 and are not bucketed.
//   combine one block row per token row: the row's k slots sorted by expert id (ascending), then
//           y = ((0 + out_0) + out_1) + ... in float32, the reference's scatter-add order.
#include <algorithm>
#include <string>

#include "backends/cuda/block_scan.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/moe_device.cuh"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/row_reduce.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

using moe::kChunk;
using moe::kMaxExperts;
using moe::kMaxK;
using moe::kThreads;

__global__ void __launch_bounds__(kThreads)
    router_kernel(const float* __restrict__ logits, int64_t E, const float* __restrict__ bias,
                  const float* __restrict__ bias_vl, const uint8_t* __restrict__ vl, int64_t k, float temp,
                  float route_scale, int32_t* __restrict__ experts, float* __restrict__ weights, int sel_mode) {
  dev::pdl_enter();
  __shared__ moe::RouterSmem sm;
  moe::route_row(logits, E, bias, bias_vl, vl, k, temp, route_scale, experts, weights, blockIdx.x, sm, sel_mode);
}

// Bucketing pass 1: per chunk, counts[chunk][e] and each pair's rank inside its chunk.
__global__ void __launch_bounds__(kChunk)
    bucket_count_kernel(const int32_t* __restrict__ experts, int64_t pairs, int64_t E,
                        int* __restrict__ counts, int* __restrict__ rank) {
  dev::pdl_enter();
  __shared__ int ex[kChunk];
  __shared__ int cnt[kMaxExperts];
  const int64_t chunk = blockIdx.x, p = chunk * kChunk + threadIdx.x;
  const int e = p < pairs ? experts[p] : -1;
  const bool valid = e >= 0 && e < E;
  ex[threadIdx.x] = valid ? e : -1;
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  if (valid) {
    int rk = 0;
    for (int t = 0; t < static_cast<int>(threadIdx.x); ++t) rk += ex[t] == e;
    rank[p] = rk;
    atomicAdd(&cnt[e], 1);  // the count is order-independent
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) counts[chunk * E + i] = cnt[i];
}

// Bucketing pass 2 (one block): counts[c][e] becomes the position of chunk c's first pair of
// expert e; offsets = exclusive scan of the per-expert totals.
__global__ void __launch_bounds__(1024)
    bucket_scan_kernel(int* __restrict__ counts, int64_t chunks, int64_t E, int64_t* __restrict__ offsets) {
  dev::pdl_enter();
  __shared__ int tot[kMaxExperts];
  __shared__ int part[1024];
  const int tid = threadIdx.x, T = blockDim.x;
  for (int64_t e = tid; e < E; e += T) {
    int run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int v = counts[c * E + e];
      counts[c * E + e] = run;
      run += v;
    }
    tot[e] = run;
  }
  __syncthreads();
  const dev::ThreadRange tr = dev::thread_range(E);
  int s = 0;
  for (int64_t e = tr.begin; e < tr.end; ++e) s += tot[e];
  int total = 0;
  int run = dev::block_exclusive_scan(s, part, &total);
  for (int64_t e = tr.begin; e < tr.end; ++e) {
    const int t = tot[e];
    tot[e] = run;  // now the expert's base
    offsets[e] = run;
    run += t;
  }
  if (tid == 0) offsets[E] = total;
  __syncthreads();
  for (int64_t e = tid; e < E; e += T)
    for (int64_t c = 0; c < chunks; ++c) counts[c * E + e] += tot[e];
}

// Bucketing pass 3: one thread per pair.
__global__ void bucket_place_kernel(const int32_t* __restrict__ experts, const float* __restrict__ weights,
                                    int64_t pairs, int64_t k, int64_t E, const int* __restrict__ counts,
                                    const int* __restrict__ rank, int64_t* __restrict__ perm_rows,
                                    float* __restrict__ perm_weight, int64_t* __restrict__ slot_pos) {
  dev::pdl_enter();
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int e = experts[p];
  if (e < 0 || e >= E) {
    slot_pos[p] = -1;
    return;
  }
  const int64_t pos = static_cast<int64_t>(counts[(p / kChunk) * E + e]) + rank[p];
  perm_rows[pos] = p / k;
  perm_weight[pos] = weights[p];
  slot_pos[p] = pos;
}

__global__ void combine_kernel(const float* __restrict__ out_perm, const int64_t* __restrict__ slot_pos,
                               const int32_t* __restrict__ experts, int64_t k, int64_t dim,
                               float* __restrict__ y) {
  dev::pdl_enter();
  __shared__ int64_t pos[kMaxK];
  __shared__ int cnt;
  const int64_t r = blockIdx.y;
  if (threadIdx.x == 0) {
    int32_t ex[kMaxK];
    int m = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = slot_pos[r * k + j];
      if (p < 0) continue;
      const int32_t e = experts[r * k + j];
      int q = m++;
      while (q > 0 && ex[q - 1] > e) {  // insertion sort by expert id (stable)
        ex[q] = ex[q - 1];
        pos[q] = pos[q - 1];
        --q;
      }
      ex[q] = e;
      pos[q] = p;
    }
    cnt = m;
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= dim) return;
  float s = 0.0f;
  for (int q = 0; q < cnt; ++q) s = __fadd_rn(s, out_perm[pos[q] * dim + c]);
  y[r * dim + c] = s;
}

Status bad(const char* fn, const std::string& what) {
  return invalid_argument(std::string(fn) + ": " + what);
}

constexpr size_t align256(size_t b) { return (b + 255) & ~size_t{255}; }

Status check_moe(const char* fn, int64_t n, int64_t k, int64_t E) {
  if (n < 0 || n > 0x7fffffff) return bad(fn, "n " + std::to_string(n) + " out of range");
  if (k <= 0 || k > kMaxK)
    return bad(fn, "k " + std::to_string(k) + " outside [1, " + std::to_string(kMaxK) + "]");
  if (E <= 0 || E > kMaxExperts || k > E)
    return bad(
        fn, "n_experts " + std::to_string(E) + " outside [max(1, k), " + std::to_string(kMaxExperts) + "]");
  if (n * k > 0x7fffffff) return bad(fn, "n * k too large");
  return ok_status();
}

}  // namespace

namespace {
int g_selection = -1;
}  // namespace

int router_selection() {
  if (g_selection >= 0) return g_selection;
  static const int mode = !switch_on("DS41_ROUTE_TWO_STAGE") ? 0 : switch_opt_in("DS41_ROUTE_SORT") ? 2 : 1;
  return mode;
}
void set_router_selection_for_tests(int mode) { g_selection = mode < 0 || mode > 2 ? -1 : mode; }

Status run_router(const float* logits, int64_t n, int64_t n_experts, const float* bias, const float* bias_vl,
                  const uint8_t* vl, int64_t k, float temp, float route_scale, int32_t* experts,
                  float* weights, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_moe("router", n, k, n_experts));
  if (n == 0) return ok_status();
  launch(router_kernel, static_cast<unsigned>(n), kThreads, 0, stream, logits, n_experts, bias, bias_vl, vl, k,
                                                                   temp, route_scale, experts, weights,
         router_selection());
  return last_launch_status("router");
}

size_t moe_bucket_workspace_bytes(int64_t n, int64_t k, int64_t n_experts) {
  const int64_t pairs = std::max<int64_t>(0, n * k), chunks = (pairs + kChunk - 1) / kChunk;
  return align256(static_cast<size_t>(chunks * std::max<int64_t>(n_experts, 0)) * sizeof(int)) +
         align256(static_cast<size_t>(pairs) * sizeof(int));
}

Status run_moe_bucket(const int32_t* experts, const float* weights, int64_t n, int64_t k, int64_t n_experts,
                      int64_t* offsets, int64_t* perm_rows, float* perm_weight, int64_t* slot_pos,
                      void* workspace, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_moe("moe_bucket", n, k, n_experts));
  const int64_t pairs = n * k, chunks = (pairs + kChunk - 1) / kChunk;
  if (pairs > 0 && !workspace) return bad("moe_bucket", "workspace is null");
  int* counts = static_cast<int*>(workspace);
  int* rank = reinterpret_cast<int*>(static_cast<char*>(workspace) +
                                     align256(static_cast<size_t>(chunks * n_experts) * sizeof(int)));
  if (chunks > 0) {
    launch(bucket_count_kernel, static_cast<unsigned>(chunks), kChunk, 0, stream, experts, pairs, n_experts,
                                                                              counts, rank);
    DS41_RETURN_IF_ERROR(last_launch_status("moe_bucket_count"));
  }
  launch(bucket_scan_kernel, 1, 1024, 0, stream, counts, chunks, n_experts, offsets);
  DS41_RETURN_IF_ERROR(last_launch_status("moe_bucket_scan"));
  if (pairs > 0) {
    launch(bucket_place_kernel, grid_1d(pairs, kThreads), kThreads, 0, stream, experts, weights, pairs, k, n_experts, counts, rank, perm_rows, perm_weight, slot_pos);
    DS41_RETURN_IF_ERROR(last_launch_status("moe_bucket_place"));
  }
  return ok_status();
}

Status run_moe_combine(const float* out_perm, const int64_t* slot_pos, const int32_t* experts, int64_t n,
                       int64_t k, int64_t dim, float* y, cudaStream_t stream) {
  if (n < 0) return bad("moe_combine", "n " + std::to_string(n) + " is negative");
  if (k <= 0 || k > kMaxK) return bad("moe_combine", "k " + std::to_string(k) + " out of range");
  if (dim <= 0) return bad("moe_combine", "dim must be positive");
  if (n == 0) return ok_status();
  for (int64_t r0 = 0; r0 < n; r0 += 65535) {  // grid.y <= 65535 rows per launch
    const dim3 grid(grid_1d(dim, kThreads), static_cast<unsigned>(std::min<int64_t>(65535, n - r0)));
    launch(combine_kernel, grid, kThreads, 0, stream, out_perm, slot_pos + r0 * k, experts + r0 * k, k, dim,
                                                  y + r0 * dim);
  }
  return last_launch_status("moe_combine");
}

}  // namespace ds41::cuda
