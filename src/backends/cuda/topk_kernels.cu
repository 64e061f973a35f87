// ds41 backends/cuda: the index top-k, the candidate pool and its restriction (MODEL_SPEC 3.4.6)
// with the house tie order of src/ops/backend.h. Selection sets are bit-exact with the CPU
// reference: both are defined by the same total order (score desc, index asc), and the selection
// (radix_select.cuh) computes that order's k-th element exactly.
//
// topk_rows: one CTA per row, no workspace: in calls of at most 64 rows (decode-shaped), rows of up to 10240
//   scores by the register select (reg_select.cuh: the keys in registers, the k-th key by a radix-4 search of
//   block-wide counts, then the ascending emit); otherwise (prefill-shaped calls, DS41_TOPK_REG=0) the radix
//   selects (radix_select.cuh), rows of up to 10240 scores first copied into shared memory. Long rows of calls of at most
//   64 rows (decode steps at long contexts) take two launches: the k best of each chunk of the row
//   (many CTAs), then the k best of the chunks' candidates (topk_chunks_kernel, topk_merge_kernel);
//   the same selection, with the candidates in the workspace.
// candidate_pool: one CTA per row; block maxima (std::max semantics: NaN ignored) go to the
// workspace row, the block holding the newest visible entry is forced to +inf, the keep_blocks best
// blocks are selected like top-k and their entries' mask bytes set (all other bytes cleared).
// mask_restrict: elementwise.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/radix_select.cuh"
#include "backends/cuda/reg_select.cuh"
#include "backends/cuda/topk_kernels.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"

namespace ds41::cuda {
namespace {

int threads_for(int64_t t) { return t >= 8192 ? 1024 : 256; }

constexpr int64_t kMaxCachedScores = 10240;  // 40 KB of dynamic shared memory (no opt-in)

// row[0, m) into shared memory, every thread's kLoads loads in flight together; then a barrier.
__device__ void cache_row(const float* __restrict__ row, int64_t m, float* smem) {
  constexpr int kLoads = 8;
  for (int64_t base = threadIdx.x; base < m; base += kLoads * blockDim.x) {
    float x[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t i = base + j * blockDim.x;
      x[j] = i < m ? row[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int64_t i = base + j * blockDim.x;
      if (i < m) smem[i] = x[j];
    }
  }
  __syncthreads();
}

// The selection's shared memory: the wide select's (radix_select.cuh: two passes over the row) or
// the four-pass select's (DS41_TOPK_WIDE=0). The same Threshold either way.
template <bool Wide>
using SelShared = std::conditional_t<Wide, sel::WideShared, sel::SelectShared>;
template <typename Load>
__device__ sel::Threshold threshold(const Load& load, int64_t m, int64_t k, sel::SelectShared& sh) {
  return sel::select_threshold(load, m, k, sh);
}
template <typename Load>
__device__ sel::Threshold threshold(const Load& load, int64_t m, int64_t k, sel::WideShared& sh) {
  return sel::select_threshold_wide(load, m, k, sh);
}
__device__ inline sel::SelectShared& emit_shared(sel::SelectShared& sh) { return sh; }
__device__ inline sel::SelectShared& emit_shared(sel::WideShared& sh) { return sh.fallback; }

// The k best of load(0..m) emitted in ascending order (radix_select.cuh), o[taken..k) = -1. runs: the emit
// with one barrier (sel::select_emit_runs; loads from shared memory only), else select_emit's chunks.
template <typename Shared, typename Load, typename Emit>
__device__ void select_padded(const Load& load, int64_t m, int64_t k, Shared& sh, const Emit& emit, int32_t* o,
                              bool runs = false) {
  const sel::Threshold th = threshold(load, m, k, sh);
  const int64_t taken = runs ? sel::select_emit_runs(load, m, th, emit_shared(sh), emit)
                             : sel::select_emit(load, m, th, emit_shared(sh), emit);
  for (int64_t j = taken + threadIdx.x; j < k; j += blockDim.x) o[j] = -1;
}

// cached (t <= kMaxCachedScores): the row is copied into shared memory first (every thread's loads
// in flight together), and the four histogram passes and the emit read it there; otherwise they
// read the row from global memory (through L2) each time. The same selection either way.
template <bool Wide>
__global__ void __launch_bounds__(1024) topk_rows_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                 int32_t* __restrict__ out, bool cached, bool runs) {
  dev::pdl_enter();
  __shared__ SelShared<Wide> sh;
  extern __shared__ float smem[];  // the cached row
  const int64_t r = blockIdx.x;
  const float* row = scores + r * t;
  int32_t* o = out + r * k;
  auto emit = [o](int64_t i, bool s, int64_t pos) {
    if (s) o[pos] = static_cast<int32_t>(i);
  };
  if (cached) {
    cache_row(row, t, smem);
    select_padded([&](int64_t i) { return smem[i]; }, t, k, sh, emit, o, runs);
  } else {
    select_padded([row](int64_t i) { return row[i]; }, t, k, sh, emit, o);
  }
}

// Long rows of a small call (a decode step's index top-k at 32K-128K context: one CTA over 131,073
// scores took 0.9-1.0 ms on the H200) in two launches. Phase 1: CTA (c, r) selects the k best of
// chunk c of row r with the same radix select and writes their global indices, ascending, into
// cand[r][c][0..k) (-1 padded). Every entry of the row's k best is among its chunk's k best (fewer
// than k entries of its chunk beat it in the total order, since fewer than k of the row do). Phase
// 2: one CTA per row selects the k best of the row's g x k candidates, list position as index:
// the lists are in ascending global index, so ties fall as in the row and the emit order is the
// row's ascending index order. The same set and order as topk_rows_kernel, bit for bit.
template <bool Wide>
__global__ void __launch_bounds__(1024) topk_chunks_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                                           int64_t chunk, int32_t* __restrict__ cand, bool runs) {
  dev::pdl_enter();
  __shared__ SelShared<Wide> sh;
  extern __shared__ float smem[];  // the chunk's scores (chunk <= kMaxCachedScores)
  const int64_t c = blockIdx.x, g = gridDim.x, r = blockIdx.y;
  const int64_t b0 = c * chunk, e0 = b0 + chunk < t ? b0 + chunk : t, m = e0 > b0 ? e0 - b0 : 0;
  const float* row = scores + r * t + b0;
  int32_t* o = cand + (r * g + c) * k;
  cache_row(row, m, smem);
  auto load = [&](int64_t i) { return smem[i]; };
  auto emit = [o, b0](int64_t i, bool s, int64_t pos) {
    if (s) o[pos] = static_cast<int32_t>(b0 + i);
  };
  select_padded(load, m, k, sh, emit, o, runs);
}

template <bool Wide>
__global__ void __launch_bounds__(1024) topk_merge_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                                          int64_t g, const int32_t* __restrict__ cand,
                                                          int32_t* __restrict__ out, bool runs) {
  dev::pdl_enter();
  __shared__ SelShared<Wide> sh;
  extern __shared__ float smem[];  // the candidates' scores (-inf for padding)
  const int64_t r = blockIdx.x, m = g * k;
  const float* row = scores + r * t;
  const int32_t* cr = cand + r * m;
  int32_t* o = out + r * k;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
    const int32_t j = cr[i];
    smem[i] = j >= 0 ? row[j] : -INFINITY;
  }
  __syncthreads();
  auto load = [&](int64_t i) { return smem[i]; };
  auto emit = [o, cr](int64_t i, bool s, int64_t pos) {
    if (s) o[pos] = cr[i];
  };
  select_padded(load, m, k, sh, emit, o, runs);
}

// The register select (reg_select.cuh; DS41_TOPK_REG, on by default) for rows, chunks and merges of at most
// kRegMaxScores scores in calls of at most 64 rows: NT (256, or 512 with DS41_TOPK_REG_THREADS=512) threads with
// KPT keys each, no shared-memory row, no dynamic shared memory. The same sets and order as the radix selects'
// kernels above (the same Threshold and emit ranks).
constexpr int64_t kRegMaxScores = 10240;  // (= kMaxCachedScores)

template <int KPT, int NT>
__global__ void __launch_bounds__(NT) topk_rows_reg_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                                           int32_t* __restrict__ out) {
  dev::pdl_enter();
  __shared__ sel::RegShared sh;
  const float* row = scores + static_cast<int64_t>(blockIdx.x) * t;
  int32_t* o = out + static_cast<int64_t>(blockIdx.x) * k;
  const int64_t taken = sel::reg_select<KPT, NT>([row](int64_t i) { return row[i]; }, t, k, sh,
                                                 [o](int64_t i, bool s, int64_t pos) {
                                                   if (s) o[pos] = static_cast<int32_t>(i);
                                                 });
  for (int64_t j = taken + threadIdx.x; j < k; j += blockDim.x) o[j] = -1;
}

// topk_chunks_kernel's phase 1 with the register select (chunk <= kRegMaxScores).
template <int KPT, int NT>
__global__ void __launch_bounds__(NT) topk_chunks_reg_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                                             int64_t chunk, int32_t* __restrict__ cand) {
  dev::pdl_enter();
  __shared__ sel::RegShared sh;
  const int64_t c = blockIdx.x, g = gridDim.x, r = blockIdx.y;
  const int64_t b0 = c * chunk, e0 = b0 + chunk < t ? b0 + chunk : t, m = e0 > b0 ? e0 - b0 : 0;
  const float* row = scores + r * t + b0;
  int32_t* o = cand + (r * g + c) * k;
  const int64_t taken = sel::reg_select<KPT, NT>([row](int64_t i) { return row[i]; }, m, k, sh,
                                                 [o, b0](int64_t i, bool s, int64_t pos) {
                                                   if (s) o[pos] = static_cast<int32_t>(b0 + i);
                                                 });
  for (int64_t j = taken + threadIdx.x; j < k; j += blockDim.x) o[j] = -1;
}

// topk_merge_kernel's phase 2 with the register select (g x k <= kRegMaxScores): the candidates' scores
// gathered from the row (-inf for padding), list position as the index.
template <int KPT, int NT>
__global__ void __launch_bounds__(NT) topk_merge_reg_kernel(const float* __restrict__ scores, int64_t t, int64_t k,
                                                            int64_t g, const int32_t* __restrict__ cand,
                                                            int32_t* __restrict__ out) {
  dev::pdl_enter();
  __shared__ sel::RegShared sh;
  const int64_t r = blockIdx.x, m = g * k;
  const float* row = scores + r * t;
  const int32_t* cr = cand + r * m;
  int32_t* o = out + r * k;
  const int64_t taken = sel::reg_select<KPT, NT>(
      [row, cr](int64_t i) {
        const int32_t j = cr[i];
        return j >= 0 ? row[j] : -INFINITY;
      },
      m, k, sh,
      [o, cr](int64_t i, bool s, int64_t pos) {
        if (s) o[pos] = cr[i];
      });
  for (int64_t j = taken + threadIdx.x; j < k; j += blockDim.x) o[j] = -1;
}

// The register select's launch shape: KPT keys per thread of NT.
template <int K, int N>
struct RegCfg {
  static constexpr int kpt = K, nt = N;
};
int g_reg_threads = -1;  // set_topk_reg_for_tests(2): 512
int reg_threads() {
  static const int env = [] {
    const char* v = std::getenv("DS41_TOPK_REG_THREADS");
    return v != nullptr && std::string(v) == "512" ? 512 : sel::kRegThreads;
  }();
  return g_reg_threads > 0 ? g_reg_threads : env;
}
// f(RegCfg<KPT, NT>) with the smallest KPT whose NT x KPT keys hold m scores (NT = reg_threads(): KPT 4, 8, 16,
// 24, 40 at 256 threads, 2, 4, 8, 12, 20 at 512); false (f not called) past kRegMaxScores.
template <typename F>
bool with_reg_kpt(int64_t m, const F& f) {
  if (m > kRegMaxScores) return false;
  if (reg_threads() == 512) {
    if (m <= 2 * 512) return f(RegCfg<2, 512>{}), true;
    if (m <= 4 * 512) return f(RegCfg<4, 512>{}), true;
    if (m <= 8 * 512) return f(RegCfg<8, 512>{}), true;
    if (m <= 12 * 512) return f(RegCfg<12, 512>{}), true;
    return f(RegCfg<20, 512>{}), true;
  }
  if (m <= 4 * 256) return f(RegCfg<4, 256>{}), true;
  if (m <= 8 * 256) return f(RegCfg<8, 256>{}), true;
  if (m <= 16 * 256) return f(RegCfg<16, 256>{}), true;
  if (m <= 24 * 256) return f(RegCfg<24, 256>{}), true;
  return f(RegCfg<40, 256>{}), true;
}

// bs: the workspace row (written and read here: plain loads, no read-only cache path).
// Block b's score in the pool of a row of t scores (sc) whose last visible block is `forced`: its
// maximum in index order (std::max semantics), +inf for the forced block.
__device__ __forceinline__ float pool_block_score(const float* __restrict__ sc, int64_t t, int64_t block, int64_t b,
                                                  int64_t forced) {
  float m = -INFINITY;
  const int64_t e = min(t, (b + 1) * block);
  for (int64_t i = b * block; i < e; ++i) {
    const float x = sc[i];
    m = m < x ? x : m;  // std::max(m, x)
  }
  return b == forced ? INFINITY : m;
}

// Launch 1 of the two-launch pool (long rows): the block scores of every row into ws by a CTA per
// (row, 256 blocks), where one CTA per row read the whole row itself (at 128K scores, 146 us of one
// SM's loads with a load in flight per thread).
__global__ void candidate_block_scores_kernel(const float* __restrict__ scores, const int64_t* __restrict__ visible,
                                              int64_t t, int64_t block, int64_t tiles, float* __restrict__ ws) {
  dev::pdl_enter();
  const int64_t nb = (t + block - 1) / block;
  const int64_t r = blockIdx.x / tiles, b = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  const int64_t vis = visible[r];
  ws[r * nb + b] = pool_block_score(scores + r * t, t, block, b, vis > 0 ? (vis - 1) / block : -1);
}

// scored: the block scores are in ws already (launch 1); else this CTA computes them.
__global__ void candidate_pool_kernel(const float* __restrict__ scores, const int64_t* __restrict__ visible,
                                      int64_t t, int64_t block, int64_t keep, float* ws,
                                      uint8_t* __restrict__ mask, bool scored) {
  dev::pdl_enter();
  __shared__ sel::SelectShared sh;
  const int64_t r = blockIdx.x;
  const int64_t nb = (t + block - 1) / block;
  const float* sc = scores + r * t;
  float* bs = ws + r * nb;
  uint8_t* mr = mask + r * t;
  const int64_t vis = visible[r];
  const int64_t forced = vis > 0 ? (vis - 1) / block : -1;
  if (!scored)
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) bs[b] = pool_block_score(sc, t, block, b, forced);
  __syncthreads();  // bs is visible to the whole CTA
  auto load = [bs](int64_t b) { return bs[b]; };
  const sel::Threshold th = sel::select_threshold(load, nb, keep, sh);
  sel::select_emit(load, nb, th, sh, [&](int64_t b, bool s, int64_t) {
    const int64_t e = min(t, (b + 1) * block);
    for (int64_t i = b * block; i < e; ++i) mr[i] = s ? 1 : 0;
  });
}

// candidate_pool_kernel with the register select (blocks <= kRegMaxScores, DS41_TOPK_REG): each thread computes
// its KPT blocks' scores in registers (or reads them from ws when launch 1 wrote them), nothing is written to
// the workspace; the same mask bytes.
template <int KPT, int NT>
__global__ void __launch_bounds__(NT)
    candidate_pool_reg_kernel(const float* __restrict__ scores, const int64_t* __restrict__ visible, int64_t t,
                              int64_t block, int64_t keep, const float* __restrict__ ws, uint8_t* __restrict__ mask,
                              bool scored) {
  dev::pdl_enter();
  __shared__ sel::RegShared sh;
  const int64_t r = blockIdx.x;
  const int64_t nb = (t + block - 1) / block;
  const float* sc = scores + r * t;
  const float* bs = ws + r * nb;
  uint8_t* mr = mask + r * t;
  const int64_t vis = visible[r];
  const int64_t forced = vis > 0 ? (vis - 1) / block : -1;
  sel::reg_select<KPT, NT>(
      [&](int64_t b) { return scored ? bs[b] : pool_block_score(sc, t, block, b, forced); }, nb, keep, sh,
      [&](int64_t b, bool s, int64_t) {
        const int64_t e = min(t, (b + 1) * block);
        for (int64_t i = b * block; i < e; ++i) mr[i] = s ? 1 : 0;
      });
}

__global__ void mask_restrict_kernel(float* __restrict__ scores, int64_t t, const uint8_t* __restrict__ mask,
                                     int64_t mask_stride, const int64_t* __restrict__ t_mask, int64_t tiles) {
  dev::pdl_enter();
  const int64_t r = blockIdx.x / tiles;
  const int64_t j = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  if (j >= t) return;
  if (j >= t_mask[r] || mask[r * mask_stride + j] == 0) scores[r * t + j] = -INFINITY;
}

Status check_rows(const char* fn, int64_t n, int64_t t) {
  if (n < 0 || t < 0)
    return invalid_argument(std::string(fn) + ": n " + std::to_string(n) + " / t " + std::to_string(t) +
                            " negative");
  if (n > 0x7fffffff)
    return invalid_argument(std::string(fn) + ": n " + std::to_string(n) + " rows too many for one grid");
  if (t > 0x7fffffff)
    return invalid_argument(std::string(fn) + ": t " + std::to_string(t) + " exceeds int32 indices");
  return ok_status();
}

// The two-launch path: rows of more than kChunkedMinScores scores in calls of at most
// kChunkedMaxRows rows (larger calls have a CTA per row to fill the GPU), g chunks of at least
// kMinChunk scores with g x k candidates and each chunk within the cached size; else g = 1 (one
// launch). DS41_TOPK_CHUNKS=0: always one launch (A/B measurements).
constexpr int64_t kChunkedMinScores = 12288, kChunkedMaxRows = 64, kMinChunk = 2048;
struct Chunks {
  int64_t g = 1, chunk = 0;
};
Chunks chunks_for(int64_t n, int64_t t, int64_t k) {
  static const bool allowed = switch_on("DS41_TOPK_CHUNKS");
  Chunks c;
  if (!allowed || n > kChunkedMaxRows || t <= kChunkedMinScores || k <= 0 || k > kMaxCachedScores / 2) return c;
  const int64_t g = std::min(kMaxCachedScores / k, (t + kMinChunk - 1) / kMinChunk);
  const int64_t chunk = (t + g - 1) / g;
  if (g < 2 || chunk > kMaxCachedScores) return c;
  c.g = g;
  c.chunk = chunk;
  return c;
}

// DS41_TOPK_WIDE=0: the four-pass select (A/B measurements); tests may force either.
int g_wide = -1;
bool wide_on() {
  static const bool env = switch_on("DS41_TOPK_WIDE");
  return g_wide >= 0 ? g_wide != 0 : env;
}

// DS41_TOPK_REG=0: the radix selects (wide / four-pass) for every row; tests may force either.
int g_reg = -1;
bool reg_on() {
  static const bool env = switch_on("DS41_TOPK_REG");
  return g_reg >= 0 ? g_reg != 0 : env;
}

// The register select's row limit: calls of at most this many rows take it (default kChunkedMaxRows: decode steps,
// drafts, verifications, what was timed). DS41_TOPK_REG_ROWS=N moves the limit (prefill A/B measurements).
int64_t reg_max_rows() {
  static const int64_t env = [] {
    const char* v = std::getenv("DS41_TOPK_REG_ROWS");
    if (v == nullptr || *v == '\0') return kChunkedMaxRows;
    char* end = nullptr;
    const long long r = std::strtoll(v, &end, 10);
    return end != nullptr && *end == '\0' && r >= 0 ? static_cast<int64_t>(r) : kChunkedMaxRows;
  }();
  return env;
}

// DS41_TOPK_EMIT_RUNS=1: the emit of rows in shared memory with one barrier (sel::select_emit_runs) instead of
// two per blockDim scores. Opt-in: written without a device (session of 2026-12-07 00:38 UTC), not yet timed;
// the same outputs either way (SelectionParity runs both).
int g_runs = -1;
bool runs_on() {
  static const bool env = switch_opt_in("DS41_TOPK_EMIT_RUNS");
  return g_runs >= 0 ? g_runs != 0 : env;
}

// The wide kernels' static shared memory (sel::WideShared, ~18 KB) and a cached row of up to
// kMaxCachedScores floats exceed the 48 KB a block gets without opting in.
template <typename K>
void allow_cached_row(K kernel) {
  cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(kMaxCachedScores * sizeof(float)));
}
void allow_wide_once() {
  static const bool once = [] {
    allow_cached_row(topk_rows_kernel<true>);
    allow_cached_row(topk_chunks_kernel<true>);
    allow_cached_row(topk_merge_kernel<true>);
    return true;
  }();
  (void)once;
}

}  // namespace

void set_topk_wide_for_tests(int wide) { g_wide = wide < 0 ? -1 : (wide ? 1 : 0); }
void set_topk_emit_runs_for_tests(int runs) { g_runs = runs < 0 ? -1 : (runs ? 1 : 0); }
void set_topk_reg_for_tests(int reg) {
  g_reg = reg < 0 ? -1 : (reg ? 1 : 0);
  g_reg_threads = reg == 2 ? 512 : (reg == 1 ? 256 : -1);
}

size_t topk_workspace_bytes(int64_t n, int64_t t, int64_t k) {
  const Chunks c = chunks_for(std::min(n, kChunkedMaxRows), t, k);
  return c.g > 1 ? static_cast<size_t>(std::min(n, kChunkedMaxRows) * c.g * k) * sizeof(int32_t) : 0;
}

Status run_topk_rows(const float* scores, int64_t n, int64_t t, int64_t k, int32_t* out, void* workspace,
                     cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("topk_rows", n, t));
  if (k < 0) return invalid_argument("topk_rows: k " + std::to_string(k) + " is negative");
  if (n == 0 || k == 0) return ok_status();
  if (!out || (t > 0 && !scores)) return invalid_argument("topk_rows: null scores or out");
  // DS41_TOPK_CACHE=0 reads the row from global memory in every pass (A/B measurements). 1024
  // threads below 8192 scores measured slower on the H200 (2048 scores: 28.6 against 16.8 us).
  const Chunks ch = chunks_for(n, t, k);
  const bool wide = wide_on();
  if (wide) allow_wide_once();
  // The register select for calls of at most kChunkedMaxRows rows (decode steps, drafts, verifications: timed);
  // prefill-shaped calls keep the radix selects until the prefill is timed with it.
  const bool reg = reg_on() && n <= reg_max_rows();
  if (ch.g > 1) {
    if (!workspace) return invalid_argument("topk_rows: the chunked path needs topk_workspace_bytes of workspace");
    int32_t* cand = static_cast<int32_t*>(workspace);
    if (reg && ch.chunk <= kRegMaxScores && ch.g * k <= kRegMaxScores) {
      with_reg_kpt(ch.chunk, [&](auto c) {
        launch(topk_chunks_reg_kernel<decltype(c)::kpt, decltype(c)::nt>, dim3(static_cast<unsigned>(ch.g), static_cast<unsigned>(n)),
               decltype(c)::nt, 0, stream, scores, t, k, ch.chunk, cand);
      });
      DS41_RETURN_IF_ERROR(last_launch_status("topk_rows (chunks)"));
      with_reg_kpt(ch.g * k, [&](auto c) {
        launch(topk_merge_reg_kernel<decltype(c)::kpt, decltype(c)::nt>, static_cast<unsigned>(n), decltype(c)::nt, 0, stream, scores,
               t, k, ch.g, static_cast<const int32_t*>(cand), out);
      });
      return last_launch_status("topk_rows (merge)");
    }
    launch(wide ? topk_chunks_kernel<true> : topk_chunks_kernel<false>, dim3(static_cast<unsigned>(ch.g), static_cast<unsigned>(n)), threads_for(ch.chunk),
           static_cast<size_t>(ch.chunk) * sizeof(float), stream, scores, t, k, ch.chunk, cand, runs_on());
    DS41_RETURN_IF_ERROR(last_launch_status("topk_rows (chunks)"));
    launch(wide ? topk_merge_kernel<true> : topk_merge_kernel<false>, static_cast<unsigned>(n), threads_for(ch.g * k),
           static_cast<size_t>(ch.g * k) * sizeof(float), stream, scores, t, k, ch.g,
           static_cast<const int32_t*>(cand), out, runs_on());
    return last_launch_status("topk_rows (merge)");
  }
  if (reg && with_reg_kpt(t, [&](auto c) {
        launch(topk_rows_reg_kernel<decltype(c)::kpt, decltype(c)::nt>, static_cast<unsigned>(n), decltype(c)::nt, 0, stream, scores,
               t, k, out);
      }))
    return last_launch_status("topk_rows");
  static const bool cache_allowed = switch_on("DS41_TOPK_CACHE");
  const bool cached = cache_allowed && t <= kMaxCachedScores;
  const int threads = threads_for(t);
  launch(wide ? topk_rows_kernel<true> : topk_rows_kernel<false>, static_cast<unsigned>(n), threads, cached ? static_cast<size_t>(t) * sizeof(float) : 0,
         stream, scores, t, k, out, cached, cached && runs_on());
  return last_launch_status("topk_rows");
}

size_t candidate_pool_workspace_bytes(int64_t n, int64_t t, int64_t block, int64_t keep_blocks) {
  if (n <= 0 || t <= 0 || block <= 0) return 0;
  return static_cast<size_t>(n) * static_cast<size_t>((t + block - 1) / block) * sizeof(float);
}

Status run_candidate_pool(const float* scores, const int64_t* visible, int64_t n, int64_t t, int64_t block,
                          int64_t keep_blocks, uint8_t* mask, void* workspace, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("candidate_pool", n, t));
  if (block <= 0)
    return invalid_argument("candidate_pool: block " + std::to_string(block) + " must be positive");
  if (keep_blocks < 0)
    return invalid_argument("candidate_pool: keep_blocks " + std::to_string(keep_blocks) + " is negative");
  if (n == 0 || t == 0) return ok_status();
  if (!scores || !visible || !mask || !workspace)
    return invalid_argument("candidate_pool: null scores, visible, mask or workspace");
  const int64_t nb = (t + block - 1) / block;
  // Long rows in calls of at most kChunkedMaxRows rows (as the top-k): the block scores by many CTAs
  // first (the same values: the same function per block). DS41_POOL_SPLIT=0: one launch.
  static const bool split_allowed = switch_on("DS41_POOL_SPLIT");
  const bool split = split_allowed && n <= kChunkedMaxRows && t > kChunkedMinScores;
  float* ws = static_cast<float*>(workspace);
  if (split) {
    constexpr int kScoreThreads = 256;
    const int64_t tiles = (nb + kScoreThreads - 1) / kScoreThreads;
    launch(candidate_block_scores_kernel, static_cast<unsigned>(n * tiles), kScoreThreads, 0, stream, scores, visible,
           t, block, tiles, ws);
    DS41_RETURN_IF_ERROR(last_launch_status("candidate_pool (block scores)"));
  }
  if (reg_on() && n <= reg_max_rows() && with_reg_kpt(nb, [&](auto c) {
        launch(candidate_pool_reg_kernel<decltype(c)::kpt, decltype(c)::nt>, static_cast<unsigned>(n), decltype(c)::nt, 0, stream,
               scores, visible, t, block, keep_blocks, static_cast<const float*>(ws), mask, split);
      }))
    return last_launch_status("candidate_pool");
  launch(candidate_pool_kernel, static_cast<unsigned>(n), threads_for(nb), 0, stream, scores, visible, t, block,
         keep_blocks, ws, mask, split);
  return last_launch_status("candidate_pool");
}

Status run_mask_restrict(float* scores, int64_t n, int64_t t, const uint8_t* mask, int64_t mask_stride,
                         const int64_t* t_mask, cudaStream_t stream) {
  DS41_RETURN_IF_ERROR(check_rows("mask_restrict", n, t));
  if (mask_stride < 0)
    return invalid_argument("mask_restrict: mask_stride " + std::to_string(mask_stride) + " is negative");
  if (n == 0 || t == 0) return ok_status();
  if (!scores || !t_mask || !mask) return invalid_argument("mask_restrict: null scores, mask or t_mask");
  constexpr int kThreads = 256;
  const int64_t tiles = (t + kThreads - 1) / kThreads;
  if (n * tiles > 0x7fffffff) return invalid_argument("mask_restrict: n x t too large for one grid");
  launch(mask_restrict_kernel, static_cast<unsigned>(n * tiles), kThreads, 0, stream, scores, t, mask,
                                                                                  mask_stride, t_mask, tiles);
  return last_launch_status("mask_restrict");
}

}  // namespace ds41::cuda
