// ds41 backends/cuda: the grouped FP4 expert GEMM of prefill (expert_gemm_kernels.h has the contract and
// the numerics).
//
// The GEMM (expert_gemm_fp4_kernel): a block of 8 warps owns 128 W rows of one expert's matrix (grid x)
// and one unit of <= 32 routed rows (grid y; the second matrix of a pair: grid z): 3 parts x 32 rows = 96 B
// columns in 12 column tiles. Warp (wm, wn) owns W rows [32 wm, 32 wm + 32) (two mma row tiles) and column
// tiles [6 wn, 6 wn + 6): 48 fp32 accumulators per lane, 127 registers, two blocks per SM. K streams
// through a 3-stage cp.async pipeline in steps of 4 K tiles (128 K): a stage holds the unit's B fragments
// of the step as the decode GEMV stages x ([tile][mma][column][lane group] of 4 f16: one conflict-free
// 8-byte load per fragment), the 128 W rows' 64 bytes of E2M1 codes (rows 80 bytes apart: a lane's word g
// of each tile is a conflict-free 4-byte load, the fragments' order without the quad transpose) and each
// row's four scale bytes (one word). Per tile, a lane decodes the 8 codes of each of its 4 rows once
// (fp4_row_pairs) and multiplies them with every valid column tile of its warp. By default a step is folded
// ("The step fold" below: the weights of tile j times 2^(s_j - s_min), one chain of 8 mmas from zero, then acc =
// fma(d, 2^(s_min - 127), acc)); a warp with a row whose step spans more than 15 binades takes the per-tile form
// (2 mmas from zero, then acc = fma(d, 2^(scale - 127), acc)) for that step. The epilogue meets the three parts' accumulators in shared memory
// and writes y = (hi + (lo + lo2)) 2^(e + 14) row by row (the decode GEMV's block_rows, one K split).
//
// Grid order: the W row blocks of a unit are the fastest (a unit's parts, <= 983 KB at K = 5120, stay in
// L2 while its 18-40 blocks read them) and the units of an expert are adjacent (its W rows are read by
// them at about the same time: L2 hits rather than a second HBM pass).
#include "backends/cuda/expert_gemm_kernels.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/tc_frag.cuh"
#include "backends/cuda/wgmma.cuh"

namespace ds41::cuda {
namespace {

using tcg::fp4_row_pairs;
using tcg::mma_16816;

struct Fp4Order {  // the K order of fp4_row_pairs' fragments, for tcg::stage_fragments
  __host__ __device__ static constexpr int kofs(int m, int s) { return tcg::fp4_kofs(m, s); }
};

// The block's warps: 4 groups of 32 W rows x WN groups of 12 / WN column tiles. WN = 1 (the default): 4
// warps of 12 column tiles, 96 accumulators a lane, 238 registers folded in column-tile pairs (227 tile by tile,
// 207 unfolded), 8 warps per SM
// (ncu on the H200, folded: a warp issues every 5.7 cycles, the tensor pipe 32 % busy, 207 TFLOP/s of MMA work
// for the pair at chunk 4096; 167 unfolded on the H100). WN = 2 (DS41_TC_FP4_GEMM_WARPS8=1): 8 warps of 6 column
// tiles, 48 accumulators, 127 registers unfolded, 16 warps per SM; folded it reads its B fragments once per row
// tile (both at once spill). On the H200 (prefill, 32K / 4096, forced): 4 warps 9,339 tok/s, folded 10,557; 8
// warps 10,130, folded 9,492: the default is 4 warps folded (docs/perf, session of 2026-12-06 21:19 UTC).
constexpr int kWarpsM = 4;
constexpr int kRowsPerWarp = 32, kRowsPerBlock = kWarpsM * kRowsPerWarp;  // W rows
constexpr int kJ = 3 * kExpertGemmRows;                                  // B columns of a unit
constexpr int kNT = kJ / 8;                                               // column tiles
template <int WN>
struct Layout {
  static constexpr int kThreads = 32 * kWarpsM * WN;
  static constexpr int kNTW = kNT / WN;        // column tiles of a warp
  static constexpr int kXWarps = 3 * WN;       // warps copying B fragments: 48 pieces per row, kXRows rows a round
  static constexpr int kXRows = 2 * WN;
  static constexpr int kWThreads = 32 * WN;    // the other warps' threads copy the W rows
};
constexpr int kStepTiles = 4;                                            // K tiles (of 32) per stage
constexpr int kStages = 3;
constexpr int kXStageU2 = kStepTiles * 2 * kJ * 4;        // B fragments of a stage (uint2): 24 KB
constexpr int kWRowStride = kStepTiles * 16 + 16;         // a W row's 64 bytes, 16 of pad
constexpr int kWStageBytes = kRowsPerBlock * kWRowStride;  // 10 KB
constexpr int kSStageBytes = kRowsPerBlock * 4;            // each row's 4 scale bytes
constexpr int kStageBytes = kXStageU2 * 8 + kWStageBytes + kSStageBytes;
constexpr int kSmem = kStages * kStageBytes;  // ~104 KB: two blocks per SM
constexpr int kRedFloats = kWarpsM * 2 * kNT * 4 * 32;  // any WN: warps x column tiles of a warp = 4 x 12
static_assert(kRedFloats * 4 <= kSmem, "the epilogue's accumulators reuse the stages");
constexpr int kSplitThreads = 128;
int warps8_for_tests = -1;  // set_expert_gemm_warps8_for_tests
int fold_for_tests = -1;    // set_expert_gemm_fold_for_tests
int group_for_tests = 0;     // set_expert_gemm_group_for_tests
constexpr int64_t kMaxIn = 16384;  // K of a call (the loader's per-row offsets are int)

// ---- The split: one block per routed row ----
// The decode GEMV's staging (tc_gemv_kernels.cu stage_x) of one row: e = ilogb(max |x|) - 14 (0 for a
// zero or non-finite maximum), x' = x 2^-e as one or two exact power-of-two products, three f16 parts of
// each x' (hi, the rounded rest, the rounded rest of that), in B fragment order: the lane group g of tile
// t holds K 8g .. 8g + 7, slot s of mma m being K 8g + fp4_kofs(m, s).
// kP = 1 (one part: inputs exact in f16 after the row's power of two, --numerics fp8-act's quantized rows):
// the hi part alone, 8 bytes per K.
// kWg: the wgmma form's layout (expert_gemm_kernels.h): a (tile, mma, part)'s four lane groups as their four b0
// words, then their four b1 words (each 16-byte half one core-matrix row of B: wgmma.cuh).
template <int kP, bool kWg = false>
__global__ void __launch_bounds__(kSplitThreads)
    expert_gemm_split_kernel(const float* __restrict__ x, int64_t in, const int64_t* __restrict__ rows_of,
                             uint2* __restrict__ parts, int32_t* __restrict__ ex) {
  dev::pdl_enter();
  __shared__ float red[kSplitThreads / 32];
  __shared__ float inv_s[2];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t i = blockIdx.x;
  const float4* xr = reinterpret_cast<const float4*>(x + (rows_of ? rows_of[i] : i) * in);
  const int q4 = static_cast<int>(in / 4), units = static_cast<int>(in / 8);
  float m = 0.f;
  for (int q = tid; q < q4; q += kSplitThreads) {
    const float4 v = __ldg(xr + q);
    m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (tid == 0) {
    float mx = 0.f;
    for (int w = 0; w < kSplitThreads / 32; ++w) mx = fmaxf(mx, red[w]);
    const int e = tcg::stage_exponent(mx);
    ex[i] = e;
    tcg::stage_factors(e, inv_s[0], inv_s[1]);
  }
  __syncthreads();
  const float i0f = inv_s[0], i1f = inv_s[1];
  uint2* pr = parts + i * (in / 32) * (8 * kP);
  for (int u = tid; u < units; u += kSplitThreads) {
    const int t = u >> 2, g = u & 3;
    const float4 v0 = __ldg(xr + 8 * t + 2 * g), v1 = __ldg(xr + 8 * t + 2 * g + 1);
    const float f[8] = {v0.x * i0f * i1f, v0.y * i0f * i1f, v0.z * i0f * i1f, v0.w * i0f * i1f,
                        v1.x * i0f * i1f, v1.y * i0f * i1f, v1.z * i0f * i1f, v1.w * i0f * i1f};
    uint2 fr[2][3];
    tcg::stage_fragments<false, Fp4Order>(f, fr);
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
      for (int p = 0; p < kP; ++p) {
        if constexpr (kWg) {
          uint32_t* const q = reinterpret_cast<uint32_t*>(pr + ((t * 2 + mm) * kP + p) * 4);
          q[g] = fr[mm][p].x;
          q[4 + g] = fr[mm][p].y;
        } else {
          pr[((t * 2 + mm) * kP + p) * 4 + g] = fr[mm][p];
        }
      }
  }
}

// ---- The step fold (kFold) ----
// A step's four tiles of a W row carry scale bytes s_0..s_3; with s_min their least and every s_j - s_min <= 15,
// the row's decoded f16 weights of tile j times 2^(s_j - s_min) are exact (a power of two, the f16 exponent field
// 0..3 of a decoded E2M1 value plus at most 15: normal; the subnormal 0.5 becomes a normal, zero stays zero), so
// ONE mma chain over the step's 128 K gives sum_j 2^(s_j - s_min) t_j (t_j: tile j's sum) and one fma with
// 2^(s_min - 127) adds the step to the accumulator: the same terms as the per-tile fmas, summed in another order
// (every product stays exact in fp32: |a| <= 6 * 2^1, |x'| < 2^15; the least nonzero product 2^-15 * 2^-24 is
// normal). A quarter of the fmas, and each waits on one chain of 8 mmas instead of 2: +13 % prefill at 32K /
// 4096 and +14 % at 8K / 2048 on the H200 (the GEMM's pair 207 TFLOP/s against 167 unfolded on the H100).
// DS41_TC_FP4_GEMM_FOLD=0 turns it off (A/B runs).
__device__ __forceinline__ uint32_t byte_min(uint32_t v) {  // the least of v's four bytes
#if defined(__CUDA_ARCH__)
  const uint32_t t = __vminu4(v, v >> 16);
  return __vminu4(t, t >> 8) & 0xffu;
#else
  uint32_t m = v & 0xffu;
  for (int i = 1; i < 4; ++i) m = std::min(m, (v >> (8 * i)) & 0xffu);
  return m;
#endif
}
// Every byte of v (all >= mn, mn >= 64: the window) within mn + 15: v - (mn - 15) per byte (no borrow) is 15 +
// s_j - mn, <= 30 iff + 97 keeps bit 7 clear (<= 142 + 97 < 256: no carry).
__device__ __forceinline__ bool spread_within_15(uint32_t v, uint32_t mn) {
  return (((v - (mn - 15u) * 0x01010101u) + 0x61616161u) & 0x80808080u) == 0u;
}
// f16x2 (2^(s_j - mn), 2^(s_j - mn)): the exponent field 15 + s_j - mn in both halves.
__device__ __forceinline__ uint32_t fold_factor(uint32_t v, uint32_t mn, int j) {
  return (((v >> (8 * j)) & 0xffu) + 15u - mn) * 0x04000400u;
}
// f16x2 a * f, round to nearest (exact here: f a power of two, no overflow).
__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t f) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(f));
  return d;
#else
  const float lo = tcg::part_float<false>(a) * tcg::part_float<false>(f);
  const float hi = tcg::part_float<false>(a >> 16) * tcg::part_float<false>(f >> 16);
  return tcg::part_bits<false>(lo) | (tcg::part_bits<false>(hi) << 16);
#endif
}

// ---- The scale check ----
// Per word of four scale bytes (one W row's step: tiles % 4 == 0): the bytes outside the window; with wide, the
// words whose bytes span more than 15 (a step the fold cannot take: the wgmma form's contract).
__global__ void scales_outside_window_kernel(const DeviceWeight* __restrict__ weights, int64_t words,
                                             int32_t* __restrict__ count, int32_t* __restrict__ wide) {
  dev::pdl_enter();
  const uint32_t* sc = reinterpret_cast<const uint32_t*>(weights[blockIdx.y].scale);
  int bad = 0, spread = 0;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < words;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t v = __ldg(sc + q);
#pragma unroll
    for (int i = 0; i < 4; ++i) bad += tcg::scale_fast((v >> (8 * i)) & 0xffu) ? 0 : 1;
    spread += spread_within_15(v, byte_min(v)) ? 0 : 1;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
    spread += __shfl_xor_sync(0xffffffffu, spread, o);
  }
  if ((threadIdx.x & 31) == 0) {
    if (bad != 0) atomicAdd(count, bad);
    if (wide != nullptr && spread != 0) atomicAdd(wide, spread);
  }
}

// ---- Shared by both forms ----
// A block's unit, its expert's matrix (grid z: the pair's second) and that matrix's output.
struct UnitOperands {
  ExpertGemmUnit u;
  DeviceWeight w;
  float* out;
};
__device__ __forceinline__ UnitOperands unit_operands(const DeviceWeight* __restrict__ weights,
                                                      const DeviceWeight* __restrict__ weights2,
                                                      const ExpertGemmUnit* __restrict__ units, float* y, float* y2) {
  const ExpertGemmUnit u = units[blockIdx.y];
  const bool second = blockIdx.z != 0;
  return UnitOperands{u, (second ? weights2 : weights)[u.expert], second ? y2 : y};
}
// A chain's m16n8 tile t into the accumulators: row r's entries (0, 1) times m0, row r + 8's (2, 3) times m1.
__device__ __forceinline__ void fold_tile(float* __restrict__ ac, const float* __restrict__ t, float m0, float m1) {
  ac[0] = __fmaf_rn(t[0], m0, ac[0]);
  ac[1] = __fmaf_rn(t[1], m0, ac[1]);
  ac[2] = __fmaf_rn(t[2], m1, ac[2]);
  ac[3] = __fmaf_rn(t[3], m1, ac[3]);
}
// A routed row's output from its parts: hi + (lo + lo2) (or the one part) times 2^(e + 14).
template <int kP>
__device__ __forceinline__ float parts_output(const float (&part)[kP], int32_t e) {
  float sum = part[0];
  if constexpr (kP == 3) sum = part[0] + (part[1] + part[2]);
  return scalbnf(sum, e + 14);
}

// ---- The GEMM ----
struct Stage {
  uint2* xs;     // [tile][mma][column][lane group]
  uint8_t* ws;   // W rows, kWRowStride apart
  uint8_t* ss;   // scale words, one per row
  __device__ explicit Stage(uint8_t* base)
      : xs(reinterpret_cast<uint2*>(base)), ws(base + kXStageU2 * 8), ss(base + kXStageU2 * 8 + kWStageBytes) {}
};

// kP: the parts per routed row (3, or 1 with kExpertGemmRows1 rows a unit: expert_gemm_kernels.h); a routed
// row b's parts are B columns kP b .. kP b + kP - 1.
template <int WN, bool kFold, int kCG, int kP = 3>
__global__ void __launch_bounds__(Layout<WN>::kThreads, 2)
    expert_gemm_fp4_kernel(const DeviceWeight* __restrict__ weights, const DeviceWeight* __restrict__ weights2,
                           const ExpertGemmUnit* __restrict__ units, int64_t out_dim, int64_t in,
                           const uint2* __restrict__ parts, const int32_t* __restrict__ ex, float* __restrict__ y,
                           float* __restrict__ y2) {
  extern __shared__ __align__(16) float smem[];  // the host emulator's rewrite expects this spelling
  uint8_t* const sm = reinterpret_cast<uint8_t*>(smem);
  dev::pdl_enter();
  using L = Layout<WN>;
  constexpr int kThreads = L::kThreads, kNTW = L::kNTW;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, g = lane & 3;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;  // the warp's W rows and column tiles
  const UnitOperands uo = unit_operands(weights, weights2, units, y, y2);
  const ExpertGemmUnit u = uo.u;
  const DeviceWeight w = uo.w;
  float* __restrict__ out = uo.out;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int tiles = static_cast<int>(in / 32), steps = tiles / kStepTiles;
  const int nrows = u.rows, nt = (kP * nrows + 7) / 8;
  const int64_t half_in = in / 2;
  const uint2* __restrict__ xp = parts + static_cast<int64_t>(u.row0) * tiles * (8 * kP);

  // Step k into stage slot: the unit's B fragments of tiles [4k, 4k + 4) (a row's step is 768 contiguous
  // bytes of parts: 48 pieces of 16, piece q = (tile * 2 + mma) * 6 + c landing at (tile * 2 + mma) * 3072 +
  // 96 b + 16 c in the stage), the block's W rows (rows past out_dim read the last row: their outputs are not
  // written) and their scale words. The copies a thread issues are fixed at the start: warps [0, 3 WN) copy
  // the B fragments (thread t: piece t % 48 of rows t / 48, + 2 WN, ...), the last WN warps the W rows
  // (thread l of them: rows l + 32 WN i, four pieces each) and their scale words. One cp.async group per
  // thread and call.
  // (kP parts: a row's step is 256 kP bytes, 16 kP pieces, piece q = (tile * 2 + mma) * 2 kP + c at
  // (tile * 2 + mma) * 3072 + 32 kP b + 16 c; 6 WN / kP rows a round.)
  constexpr int kPieces = 16 * kP, kXRowsP = 6 * WN / kP;
  const int64_t row_bytes = static_cast<int64_t>(tiles) * 64 * kP;
  const int xq = tid % kPieces, xb0 = tid / kPieces;
  const int x_soff = (xq / (2 * kP)) * (kJ * 32) + (xq % (2 * kP)) * 16;
  const uint8_t* const x_g = reinterpret_cast<const uint8_t*>(xp) + xb0 * row_bytes + xq * 16;
  auto load = [&](int slot, int k) {
    uint8_t* const base = sm + slot * kStageBytes;
    if (warp < L::kXWarps) {
      const uint8_t* src = x_g + k * (kStepTiles * 64 * kP);
      for (int b = xb0; b < nrows; b += kXRowsP, src += kXRowsP * row_bytes)
        dev::cp_async16(base + x_soff + 32 * kP * b, src);
    } else {
      const Stage st(base);
#pragma unroll
      for (int i = 0; i < kRowsPerBlock / L::kWThreads; ++i) {
        const int row = tid - 32 * L::kXWarps + L::kWThreads * i;
        const int64_t o = min(o0 + row, out_dim - 1);
        const uint8_t* src = w.data + o * half_in + k * (kStepTiles * 16);
#pragma unroll
        for (int j = 0; j < kStepTiles; ++j) dev::cp_async16(st.ws + row * kWRowStride + 16 * j, src + 16 * j);
        dev::cp_async4(st.ss + 4 * row, w.scale + o * tiles + k * kStepTiles);
      }
    }
    dev::cp_async_commit();
  };

  float acc[2][kNTW][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int c = 0; c < kNTW; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][c][i] = 0.f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps)
      load(s, s);
    else
      dev::cp_async_commit();
  }
  const int row_a = wm * kRowsPerWarp + r;  // the lane's rows: row_a + 16 mt (+ 8)
  for (int k = 0; k < steps; ++k) {
    dev::cp_async_wait<kStages - 2>();  // this thread's copies of step k have landed
    __syncthreads();                    // everyone's, and everyone is done with step k - 1's stage
    if (k + kStages - 1 < steps)
      load((k + kStages - 1) % kStages, k + kStages - 1);
    else
      dev::cp_async_commit();
    const Stage st(sm + (k % kStages) * kStageBytes);
    uint32_t wa[2][kStepTiles], wb[2][kStepTiles], sa[2], sb[2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const uint8_t* pa = st.ws + (row_a + 16 * mt) * kWRowStride + 4 * g;
      const uint8_t* pb = pa + 8 * kWRowStride;
#pragma unroll
      for (int j = 0; j < kStepTiles; ++j) {
        wa[mt][j] = *reinterpret_cast<const uint32_t*>(pa + 16 * j);
        wb[mt][j] = *reinterpret_cast<const uint32_t*>(pb + 16 * j);
      }
      sa[mt] = *reinterpret_cast<const uint32_t*>(st.ss + 4 * (row_a + 16 * mt));
      sb[mt] = *reinterpret_cast<const uint32_t*>(st.ss + 4 * (row_a + 16 * mt + 8));
    }
    // The fold (kFold, "The step fold" above): when every row of the warp has its step's four scale bytes within
    // 15 of their minimum, one mma chain per output covers the step; else the per-tile products.
    uint32_t mn_a[2], mn_b[2];
    bool narrow = kFold;
    if constexpr (kFold) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        mn_a[mt] = byte_min(sa[mt]);
        mn_b[mt] = byte_min(sb[mt]);
        narrow = narrow && spread_within_15(sa[mt], mn_a[mt]) && spread_within_15(sb[mt], mn_b[mt]);
      }
      narrow = __all_sync(0xffffffffu, narrow);
    }
    if (kFold && narrow) {
      // The row tiles decoded at once: both with 4 warps (227 registers), one at a time with 8 (which then reads
      // its B fragments twice: both at once spill under the 128-register bound).
      constexpr int kMtPer = WN == 1 ? 2 : 1;
#pragma unroll
      for (int mq = 0; mq < 2; mq += kMtPer) {
        uint32_t a[kStepTiles][kMtPer][8];  // [tile][row tile]: a0 (4 registers), a1 (4), times 2^(s_j - s_min)
        float m0[kMtPer], m1[kMtPer];
#pragma unroll
        for (int q = 0; q < kMtPer; ++q) {
          const int mt = mq + q;
#pragma unroll
          for (int j = 0; j < kStepTiles; ++j) {
            uint32_t pa[4], pb[4];
            fp4_row_pairs(wa[mt][j], pa);
            fp4_row_pairs(wb[mt][j], pb);
            const uint32_t fa = fold_factor(sa[mt], mn_a[mt], j), fb = fold_factor(sb[mt], mn_b[mt], j);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              a[j][q][4 * h + 0] = hmul2_bits(pa[2 * h], fa);
              a[j][q][4 * h + 1] = hmul2_bits(pb[2 * h], fb);
              a[j][q][4 * h + 2] = hmul2_bits(pa[2 * h + 1], fa);
              a[j][q][4 * h + 3] = hmul2_bits(pb[2 * h + 1], fb);
            }
          }
          m0[q] = __uint_as_float(mn_a[mt] << 23);  // 2^(s_min - 127)
          m1[q] = __uint_as_float(mn_b[mt] << 23);
        }
        const uint2* xb = st.xs + (kNTW * 8 * wn + r) * 4 + g;
        // kCG = 1 (DS41_TC_FP4_GEMM_CG=1): column tile by column tile, each valid one's kMtPer chains of 8 mmas in
        // turn (a branch per tile). kCG > 1 (the default 2 with 4 warps): column tiles in groups of kCG; a group
        // runs when its first tile holds columns of the unit (the rest may multiply stale fragments into
        // accumulators the epilogue never reads), with no branch inside, so its kCG x kMtPer chains interleave
        // tile by tile. H100, prefill 8K / 2048: groups of 2 10,690 tok/s, of 4 10,638, tile by tile 10,105-10,139.
        if constexpr (kCG == 1) {
#pragma unroll
          for (int c = 0; c < kNTW; ++c) {
            if (kNTW * wn + c < nt) {
              uint2 bf[kStepTiles][2];
#pragma unroll
              for (int j = 0; j < kStepTiles; ++j) {
                bf[j][0] = xb[(j * 2) * kJ * 4 + c * 32];
                bf[j][1] = xb[(j * 2 + 1) * kJ * 4 + c * 32];
              }
#pragma unroll
              for (int q = 0; q < kMtPer; ++q) {
                float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int j = 0; j < kStepTiles; ++j) {
                  const uint32_t a0[4] = {a[j][q][0], a[j][q][1], a[j][q][2], a[j][q][3]};
                  const uint32_t a1[4] = {a[j][q][4], a[j][q][5], a[j][q][6], a[j][q][7]};
                  mma_16816<false>(d, a0, bf[j][0].x, bf[j][0].y);
                  mma_16816<false>(d, a1, bf[j][1].x, bf[j][1].y);
                }
                fold_tile(acc[mq + q][c], d, m0[q], m1[q]);
              }
            }
          }
        } else {
#pragma unroll
          for (int cg = 0; cg < kNTW; cg += kCG) {
            if (kNTW * wn + cg < nt) {
              float d[kCG][kMtPer][4];
#pragma unroll
              for (int ci = 0; ci < kCG; ++ci)
#pragma unroll
                for (int q = 0; q < kMtPer; ++q)
#pragma unroll
                  for (int i = 0; i < 4; ++i) d[ci][q][i] = 0.f;
#pragma unroll
              for (int j = 0; j < kStepTiles; ++j) {
#pragma unroll
                for (int ci = 0; ci < kCG; ++ci) {
                  const uint2 b0 = xb[(j * 2) * kJ * 4 + (cg + ci) * 32], b1 = xb[(j * 2 + 1) * kJ * 4 + (cg + ci) * 32];
#pragma unroll
                  for (int q = 0; q < kMtPer; ++q) {
                    const uint32_t a0[4] = {a[j][q][0], a[j][q][1], a[j][q][2], a[j][q][3]};
                    const uint32_t a1[4] = {a[j][q][4], a[j][q][5], a[j][q][6], a[j][q][7]};
                    mma_16816<false>(d[ci][q], a0, b0.x, b0.y);
                    mma_16816<false>(d[ci][q], a1, b1.x, b1.y);
                  }
                }
              }
#pragma unroll
              for (int ci = 0; ci < kCG; ++ci)
#pragma unroll
                for (int q = 0; q < kMtPer; ++q) {
                  fold_tile(acc[mq + q][cg + ci], d[ci][q], m0[q], m1[q]);
                }
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kStepTiles; ++j) {
        uint32_t a0[2][4], a1[2][4];
        float m0[2], m1[2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          uint32_t pa[4], pb[4];
          fp4_row_pairs(wa[mt][j], pa);
          fp4_row_pairs(wb[mt][j], pb);
          a0[mt][0] = pa[0];
          a0[mt][1] = pb[0];
          a0[mt][2] = pa[1];
          a0[mt][3] = pb[1];
          a1[mt][0] = pa[2];
          a1[mt][1] = pb[2];
          a1[mt][2] = pa[3];
          a1[mt][3] = pb[3];
          // 2^(scale - 127): the float with exponent bits = the scale byte (in the window: normal).
          m0[mt] = __uint_as_float(((sa[mt] >> (8 * j)) & 0xffu) << 23);
          m1[mt] = __uint_as_float(((sb[mt] >> (8 * j)) & 0xffu) << 23);
        }
        // Column tile c's fragments: column 8c + r (columns past the unit's 3 nrows read stale values:
        // their D columns are never read, and a D column depends on its own B column only).
        const uint2* xb = st.xs + ((j * 2) * kJ + kNTW * 8 * wn + r) * 4 + g;
#pragma unroll
        for (int c = 0; c < kNTW; ++c) {
          if (kNTW * wn + c < nt) {
            const uint2 b0 = xb[c * 32], b1 = xb[c * 32 + kJ * 4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              float d[4] = {0.f, 0.f, 0.f, 0.f};
              mma_16816<false>(d, a0[mt], b0.x, b0.y);
              mma_16816<false>(d, a1[mt], b1.x, b1.y);
              fold_tile(acc[mt][c], d, m0[mt], m1[mt]);
            }
          }
        }
      }
    }
  }
  dev::cp_async_wait<0>();
  __syncthreads();  // the stages are free: the accumulators meet there
  float* red = smem;  // [warp][mt][the warp's column tile][entry][lane]
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int c = 0; c < kNTW; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(((warp * 2 + mt) * kNTW + c) * 4 + i) * 32 + lane] = acc[mt][c][i];
  __syncthreads();
  // Output (row, b): W row o0 + row, routed row row0 + b. Part p is column j = 3b + p: column tile j / 8 (of
  // the warp wm + 4 (j / 8 / 6) of the row's group), lane 4 (row % 8) + (j % 8) / 2, entry (j % 2) + 2 (row %
  // 16 >= 8) of the row tile.
  for (int q = tid; q < kRowsPerBlock * nrows; q += kThreads) {
    const int b = q / kRowsPerBlock, row = q - b * kRowsPerBlock;
    const int64_t o = o0 + row;
    if (o >= out_dim) continue;
    const int rwm = row >> 5, mt = (row >> 4) & 1, rr = row & 15;
    float part[kP];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const int j = kP * b + p, cg = j >> 3, jj = j & 7, ln = 4 * (rr & 7) + (jj >> 1), i = (rr >= 8 ? 2 : 0) + (jj & 1);
      const int wp = rwm + kWarpsM * (cg / kNTW), c = cg % kNTW;
      part[p] = red[(((wp * 2 + mt) * kNTW + c) * 4 + i) * 32 + ln];
    }
    const int64_t rowg = static_cast<int64_t>(u.row0) + b;
    out[rowg * out_dim + o] = parts_output(part, ex[rowg]);
  }
}

// ---- The wgmma form (DS41_TC_FP4_GEMM_WGMMA) ----
// The same block tile (128 W rows of one matrix x one unit's 96 B columns), the same numerics as the folded
// mma form above (a step's 128 K as one chain from zero, then acc = fma(d, 2^(s_min - 127), acc)), on Hopper's
// warpgroup MMA: two warpgroups (8 warps); warpgroup wg owns W rows [64 wg, 64 wg + 64), warp
// q of it rows 16 q .. 16 q + 15 (the lane's rows 16 q + r and + 8, as one mma row tile). Per step each warpgroup
// issues 8 wgmma.mma_async m64nNk16 (one per k16 slice) with A, the decoded and folded E2M1 weights, from
// registers and B, the unit's parts, from the stage in shared memory (wgmma.cuh's layout: the split writes it
// with kWg), N = 32, 64 or 96 (the unit's kP x rows rounded up: a short unit multiplies fewer columns). While
// they run, the threads wait for the next step's copies and decode its A into the other register buffer; then
// they wait for the chain and fold it. One mma_async replaces the mma form's 12 x 2 mma.sync of a warp and k16
// slice: the issue slots the mma form spends on mma.sync go to the decode.
//
// Contract: every (row, step) of the experts has its four scale bytes within 15 of their least (the caller
// checks: run_fp4_scales_outside_window's wide count), so every step folds. There is no per-tile fallback in the
// kernel: a branch around the mma_async makes ptxas serialize them ("wgmma.mma_async instructions are
// serialized due to program dependence on compiler-inserted WG.DP in divergent path"), measured when written.
// Every output's terms and their order are then the folded mma form's: a chain of 8 k16 products from zero, one
// fma per step, so on hardware whose wgmma sums a k16 slice as mma.sync does the two forms give the same bits
// (parity row ExpertGemmParity.WgmmaFormMatchesTheMmaForm).
//
// Pipeline: 4 stages (138 KB of shared memory: one block per SM); the copies of step k + 3 go out once every
// thread has waited for step k - 1's chain (the barrier before step k + 1's decode).
//
// Measured (H100, docs/perf session of 2026-12-08 00:14 UTC): the mma form's bits everywhere, but slower (the pair
// 12.3 ms against 10.4 at 2,048 tokens, the tensor pipe 20 % busy): both forms are bound by the E2M1 decode (each
// decoded weight feeds only N = 96 MACs), and this one runs one block per SM. Hence opt-in.
constexpr int kWgThreads = 256, kWgStages = 4;
constexpr int kWgSmem = kWgStages * kStageBytes;
constexpr int kSliceBytes = kJ * 32;  // one k16 slice of the unit's 96 B columns (3,072 bytes)
static_assert(8 * kSliceBytes == kXStageU2 * 8, "a stage's B is its 8 slices");
static_assert(kJ == 96 && kJ % 8 == 0, "N = 96 columns at most (wgmma.cuh kMaxAcc)");
static_assert(kWgThreads / 32 * wg::kMaxAcc * 32 * 4 <= kWgSmem, "the epilogue's accumulators fit the stages");

template <int kP>
__global__ void __launch_bounds__(kWgThreads, 1)
    expert_gemm_wgmma_kernel(const DeviceWeight* __restrict__ weights, const DeviceWeight* __restrict__ weights2,
                             const ExpertGemmUnit* __restrict__ units, int64_t out_dim, int64_t in,
                             const uint2* __restrict__ parts, const int32_t* __restrict__ ex, float* __restrict__ y,
                             float* __restrict__ y2) {
  extern __shared__ __align__(16) float smem[];  // the host emulator's rewrite expects this spelling
  uint8_t* const sm = reinterpret_cast<uint8_t*>(smem);
  dev::pdl_enter();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, r = lane >> 2, g = lane & 3;
  const UnitOperands uo = unit_operands(weights, weights2, units, y, y2);
  const ExpertGemmUnit u = uo.u;
  const DeviceWeight w = uo.w;
  float* __restrict__ out = uo.out;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int tiles = static_cast<int>(in / 32), steps = tiles / kStepTiles;
  const int nrows = u.rows;
  const int64_t half_in = in / 2;
  // The unit's parts: a routed row's step is 16 kP pieces of 16 bytes, piece (q kP + p) 2 + h = slice q (tile
  // q / 2, mma q % 2), part p, half h; column n = kP b + p of routed row b lands at wg::b_offset(8 h, n) of slice q.
  constexpr int kPieces = 16 * kP;
  const int64_t row_bytes = static_cast<int64_t>(tiles) * 64 * kP;
  const uint8_t* const xg = reinterpret_cast<const uint8_t*>(parts) + static_cast<int64_t>(u.row0) * row_bytes;
  // W: thread t copies row t / 2's pieces 2 (t % 2) and 2 (t % 2) + 1 of the step, the even thread its scale word
  // (rows past out_dim read the last row: their outputs are not written).
  const int wrow = tid >> 1, wpc = 2 * (tid & 1);
  const int64_t wo = min(o0 + wrow, out_dim - 1);
  const uint8_t* const wsrc = w.data + wo * half_in + wpc * 16;
  const uint8_t* const ssrc = w.scale + wo * tiles;
  auto load = [&](int slot, int k) {
    uint8_t* const base = sm + slot * kStageBytes;
    const Stage st(base);
    const uint8_t* const xk = xg + static_cast<int64_t>(k) * (kStepTiles * 64 * kP);
    for (int i = tid; i < nrows * kPieces; i += kWgThreads) {
      const int b = i / kPieces, pc = i - b * kPieces;
      const int q = pc / (2 * kP), rem = pc - q * (2 * kP), n = kP * b + (rem >> 1);
      dev::cp_async16(base + q * kSliceBytes + wg::b_offset(8 * (rem & 1), n), xk + b * row_bytes + pc * 16);
    }
    const uint8_t* const src = wsrc + k * (kStepTiles * 16);
    dev::cp_async16(st.ws + wrow * kWRowStride + wpc * 16, src);
    dev::cp_async16(st.ws + wrow * kWRowStride + wpc * 16 + 16, src + 16);
    if ((tid & 1) == 0) dev::cp_async4(st.ss + 4 * wrow, ssrc + k * kStepTiles);
    dev::cp_async_commit();
  };
  const int row_a = (warp >> 2) * 64 + (warp & 3) * 16 + r;  // the lane's rows: row_a, row_a + 8
  // Step k's A fragments from its stage (slice q = 2 j + h: tile j, mma h), each row's tile j weights times
  // 2^(s_j - s_min) (the contract: within 15), and the rows' 2^(s_min - 127).
  struct Dec {
    uint32_t a[8][4];
    float m0, m1;
  };
  auto decode = [&](int slot, Dec& dc) {
    const Stage st(sm + slot * kStageBytes);
    const uint8_t* const pa = st.ws + row_a * kWRowStride + 4 * g;
    const uint8_t* const pb = pa + 8 * kWRowStride;
    const uint32_t sa = *reinterpret_cast<const uint32_t*>(st.ss + 4 * row_a);
    const uint32_t sb = *reinterpret_cast<const uint32_t*>(st.ss + 4 * (row_a + 8));
    const uint32_t mna = byte_min(sa), mnb = byte_min(sb);
#pragma unroll
    for (int j = 0; j < kStepTiles; ++j) {
      uint32_t qa[4], qb[4];
      fp4_row_pairs(*reinterpret_cast<const uint32_t*>(pa + 16 * j), qa);
      fp4_row_pairs(*reinterpret_cast<const uint32_t*>(pb + 16 * j), qb);
      const uint32_t fa = fold_factor(sa, mna, j), fb = fold_factor(sb, mnb, j);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t* const a = dc.a[2 * j + h];
        a[0] = hmul2_bits(qa[2 * h], fa);
        a[1] = hmul2_bits(qb[2 * h], fb);
        a[2] = hmul2_bits(qa[2 * h + 1], fa);
        a[3] = hmul2_bits(qb[2 * h + 1], fb);
      }
    }
    dc.m0 = __uint_as_float(mna << 23);
    dc.m1 = __uint_as_float(mnb << 23);
  };

  float acc[wg::kMaxAcc], d[wg::kMaxAcc];
#pragma unroll
  for (int i = 0; i < wg::kMaxAcc; ++i) acc[i] = d[i] = 0.f;
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < steps)
      load(s, s);
    else
      dev::cp_async_commit();
  }
  dev::cp_async_wait<kWgStages - 2>();  // step 0's copies (this thread's)
  wg::fence_proxy_async();
  __syncthreads();
  Dec dec[2];
  decode(0, dec[0]);

  // N: the unit's columns rounded up to 32 (block-uniform).
  auto run = [&](auto ncols) {
    constexpr int N = decltype(ncols)::value;
    // Step k with its A in dec[B] (B = k % 2, a constant: the buffers stay in registers).
    auto step = [&](auto bc, int k) {
      constexpr int B = decltype(bc)::value;
      Dec& dc = dec[B];
      const uint8_t* const xs = sm + (k % kWgStages) * kStageBytes;
      wg::fence();
#pragma unroll
      for (int q = 0; q < 8; ++q) wg::mma<N>(d, dc.a[q], xs + q * kSliceBytes, q > 0);
      wg::commit();
      wg::fence_operand(d);
      if (k + 1 < steps) {
        dev::cp_async_wait<kWgStages - 3>();  // step k + 1's copies (this thread's; step k + 2's may be pending)
        wg::fence_proxy_async();
        __syncthreads();  // everyone's; every thread waited for step k - 1's chain: its slot is free
        if (k + kWgStages - 1 < steps)
          load((k + kWgStages - 1) % kWgStages, k + kWgStages - 1);
        else
          dev::cp_async_commit();
        decode((k + 1) % kWgStages, dec[B ^ 1]);
      }
      wg::wait<0>();
      wg::fence_operand(d);
      wg::fence_a(dc.a);  // the chain read them until now
#pragma unroll
      for (int c = 0; c < N / 8; ++c) fold_tile(acc + 4 * c, d + 4 * c, dc.m0, dc.m1);
    };
    for (int k = 0; k < steps; k += 2) {
      step(std::integral_constant<int, 0>{}, k);
      if (k + 1 < steps) step(std::integral_constant<int, 1>{}, k + 1);
    }
  };
  const int ncols = kP * nrows;
  if (ncols <= 32)
    run(std::integral_constant<int, 32>{});
  else if (ncols <= 64)
    run(std::integral_constant<int, 64>{});
  else
    run(std::integral_constant<int, 96>{});

  dev::cp_async_wait<0>();
  __syncthreads();  // the stages are free: the accumulators meet there
  float* red = smem;  // [warp][entry][lane]
#pragma unroll
  for (int i = 0; i < wg::kMaxAcc; ++i) red[(warp * wg::kMaxAcc + i) * 32 + lane] = acc[i];
  __syncthreads();
  // Output (row, b): warp row / 16, entry 4 (j / 8) + 2 (row % 16 >= 8) + j % 2 of lane 4 (row % 8) + (j % 8) / 2
  // for column j = kP b + p.
  for (int q = tid; q < kRowsPerBlock * nrows; q += kWgThreads) {
    const int b = q / kRowsPerBlock, row = q - b * kRowsPerBlock;
    const int64_t o = o0 + row;
    if (o >= out_dim) continue;
    const int wp = row >> 4, rr = row & 15;
    float part[kP];
#pragma unroll
    for (int p = 0; p < kP; ++p) {
      const int j = kP * b + p, jj = j & 7;
      const int e = 4 * (j >> 3) + (rr >= 8 ? 2 : 0) + (jj & 1), ln = 4 * (rr & 7) + (jj >> 1);
      part[p] = red[(wp * wg::kMaxAcc + e) * 32 + ln];
    }
    const int64_t rowg = static_cast<int64_t>(u.row0) + b;
    out[rowg * out_dim + o] = parts_output(part, ex[rowg]);
  }
}

}  // namespace

TestableSwitch g_one_part{"DS41_TC_ONE_PART", true};
TestableSwitch g_wgmma{"DS41_TC_FP4_GEMM_WGMMA", false};
bool expert_gemm_wgmma() {  // the switch, on a 9.0 device, with the fold on
  static const bool hopper = [] {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
           minor == 0;
  }();
  static const bool fold_env = switch_on("DS41_TC_FP4_GEMM_FOLD");
  const bool fold = fold_for_tests >= 0 ? fold_for_tests != 0 : fold_env;
  return hopper && fold && g_wgmma.enabled();
}
void set_expert_gemm_wgmma_for_tests(int mode) { g_wgmma.set(mode); }
bool tc_one_part() { return g_one_part.enabled(); }
void set_tc_one_part_for_tests(int mode) { g_one_part.set(mode); }

void set_expert_gemm_warps8_for_tests(int mode) { warps8_for_tests = mode; }
void set_expert_gemm_fold_for_tests(int mode) { fold_for_tests = mode; }
void set_expert_gemm_group_for_tests(int tiles) { group_for_tests = tiles; }

int64_t expert_gemm_max_units(int64_t m_max, int64_t E) { return m_max / kExpertGemmRows + E + 1; }

int64_t expert_gemm_units(const int64_t* off, int64_t E, ExpertGemmUnit* units, int64_t rows_per_unit) {
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r0 = off[e]; r0 < off[e + 1]; r0 += rows_per_unit) {
      ExpertGemmUnit u;
      u.expert = static_cast<int32_t>(e);
      u.row0 = static_cast<int32_t>(r0);
      u.rows = static_cast<int32_t>(std::min<int64_t>(rows_per_unit, off[e + 1] - r0));
      units[n++] = u;
    }
  return n;
}

bool expert_gemm_supported(int64_t out_dim, int64_t in_dim) {
  return out_dim > 0 && out_dim <= int64_t{65535} * kRowsPerBlock && in_dim > 0 &&
         in_dim % (32 * kStepTiles) == 0 && in_dim <= kMaxIn;
}

Status run_expert_gemm_split(const float* x, int64_t in_dim, const int64_t* rows_of, int64_t m, uint2* parts,
                             int32_t* ex, cudaStream_t stream, int n_parts, ExpertGemmForm form) {
  if (n_parts != 1 && n_parts != 3)
    return invalid_argument("expert GEMM split: " + std::to_string(n_parts) + " parts (1 or 3)");
  if (in_dim <= 0 || in_dim % 32 != 0 || in_dim > kMaxIn)
    return invalid_argument("expert GEMM split: in_dim " + std::to_string(in_dim) +
                            " must be a positive multiple of 32 up to " + std::to_string(kMaxIn));
  if (m < 0 || m > int64_t{1} << 31) return invalid_argument("expert GEMM split: rows " + std::to_string(m));
  if (m == 0) return ok_status();
  const unsigned grid = static_cast<unsigned>(m);
  if (form == ExpertGemmForm::kWgmma) {
    if (n_parts == 1)
      launch(expert_gemm_split_kernel<1, true>, grid, kSplitThreads, 0, stream, x, in_dim, rows_of, parts, ex);
    else
      launch(expert_gemm_split_kernel<3, true>, grid, kSplitThreads, 0, stream, x, in_dim, rows_of, parts, ex);
  } else if (n_parts == 1) {
    launch(expert_gemm_split_kernel<1>, grid, kSplitThreads, 0, stream, x, in_dim, rows_of, parts, ex);
  } else {
    launch(expert_gemm_split_kernel<3>, grid, kSplitThreads, 0, stream, x, in_dim, rows_of, parts, ex);
  }
  return last_launch_status("expert_gemm_split_kernel");
}

Status run_fp4_scales_outside_window(const DeviceWeight* weights, int64_t E, int64_t out_dim, int64_t in_dim,
                                     int32_t* count, cudaStream_t stream, int32_t* wide) {
  if (E <= 0 || E > 65535 || out_dim <= 0 || in_dim <= 0 || in_dim % 128 != 0)
    return invalid_argument("FP4 scale check: " + std::to_string(E) + " experts of " + std::to_string(out_dim) +
                            " x " + std::to_string(in_dim) + " (in_dim a positive multiple of 128)");
  const int64_t words = out_dim * (in_dim / 128);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((words + 255) / 256, 64));
  launch(scales_outside_window_kernel, dim3(blocks, static_cast<unsigned>(E)), 256, 0, stream, weights, words, count,
         wide);
  return last_launch_status("scales_outside_window_kernel");
}

Status run_expert_gemm_fp4(const DeviceWeight* weights, const DeviceWeight* weights2, const ExpertGemmUnit* units,
                           int64_t n_units, int64_t out_dim, int64_t in_dim, const uint2* parts, const int32_t* ex,
                           float* y, float* y2, cudaStream_t stream, int n_parts, ExpertGemmForm form) {
  if (n_parts != 1 && n_parts != 3) return invalid_argument("expert GEMM: " + std::to_string(n_parts) + " parts");
  if (!expert_gemm_supported(out_dim, in_dim))
    return invalid_argument("expert GEMM: " + std::to_string(out_dim) + " x " + std::to_string(in_dim) +
                            " (in_dim must be a positive multiple of 128 up to " + std::to_string(kMaxIn) + ")");
  if ((weights2 == nullptr) != (y2 == nullptr))
    return invalid_argument("expert GEMM: a pair needs both the second weights and its output");
  if (n_units < 0 || n_units > 65535) return invalid_argument("expert GEMM: units " + std::to_string(n_units));
  if (n_units == 0) return ok_status();
  // The instantiations: (warps / 4, fold, column tiles per group).
  static const bool smem_ok = [] {
    for (const void* f : {reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, false, 1>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<2, false, 1>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, true, 1>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, true, 2>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, true, 3>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, true, 4>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<2, true, 1>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<2, true, 3>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, false, 1, 1>),
                          reinterpret_cast<const void*>(expert_gemm_fp4_kernel<1, true, 2, 1>)})
      if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) return false;
    return true;
  }();
  if (!smem_ok) return internal_error("expert GEMM: the device does not give " + std::to_string(kSmem) +
                                      " bytes of shared memory to a block");
  const dim3 grid(static_cast<unsigned>((out_dim + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(n_units), weights2 ? 2u : 1u);
  if (form == ExpertGemmForm::kWgmma) {  // the wgmma form (the split wrote its layout; the caller checked the spread)
    static const bool wg_smem_ok = [] {
      for (const void* f : {reinterpret_cast<const void*>(expert_gemm_wgmma_kernel<1>),
                            reinterpret_cast<const void*>(expert_gemm_wgmma_kernel<3>)})
        if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmem) != cudaSuccess) return false;
      return true;
    }();
    if (!wg_smem_ok)
      return internal_error("expert GEMM: the device does not give " + std::to_string(kWgSmem) +
                            " bytes of shared memory to a block (the wgmma form)");
    if (n_parts == 1)
      launch(expert_gemm_wgmma_kernel<1>, grid, kWgThreads, kWgSmem, stream, weights, weights2, units, out_dim, in_dim,
             parts, ex, y, y2);
    else
      launch(expert_gemm_wgmma_kernel<3>, grid, kWgThreads, kWgSmem, stream, weights, weights2, units, out_dim, in_dim,
             parts, ex, y, y2);
    return last_launch_status("expert_gemm_wgmma_kernel");
  }
  static const bool eight = switch_opt_in("DS41_TC_FP4_GEMM_WARPS8");
  static const bool fold_env = switch_on("DS41_TC_FP4_GEMM_FOLD");
  static const int cg_env = [] {
    const char* e = std::getenv("DS41_TC_FP4_GEMM_CG");
    return e ? std::atoi(e) : 2;
  }();
  const bool wide = warps8_for_tests >= 0 ? warps8_for_tests != 0 : eight;
  const bool fold = fold_for_tests >= 0 ? fold_for_tests != 0 : fold_env;
  const int cg = fold ? (group_for_tests > 0 ? group_for_tests : cg_env) : 1;
  auto go = [&](auto kernel, int threads) {
    launch(kernel, grid, threads, kSmem, stream, weights, weights2, units, out_dim, in_dim, parts, ex, y, y2);
  };
  const int t1 = Layout<1>::kThreads, t2 = Layout<2>::kThreads;
  if (n_parts == 1) {  // one part: 4 warps, folded in column-tile pairs or unfolded
    if (fold) go(expert_gemm_fp4_kernel<1, true, 2, 1>, t1);
    else go(expert_gemm_fp4_kernel<1, false, 1, 1>, t1);
    return last_launch_status("expert_gemm_fp4_kernel");
  }
  if (wide) {
    if (!fold) go(expert_gemm_fp4_kernel<2, false, 1>, t2);
    else if (cg == 3) go(expert_gemm_fp4_kernel<2, true, 3>, t2);
    else go(expert_gemm_fp4_kernel<2, true, 1>, t2);
  } else {
    if (!fold) go(expert_gemm_fp4_kernel<1, false, 1>, t1);
    else if (cg == 2) go(expert_gemm_fp4_kernel<1, true, 2>, t1);
    else if (cg == 3) go(expert_gemm_fp4_kernel<1, true, 3>, t1);
    else if (cg == 4) go(expert_gemm_fp4_kernel<1, true, 4>, t1);
    else go(expert_gemm_fp4_kernel<1, true, 1>, t1);
  }
  return last_launch_status("expert_gemm_fp4_kernel");
}

}  // namespace ds41::cuda
