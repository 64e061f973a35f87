// ds41 backends/cuda: the tensor-core GEMV of decode (tc_gemv_kernels.h). Why: the CUDA-core GEMV
// spends ~11 instructions per weight (f16 -> f32 conversion, the scale multiply, the FMA, the
// addressing: ncu, docs/gpu_kernels.md) and so streams 1.3-1.8 TB/s; here a weight costs about one
// instruction (its share of a conversion to f16 and of an mma.sync), so the kernel can stream HBM.
//
// The product, exact to the oracle's float arithmetic up to summation order (MODEL_SPEC 2.1):
// - x (a block's NB rows) is scaled by a power of two per row (its largest |x| into [2^14, 2^15)) and
//   split into three f16 parts, hi = f16(x'), lo = f16(x' - hi), lo2 = f16(x' - hi - lo) (both
//   differences exact in fp32): 33 significant bits, so x' itself wherever it is an f16 normal
//   (|x| > 2^-29 max|x|; below that the parts lose bits of terms ~2^-40 of the output scale). The
//   parts are the columns of the mma's B operand (3 per row of x, in ceil(3 NB / 8) column tiles of 8).
// - W is decoded to f16 exactly: E4M3 by the hardware E4M3x2 -> f16x2 conversion; E2M1 by bit moves
//   (Fp4::row_pairs: the value times 2^-14, subnormal 0.5 included, as the CUDA-core WideFp4::pair).
// - mma.sync m16n8k16 (f16 x f16, fp32 accumulation) multiplies one 32-wide K tile (two mmas);
//   every product of an f16 weight and an f16 part is exact in fp32. The tile's sum is multiplied by
//   ONE exact power of two, its E8M0 scale (FP8: the 32x32 tile's; FP4: each row's), into the fp32
//   accumulator: one fmaf per output and tile (scales in a window where nothing over- or underflows:
//   scale_fast). At the end the parts are added, hi + (lo + lo2), and multiplied by 2^e (the x row's
//   power of two; times 2^14 for FP4): the bits a per-tile multiplier 2^(scale + e) gives, wherever
//   y is normal.
// So only the order of the fp32 additions differs from the CPU op (the parity rows' 1e-5 of max|y|).
// BF16 weights (the head, the MoE gate, the compressor: sent here by row-invariant calls only) are
// bf16 A fragments as loaded, x's three parts are bf16 (8 + 8 + 8 significant bits: x' exactly, at
// any exponent), the mma takes bf16 inputs, and a tile's multiplier is 2^e alone. The one corner
// this does not cover: a weight of magnitude > 2^100 could overflow a tile's partial sum of x'
// (|x'| < 2^15) where the oracle's products with x stay finite; no model weight is near that.
//
// Fragments: a warp owns 16 rows of W (one mma's M; they share one FP8 tile row, 16 | 32) and a
// range of K tiles. Lane (r = lane / 4, g = lane % 4) loads bytes [8g, 8g + 8) (FP8) or [4g, 4g + 4)
// (FP4) of the tile in rows r and r + 8, i.e. the 8 weights at K offsets 8g .. 8g + 7 of the tile,
// and decodes them in place into its A registers: the mma's K order is a permutation of the tile's
// (kofs below), and x is staged in shared memory in that same order, per (tile, mma, column, lane
// group) one 8-byte B fragment, so a lane reads its B operand with one conflict-free 8-byte load.
// The weights are streamed with 8-byte (FP8: four lanes read a row's 32 bytes of a tile) and 16-byte
// (FP4: four lanes read a row's 64 bytes of four tiles) loads with the L2::256B hint, U steps in
// flight per warp.
//
// Launch: 256 threads = 8 warps; KS warps split one row group's tiles (KS in {1, 2, 4, 8}, chosen from
// the weight's shape only, see shape()), 8 / KS row groups per block and iteration, blocks persistent
// over the row groups (grid-stride, at most one wave). A block stages NB rows of x (NB in {2, 3, 4, 6},
// pick_nb: 3 NB of the B columns, ceil(3 NB / 8) column tiles) and multiplies each decoded A fragment
// with all of them. The KS partial sums are added in a fixed order through shared memory
// (deterministic). Dense: grid = (x-row units of NB, row-group slots, groups), the units fastest so
// the blocks reading the same W rows run together; experts: grid = (slots, units), a unit being <= NB
// rows of x routed to one expert (found by a scan of the offsets). A pair (two weights over the same
// x: the MoE's w1 and w3, the shared expert's w1 and w3) adds grid z = 2, the matrix; the slots of
// one launch are shared between both.
#include "backends/cuda/tc_gemv_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cuda/block_scan.cuh"
#include "backends/cuda/bulk_copy.cuh"
#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/hc_collapse_device.cuh"
#include "backends/cuda/hc_expand_device.cuh"
#include "backends/cuda/hc_site_map_device.cuh"
#include "backends/cuda/last_block.cuh"
#include "backends/cuda/device_sm_count.h"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/launch.h"
#include "backends/cuda/moe_bucket_device.cuh"
#include "backends/cuda/moe_kernels.h"
#include "backends/cuda/pdl.cuh"
#include "backends/cuda/rms_norm_device.cuh"
#include "backends/cuda/swiglu_device.cuh"
#include "backends/cuda/tc_frag.cuh"

// nvcc's __noinline__ (the host SIMT emulator compiles this file with g++, where libstdc++ spells
// __attribute__((__noinline__)) itself, so the macro cannot be defined there).
#if defined(__CUDACC__)
#define DS41_TCG_NOINLINE __noinline__
#else
#define DS41_TCG_NOINLINE __attribute__((noinline))
#endif

namespace ds41::cuda::tcg {
namespace {

using quant::WeightFormat;

// The step's loads issued after its quad transposes (1, WarpTask::tile) or before them (0, as measured
// until 2026-12-07): a build-time A/B (-DDS41_TCG_LOAD_AFTER_PREPARE=0); the same bits either way.
#ifndef DS41_TCG_LOAD_AFTER_PREPARE
#define DS41_TCG_LOAD_AFTER_PREPARE 1
#endif
// FP4: a step whose tiles all pass the scale window runs them without a branch between tiles (1,
// WarpTask::tile), or every tile tested in the loop (0, as measured until 2026-12-07): a build-time A/B
// (-DDS41_TCG_STEP_FAST=0); the same bits either way.
#ifndef DS41_TCG_STEP_FAST
#define DS41_TCG_STEP_FAST 1
#endif

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Every row count: a decode step or a DSpark verification of any batch gets a one-row call's bits
// (row-count invariance). Wide calls re-read W per unit of NB rows (from L2 mostly), so run_linear sends
// only decode-sized (kDecodeRows) or row_invariant calls here.
constexpr int64_t kMaxRows = 2 * 65535;     // rows of x of a dense call (grid x: units of >= 2 of them)
constexpr int64_t kMaxExpertRows = 65535;  // routed rows of an expert call (grid y: one unit each at most)
constexpr int kMaxSmem = 200 * 1024;    // staged x of a block, at most
constexpr int kMaxExperts = 2048;       // the unit lookup: kMaxExperts / kThreads experts per thread
constexpr int kMaxRingDepth = 4;        // stages per warp of the shared-memory weight ring
// stage_x's one pass: a block whose x is <= kStageHeld units of 8 floats per thread (one row of
// K <= 8192, three rows of 2304, ...) holds them in registers between the row maxima and the parts.
constexpr int kStageHeld = 4;
constexpr int kRingBarBytes = kWarps * kMaxRingDepth * 8;  // their mbarriers, first in the ring's region

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | (static_cast<uint32_t>(r.y) << 16);
}

template <class T>
__device__ __forceinline__ T ld_nc(const void* p) {
  return __ldg(reinterpret_cast<const T*>(p));
}

// A weight load: read-only, no L1 allocation, with the L2::256B prefetch hint: a miss brings the
// next 256 bytes of the row into L2, so the next tiles of a lane quad's row are L2 hits (more bytes
// in flight without registers). Measured on the H200 (docs/perf/README.md): batch-1 decode 4.58 ms
// without the hint, 4.22 ms with it; twice the tiles in flight per warp instead was slower (more
// registers) at every shape.
template <class T>
__device__ __forceinline__ T ld_w(const void* p) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 8) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
  } else {
    static_assert(sizeof(T) == 16);
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
  }
#else
  return ld_nc<T>(p);
#endif
}

// The aligned 32-bit word around byte p (scale bytes: one aligned load or copy serves four).
__device__ __forceinline__ const uint32_t* aligned_word(const uint8_t* p) {
  return reinterpret_cast<const uint32_t*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{3});
}

// A ring stage's 64-byte step of one row at p, as the lane's 16-byte piece after the quad transpose
// (Fp4::transpose): word g of each of the four 16-byte pieces (four conflict-free 4-byte loads where the
// row stride is 4 words mod 32 banks). Fp4 and Fp8x2 ring reads.
__device__ __forceinline__ uint4 ring_step_words(const uint8_t* p) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p) + (threadIdx.x & 3);
  return make_uint4(w[0], w[4], w[8], w[12]);
}

// The formats. Per tile and lane: Q the loaded words of rows r and r + 8.
// kofs(m, s): K offset in the tile (past 8g) of B slot s (0..3) of mma m: slots 0, 1 = b0's two
// halves, 2, 3 = b1's.
struct Fp8 {
  static constexpr int kU = 4;  // steps (tiles) in flight per warp (5 regs each)
  struct Q {
    uint2 a, b;
  };
  static constexpr int kExp = 0;
  static constexpr bool kBf = false;
  __host__ __device__ static constexpr int kofs(int m, int s) { return 4 * m + s; }
  // The float4 of x (index within the row) holding half h of lane group g's 8 K of tile t: K 8g .. 8g + 7.
  __host__ __device__ static constexpr int64_t x_float4(int64_t t, int g, int h) { return 8 * t + 2 * g + h; }
  // A step = one tile: rows r and r + 8 at bytes [8g, 8g + 8) (four lanes read a row's 32 bytes),
  // the tile's scale byte (all lanes the same address).
  static constexpr int kSub = 1;
  struct Raw {
    uint2 a, b;
    uint32_t s;
  };
  __device__ static const uint8_t* row_ptr(const uint8_t* data, int64_t in, int64_t o, int g) { return data + o * in + 8 * g; }
  static constexpr int kStepBytes = 32, kScaleStep = 1;
  // The 16 rows of a warp share one row of 32 x 32 tiles: every lane loads the same scale byte, so
  // the fast-path test of a step is warp-uniform without a vote.
  static constexpr bool kUniformScale = true;
  // The step at the pointers (WarpTask advances them by kStepBytes / kScaleStep per step).
  __device__ static Raw load_at(const uint8_t* ra, const uint8_t* rb, const uint8_t* sa, const uint8_t*, int) {
    return Raw{ld_w<uint2>(ra), ld_w<uint2>(rb), __ldg(sa)};
  }
  // The shared-memory ring (WarpTask with kRing): a stage holds kRingSteps steps of the warp's 16
  // rows, one bulk copy per row (row i at i x kRingRowStride: 32 bytes of pad put the four rows of a
  // half-warp's 8-byte reads on distinct banks), then the aligned words around the steps' scale
  // bytes (the 16 rows share them; cp.async, one word per lane).
  static constexpr int kRingSteps = 8, kRingRowStride = kRingSteps * kStepBytes + 32;
  static constexpr int kRingStageBytes = 16 * kRingRowStride + 16;  // <= 3 words hold 8 bytes at any place
  __host__ __device__ static constexpr int64_t row_bytes(int64_t in) { return in; }
  // The scale byte of tile t of the warp's row of tiles.
  __device__ static const uint8_t* ring_scale_at(const uint8_t* sc, int64_t tiles, int64_t o0, int64_t, int64_t t,
                                                 int) {
    return sc + (o0 >> 5) * tiles + t;
  }
  __device__ static void ring_scales(uint8_t* area, const uint8_t* sc, int64_t tiles, int64_t o0, int64_t row_end,
                                     int64_t t, int steps) {
    const int lane = threadIdx.x & 31;
    const uint8_t* s = ring_scale_at(sc, tiles, o0, row_end, t, 0);
    const int words = (static_cast<int>(reinterpret_cast<uintptr_t>(s) & 3u) + steps + 3) >> 2;
    if (lane < words) dev::cp_async4(area + 4 * lane, aligned_word(s) + lane);
  }
  // Step j of the stage at st: the lane's pieces of rows r and r + 8 and the step's scale byte, byte
  // aux + j of the words (aux: the stage's first scale byte's place in its word).
  __device__ static Raw ring_read(const uint8_t* st, int j, int aux) {
    const int lane = threadIdx.x & 31, r = lane >> 2, g = lane & 3;
    const uint8_t* p = st + r * kRingRowStride + kStepBytes * j + 8 * g;
    return Raw{*reinterpret_cast<const uint2*>(p), *reinterpret_cast<const uint2*>(p + 8 * kRingRowStride),
               st[16 * kRingRowStride + aux + j]};
  }
  // aux of ring_read for a stage whose first scale byte is at s.
  __device__ static int ring_aux(const uint8_t* s, int) { return static_cast<int>(reinterpret_cast<uintptr_t>(s) & 3u); }
  __device__ static void prepare(Raw&, int, bool) {}
  __device__ static bool step_fast(const Raw& w) { return scale_fast(w.s); }
  __device__ static Q sub(const Raw& w, int) { return Q{w.a, w.b}; }
  __device__ static uint32_t scale_a(const Raw& w, int) { return w.s; }
  __device__ static uint32_t scale_b(const Raw& w, int) { return w.s; }
  // Weight idx (0..7) of the lane's row r (row 0) or r + 8 (1), as the host dequantizes it.
  __device__ static float dequant(const Q& q, int row, int idx, uint32_t sb) {
    const uint2 w = row ? q.b : q.a;
    const uint32_t byte = ((idx < 4 ? w.x : w.y) >> (8 * (idx & 3))) & 0xffu;
    return __fmul_rn(dev::e4m3_decode(byte), dev::e8m0_decode(sb));
  }
  __device__ static void frag(const Q& q, int m, uint32_t (&a)[4]) {
    const uint32_t wa = m ? q.a.y : q.a.x, wb = m ? q.b.y : q.b.x;
    a[0] = e4m3x2_to_f16x2(wa);
    a[1] = e4m3x2_to_f16x2(wb);
    a[2] = e4m3x2_to_f16x2(wa >> 16);
    a[3] = e4m3x2_to_f16x2(wb >> 16);
  }  __device__ static void frags(const Q& q, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
    frag(q, 0, a0);
    frag(q, 1, a1);
  }
};

struct Fp4 {
  static constexpr int kU = 2;  // steps (4 tiles each) in flight per warp (10 regs each)
  struct Q {
    uint32_t a, b;
  };
  static constexpr int kExp = 14;  // E2M1 decoded as value * 2^-14
  static constexpr bool kBf = false;
  __host__ __device__ static constexpr int kofs(int m, int s) { return fp4_kofs(m, s); }
  __host__ __device__ static constexpr int64_t x_float4(int64_t t, int g, int h) { return 8 * t + 2 * g + h; }
  // A step = four tiles (128 K): lane g loads bytes [16g, 16g + 16) of the rows' 64-byte span, i.e.
  // tile g whole (four lanes read a row's 64 contiguous bytes: a quarter of the L1 wavefronts of
  // 4-byte loads per tile), and the rows' four scale bytes (one 32-bit load each); prepare()
  // transposes the 4 x 4 words within each lane quad so that lane g holds bytes [4g, 4g + 4) of
  // every tile, as the fragments want.
  static constexpr int kSub = 4;
  struct Raw {
    uint4 a, b;
    uint32_t sa, sb;
    uint32_t sa_hi, sb_hi;  // the next aligned scale words (read only when the rows' scales are unaligned)
  };
  __device__ static const uint8_t* row_ptr(const uint8_t* data, int64_t in, int64_t o, int g) {
    return data + o * (in / 2) + 16 * g;
  }
  static constexpr int kStepBytes = 64, kScaleStep = 4;
  static constexpr bool kUniformScale = false;  // rows r and r + 8 of each lane have their own scales
  // A row's four scale bytes at p as one word: load_at reads the aligned word around p (and the next
  // one only when `shift` = 8 (p % 4) bits is not 0; the same for every step and row of a task:
  // tiles % 4 == 0); prepare() funnel-shifts them when the step is used. Shifting at the load waited
  // for the loads there, so every step's loads stalled the warp a memory latency (ncu's top stall,
  // SHF.R.U64, docs/perf/README.md).
  __device__ static const uint32_t* scale_word(const uint8_t* p) { return aligned_word(p); }
  __device__ static Raw load_at(const uint8_t* ra, const uint8_t* rb, const uint8_t* sa, const uint8_t* sb,
                                int shift) {
    const uint32_t* wa = scale_word(sa);
    const uint32_t* wb = scale_word(sb);
    return Raw{ld_w<uint4>(ra), ld_w<uint4>(rb), __ldg(wa), __ldg(wb), shift ? __ldg(wa + 1) : 0u,
               shift ? __ldg(wb + 1) : 0u};
  }
  // The shared-memory ring (WarpTask with kRing): a stage holds kRingSteps steps of the warp's 16
  // rows, one bulk copy per row (row i at i x kRingRowStride), then each row's scale words (kRingWords
  // per row: the steps' words and, when the rows' scales are not 4-byte aligned, the next; cp.async).
  // ring_read takes a lane's words in the fragments' order straight from shared memory (lane g: word g
  // of each of the step's four tiles, four 4-byte loads per row), so a ring step needs no quad
  // transpose; the stride's 16 bytes of pad (68 words, 4 mod 32 banks) put the 32 lanes of each such
  // load (rows r at 4r, word g) on 32 distinct banks.
  static constexpr int kRingSteps = 4, kRingRowStride = kRingSteps * kStepBytes + 16;
  static constexpr int kRingWords = kRingSteps + 1;
  static constexpr int kRingStageBytes = 16 * kRingRowStride + 16 * 4 * kRingWords;
  __host__ __device__ static constexpr int64_t row_bytes(int64_t in) { return in / 2; }
  // Row o0 + i's scale byte of tile t (rows past the end clamped, as the loads).
  __device__ static const uint8_t* ring_scale_at(const uint8_t* sc, int64_t tiles, int64_t o0, int64_t row_end,
                                                 int64_t t, int i) {
    return sc + min(o0 + i, row_end - 1) * tiles + t;
  }
  __device__ static void ring_scales(uint8_t* area, const uint8_t* sc, int64_t tiles, int64_t o0, int64_t row_end,
                                     int64_t t, int steps) {
    const int lane = threadIdx.x & 31;
    // tiles % 4 == 0: every row's scale bytes have the first row's place in their words.
    const int wpr = steps + ((reinterpret_cast<uintptr_t>(ring_scale_at(sc, tiles, o0, row_end, t, 0)) & 3u) ? 1 : 0);
    for (int q = lane; q < 16 * wpr; q += 32) {
      const int i = q / wpr, w = q - i * wpr;
      dev::cp_async4(area + 4 * (i * kRingWords + w), scale_word(ring_scale_at(sc, tiles, o0, row_end, t, i)) + w);
    }
  }
  // Step j of the stage at st: rows r and r + 8 as load_at's pieces after the quad transpose (word t =
  // word g of tile t: prepare() is told so) and their scale words (and the next ones when aux = shift != 0).
  __device__ static Raw ring_read(const uint8_t* st, int j, int aux) {
    const int r = (threadIdx.x & 31) >> 2;
    const uint8_t* p = st + r * kRingRowStride + kStepBytes * j;
    const uint32_t* w = reinterpret_cast<const uint32_t*>(st + 16 * kRingRowStride) + r * kRingWords + j;
    const uint32_t* wb = w + 8 * kRingWords;
    return Raw{ring_step_words(p), ring_step_words(p + 8 * kRingRowStride), w[0], wb[0], aux ? w[1] : 0u,
               aux ? wb[1] : 0u};
  }
  __device__ static int ring_aux(const uint8_t*, int shift) { return shift; }
  __device__ static uint32_t funnel(uint32_t lo, uint32_t hi, int shift) {
    return shift ? static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> shift) : lo;
  }
  // 4 x 4 transpose of the words of the lanes of a quad (lane g: word j of tile g -> word j = tile j's
  // word g): two exchange rounds (xor 1, xor 2) of two words each.
  __device__ static void transpose(uint4& v) {
    const int g = threadIdx.x & 3;
    const bool p = (g & 1) != 0, q = (g & 2) != 0;
    uint32_t a = p ? v.x : v.y, b = p ? v.z : v.w;
    a = __shfl_xor_sync(0xffffffffu, a, 1);
    b = __shfl_xor_sync(0xffffffffu, b, 1);
    if (p) { v.x = a; v.z = b; } else { v.y = a; v.w = b; }
    uint32_t c = q ? v.x : v.z, d = q ? v.y : v.w;
    c = __shfl_xor_sync(0xffffffffu, c, 2);
    d = __shfl_xor_sync(0xffffffffu, d, 2);
    if (q) { v.x = c; v.y = d; } else { v.z = c; v.w = d; }
  }
  // transposed: the words are already in the fragments' order (ring_read reads them so).
  __device__ static void prepare(Raw& w, int shift, bool transposed) {
    w.sa = funnel(w.sa, w.sa_hi, shift);
    w.sb = funnel(w.sb, w.sb_hi, shift);
    if (transposed) return;
    transpose(w.a);
    transpose(w.b);
  }
  // After prepare(): the step's four tiles of rows r and r + 8 all on the fast path.
  __device__ static bool step_fast(const Raw& w) { return scale_word_fast(w.sa) && scale_word_fast(w.sb); }
  __device__ static uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w)); }
  __device__ static Q sub(const Raw& w, int j) { return Q{word(w.a, j), word(w.b, j)}; }
  __device__ static uint32_t scale_a(const Raw& w, int j) { return (w.sa >> (8 * j)) & 0xffu; }
  __device__ static uint32_t scale_b(const Raw& w, int j) { return (w.sb >> (8 * j)) & 0xffu; }
  __device__ static float dequant(const Q& q, int row, int idx, uint32_t sb) {
    const uint32_t code = ((row ? q.b : q.a) >> (4 * idx)) & 0xfu;
    return __fmul_rn(dev::e2m1_decode(code), dev::e8m0_decode(sb));
  }
  // The A fragments of both mmas from a row's word of 8 codes: tc_frag.cuh fp4_row_pairs.
  __device__ static void row_pairs(uint32_t w, uint32_t (&p)[4]) { fp4_row_pairs(w, p); }
  __device__ static void frags(const Q& q, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
    uint32_t pa[4], pb[4];
    row_pairs(q.a, pa);
    row_pairs(q.b, pb);
    a0[0] = pa[0];
    a0[1] = pb[0];
    a0[2] = pa[1];
    a0[3] = pb[1];
    a1[0] = pa[2];
    a1[1] = pb[2];
    a1[2] = pa[3];
    a1[3] = pb[3];
  }
};

// FP8 tiles read as 16-byte pieces (the default where in % 64 == 0; DS41_TCG_FP8_WIDE=0: Fp8): a step = two tiles,
// lane g loads bytes [16g, 16g + 16) of the rows' 64-byte span (rows r and r + 8: a quarter of the
// load instructions of Fp8's 8-byte pieces, which read 15-22 % slower in the H100 probe,
// tools/probes/gemv_read_probe.cu) and the two tiles' scale bytes (one 16-bit load: the 16 rows share
// them). prepare() transposes the 4 x 4 words of the lane quad (Fp4::transpose) so that lane g holds
// words g and 4 + g of tile 0 (.x, .y) and of tile 1 (.z, .w): the tile's K offsets [4g, 4g + 4) and
// [16 + 4g, 16 + 4g + 4), which the four lanes partition; x is staged in that order (x_float4), and
// from there the tile is Fp8's (the same fragments of another K permutation, the same per-tile sums
// and scales). A row's bits depend on the weight's shape and the switch only (row-count invariance);
// they may differ from Fp8's in the last place (another split of the tile's K among the mmas).
struct Fp8x2 {
  static constexpr int kU = 2;  // steps (2 tiles each) in flight per warp: 64 bytes per lane, as Fp8
  using Q = Fp8::Q;
  static constexpr int kExp = 0;
  static constexpr bool kBf = false;
  __host__ __device__ static constexpr int kofs(int m, int s) { return 4 * m + s; }
  __host__ __device__ static constexpr int64_t x_float4(int64_t t, int g, int h) { return 8 * t + g + 4 * h; }
  static constexpr int kSub = 2;
  struct Raw {
    uint4 a, b;
    uint32_t s;  // tile 0's scale byte in bits 0-7, tile 1's in bits 8-15
  };
  __device__ static const uint8_t* row_ptr(const uint8_t* data, int64_t in, int64_t o, int g) {
    return data + o * in + 16 * g;
  }
  static constexpr int kStepBytes = 64, kScaleStep = 2;
  static constexpr bool kUniformScale = true;
  __device__ static Raw load_at(const uint8_t* ra, const uint8_t* rb, const uint8_t* sa, const uint8_t*, int) {
    return Raw{ld_w<uint4>(ra), ld_w<uint4>(rb),
               static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(sa)))};
  }
  // The shared-memory ring (WarpTask with kRing), as Fp4's: kRingSteps steps of the warp's 16 rows, one
  // bulk copy per row, ring_read taking the lane's words in the fragments' order (word g of each 16-byte
  // piece of the row's 64-byte step: the quad transpose's result, four conflict-free 4-byte loads per row)
  // so that a ring step needs no transpose; then the aligned words around the stage's 2 kRingSteps scale
  // bytes (the 16 rows share them; cp.async, one word per lane: <= 3 words hold 8 bytes at any place).
  static constexpr int kRingSteps = 4, kRingRowStride = kRingSteps * kStepBytes + 16;
  static constexpr int kRingStageBytes = 16 * kRingRowStride + 16;
  __host__ __device__ static constexpr int64_t row_bytes(int64_t in) { return in; }
  // The scale bytes as Fp8's (one per tile, shared by the 16 rows), kSub of them per step.
  __device__ static const uint8_t* ring_scale_at(const uint8_t* sc, int64_t tiles, int64_t o0, int64_t row_end,
                                                 int64_t t, int i) {
    return Fp8::ring_scale_at(sc, tiles, o0, row_end, t, i);
  }
  __device__ static void ring_scales(uint8_t* area, const uint8_t* sc, int64_t tiles, int64_t o0, int64_t row_end,
                                     int64_t t, int steps) {
    Fp8::ring_scales(area, sc, tiles, o0, row_end, t, kSub * steps);
  }
  __device__ static int ring_aux(const uint8_t* s, int shift) { return Fp8::ring_aux(s, shift); }
  __device__ static Raw ring_read(const uint8_t* st, int j, int aux) {
    const uint8_t* p = st + ((threadIdx.x & 31) >> 2) * kRingRowStride + kStepBytes * j;
    const uint8_t* sb = st + 16 * kRingRowStride + aux + kSub * j;
    return Raw{ring_step_words(p), ring_step_words(p + 8 * kRingRowStride),
               static_cast<uint32_t>(sb[0]) | (static_cast<uint32_t>(sb[1]) << 8)};
  }
  // transposed: the words are already in the fragments' order (ring_read).
  __device__ static void prepare(Raw& w, int, bool transposed) {
    if (transposed) return;
    Fp4::transpose(w.a);
    Fp4::transpose(w.b);
  }
  __device__ static bool step_fast(const Raw& w) { return scale_fast(w.s & 0xffu) && scale_fast(w.s >> 8); }
  __device__ static Q sub(const Raw& w, int j) {
    return j == 0 ? Q{make_uint2(w.a.x, w.a.y), make_uint2(w.b.x, w.b.y)}
                  : Q{make_uint2(w.a.z, w.a.w), make_uint2(w.b.z, w.b.w)};
  }
  __device__ static uint32_t scale_a(const Raw& w, int j) { return (w.s >> (8 * j)) & 0xffu; }
  __device__ static uint32_t scale_b(const Raw& w, int j) { return (w.s >> (8 * j)) & 0xffu; }
  __device__ static float dequant(const Q& q, int row, int idx, uint32_t sb) { return Fp8::dequant(q, row, idx, sb); }
  __device__ static void frags(const Q& q, uint32_t (&a0)[4], uint32_t (&a1)[4]) { Fp8::frags(q, a0, a1); }
};

// BF16 (the head, the MoE gate): the weights are already mma inputs (bf16 A fragments as loaded) and
// x's parts are bf16 (3 x 8 significant bits: x' exactly). No scale: every tile's multiplier is 2^e
// (its "scale byte" is 127, so the fast path's test and multiplier are the FP8 / FP4 ones).
struct Bf16 {
  static constexpr int kU = 2;  // steps (tiles) in flight per warp (8 regs each): 2 KB per warp, as FP8
  struct Q {
    uint4 a, b;
  };
  static constexpr int kExp = 0;
  static constexpr bool kBf = true;
  __host__ __device__ static constexpr int kofs(int m, int s) { return 4 * m + s; }
  __host__ __device__ static constexpr int64_t x_float4(int64_t t, int g, int h) { return 8 * t + 2 * g + h; }
  // A step = one tile: rows r and r + 8 at bytes [16g, 16g + 16) (bf16 K offsets 8g .. 8g + 7; four
  // lanes read a row's 64 bytes). No scale loads.
  static constexpr int kSub = 1;
  struct Raw {
    uint4 a, b;
  };
  __device__ static const uint8_t* row_ptr(const uint8_t* data, int64_t in, int64_t o, int g) {
    return data + o * in * 2 + 16 * g;
  }
  static constexpr int kStepBytes = 64, kScaleStep = 0;
  // A weight is used as it is (the oracle's dequantization of BF16 is exact): always the fast path.
  static constexpr bool kUniformScale = true;
  __device__ static Raw load_at(const uint8_t* ra, const uint8_t* rb, const uint8_t*, const uint8_t*, int) {
    return Raw{ld_w<uint4>(ra), ld_w<uint4>(rb)};
  }
  __device__ static void prepare(Raw&, int, bool) {}
  __device__ static constexpr bool step_fast(const Raw&) { return true; }
  __device__ static Q sub(const Raw& w, int) { return Q{w.a, w.b}; }
  __device__ static uint32_t scale_a(const Raw&, int) { return 127u; }
  __device__ static uint32_t scale_b(const Raw&, int) { return 127u; }
  __device__ static float dequant(const Q& q, int row, int idx, uint32_t) {
    const uint4 w = row ? q.b : q.a;
    const uint32_t word = idx < 2 ? w.x : (idx < 4 ? w.y : (idx < 6 ? w.z : w.w));
    return part_float<true>(word >> (16 * (idx & 1)));
  }
  __device__ static void frag(const Q& q, int m, uint32_t (&a)[4]) {
    a[0] = m ? q.a.z : q.a.x;
    a[1] = m ? q.b.z : q.b.x;
    a[2] = m ? q.a.w : q.a.y;
    a[3] = m ? q.b.w : q.b.y;
  }  __device__ static void frags(const Q& q, uint32_t (&a0)[4], uint32_t (&a1)[4]) {
    frag(q, 0, a0);
    frag(q, 1, a1);
  }
};

// D with kDeep steps in flight per warp instead of D::kU: the same loads in the same order and the same
// arithmetic, so the same bits; for launches of fewer blocks than SMs, where a warp's task is a chain of
// dependent round trips (U steps each) and the registers of one block per SM are spare. The launcher keeps
// D::kU for the shape (KS: a row's bits).
template <class D, int kDeep>
struct InFlight : D {
  static constexpr int kU = kDeep;
};

// ---------------------------------------------------------------------------------------------
// Staging: rows b < nb (<= NB) of x (K = in; rows 16-byte aligned) into xs as [tile][mma][column j =
// 3b + part][lane group] of 4 f16 (one B fragment). x' = x * 2^-e_b, e_b = ilogb(max |x_b|) - 14 (0
// for a row with inf / NaN), written to ex[b]: a tile's sum is multiplied by 2^(e_b + kExp) times its
// E8M0 scale as ONE power of two (kExp = 14 for FP4's value * 2^-14 decoding), so the accumulator
// holds y itself (no intermediate overflow or underflow where y and the oracle's products are
// normal). Where the block's x fits kStageHeld units of 8 floats per thread, ONE pass: the float4
// loads go out together, the maxima and then the parts come from the same registers; otherwise two
// passes (the row maxima, then the parts, loading x again). A row's parts and e depend on that row alone (row-count invariance).
// rows (nullable): row b of the block is x + rows[b] * ldx instead of x + b * ldx (the routed rows of
// a decode MoE read straight from the token rows through the routing permutation: no gathered copy,
// the same floats, so the same bits).
// resolved (nullable): the row starts already in shared memory, written before a barrier the caller
// passed (the expert kernel's unit lookup finds them; x, rows and ldx are then unused).
// kGeneric: the rows are read with generic loads instead of the read-only path (they may lie in shared
// memory, or be written earlier in the same kernel: the MoE entry kernel's collapsed row).
template <bool kGeneric>
__device__ __forceinline__ float4 ld_x4(const float4* p) {
  if constexpr (kGeneric)
    return *p;
  else
    return __ldg(p);
}
template <class D, int NB, bool kGeneric = false>
__device__ void stage_x(const float* __restrict__ x, int64_t ldx, int nb, int64_t in, uint2* xs, float* red,
                        int* ex, const int64_t* __restrict__ rows = nullptr, RowNorm norm = RowNorm{},
                        const float* const* resolved = nullptr) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ const float* xrow_own[NB];  // the block's row starts, looked up once
  __shared__ float ninv[NB];             // norm: each row's 1 / rms, as run_rms_norm computes it
  const float* const* xrow = resolved != nullptr ? resolved : xrow_own;
  if (resolved == nullptr) {  // block-uniform
    if (tid < nb) xrow_own[tid] = x + (rows ? rows[tid] : static_cast<int64_t>(tid)) * ldx;
    __syncthreads();
  }
  const bool normed = norm.weight != nullptr;  // block-uniform
  if (normed) {
    __shared__ double nscratch[32];
    for (int b = 0; b < nb; ++b) {
      const float* xr = xrow[b];
      const float inv = dev::rms_inv_like_rms_norm([&](int64_t i) { return xr[i]; }, in, norm.sum_threads, norm.eps,
                                                   nscratch);
      if (tid == 0) ninv[b] = inv;
    }
    __syncthreads();
  }
  // x's value at k of row b as staged: itself, or run_rms_norm's fl(fl(x inv) w[k]).
  auto val4 = [&](float4 v, int b, int64_t k4) {
    if (!normed) return v;
    const float inv = ninv[b];
    const float4 w = __ldg(reinterpret_cast<const float4*>(norm.weight) + k4);
    return make_float4(__fmul_rn(v.x, inv) * w.x, __fmul_rn(v.y, inv) * w.y, __fmul_rn(v.z, inv) * w.z,
                       __fmul_rn(v.w, inv) * w.w);
  };
  __shared__ float inv_s[NB][2];
  const int J = 3 * nb;
  const int q8 = static_cast<int>(in / 8), units = nb * q8;  // (b, tile, lane group): 8 floats each
  // The exponent of each row from the block's per-warp maxima in red (after a barrier): ex[b], and
  // 2^-e as one or two exact power-of-two factors in inv_s.
  auto row_exponents = [&] {
    // Columns of x rows >= nb multiply zeros; their exponent must still be a sane 0 (the H200 run with
    // it left unset sent every tile of a one-row call down exact_tile: wq_b 80 us instead of 23).
    if (tid >= nb && tid < NB) ex[tid] = 0;
    if (tid < nb) {
      float m = 0.f;
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w * NB + tid]);
      const int e = stage_exponent(m);
      ex[tid] = e;
      stage_factors(e, inv_s[tid][0], inv_s[tid][1]);
    }
  };
  // The lane group's 8 K of tile t of row b: two float4 of x (D::x_float4: K 8g .. 8g + 7, or Fp8x2's
  // 4g .. 4g + 3 and 16 + 4g .. 16 + 4g + 3), as staged (val4).
  auto load_unit = [&](int i, float4 (&v)[2]) {
    const int b = i / q8, u = i - b * q8, t = u >> 2, g = u & 3;
    const float4* p = reinterpret_cast<const float4*>(xrow[b]);
    v[0] = ld_x4<kGeneric>(p + D::x_float4(t, g, 0));
    v[1] = ld_x4<kGeneric>(p + D::x_float4(t, g, 1));
  };
  auto normed_unit = [&](int i, float4 (&v)[2]) {
    const int b = i / q8, u = i - b * q8, t = u >> 2, g = u & 3;
    v[0] = val4(v[0], b, D::x_float4(t, g, 0));
    v[1] = val4(v[1], b, D::x_float4(t, g, 1));
  };
  // Unit i's three parts of x' = x 2^-e into xs (after row_exponents and a barrier).
  auto put_unit = [&](int i, const float4 (&v)[2]) {
    const int b = i / q8, u = i - b * q8, t = u >> 2, g = u & 3;
    const float i0f = inv_s[b][0], i1f = inv_s[b][1];
    const float f[8] = {v[0].x * i0f * i1f, v[0].y * i0f * i1f, v[0].z * i0f * i1f, v[0].w * i0f * i1f,
                        v[1].x * i0f * i1f, v[1].y * i0f * i1f, v[1].z * i0f * i1f, v[1].w * i0f * i1f};
    uint2 fr[2][3];
    stage_fragments<D::kBf, D>(f, fr);
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int pt = 0; pt < 3; ++pt) xs[((t * 2 + m) * J + 3 * b + pt) * 4 + g] = fr[m][pt];
  };
  auto max8 = [](const float4 (&v)[2]) {
    return fmaxf(fmaxf(fmaxf(fabsf(v[0].x), fabsf(v[0].y)), fmaxf(fabsf(v[0].z), fabsf(v[0].w))),
                 fmaxf(fmaxf(fabsf(v[1].x), fabsf(v[1].y)), fmaxf(fabsf(v[1].z), fabsf(v[1].w))));
  };
  if (units <= kStageHeld * kThreads) {  // block-uniform
    // One pass: the block's x (<= kStageHeld units a thread) is loaded once into registers, the
    // row maxima taken from them, and the parts written from them after the exponents' barrier
    // (the two-pass form below loads x twice: a second L2 round trip on the prologue's latency chain
    // before the first mma). The same values, the same maxima (fmaxf over the same set), the same parts.
    float4 v[kStageHeld][2];
#pragma unroll
    for (int j = 0; j < kStageHeld; ++j)
      if (tid + j * kThreads < units) load_unit(tid + j * kThreads, v[j]);
    float m[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) m[b] = 0.f;
#pragma unroll
    for (int j = 0; j < kStageHeld; ++j) {
      const int i = tid + j * kThreads;
      if (i >= units) break;
      normed_unit(i, v[j]);
      const float mm = max8(v[j]);
      const int b = i / q8;
#pragma unroll
      for (int bb = 0; bb < NB; ++bb)
        if (bb == b) m[bb] = fmaxf(m[bb], mm);
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      if (b >= nb) break;  // block-uniform
      float mb = m[b];
      for (int o = 16; o; o >>= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
      if (lane == 0) red[warp * NB + b] = mb;
    }
    __syncthreads();
    row_exponents();
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kStageHeld; ++j) {
      const int i = tid + j * kThreads;
      if (i >= units) break;
      put_unit(i, v[j]);
    }
    __syncthreads();
    return;
  }
  const int q4 = static_cast<int>(in / 4);
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    if (b >= nb) break;  // block-uniform
    const float4* xr = reinterpret_cast<const float4*>(xrow[b]);
    float m = 0.f;
    for (int i0 = tid; i0 < q4; i0 += 4 * kThreads) {
      float4 v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = i0 + j * kThreads;
        v[j] = i < q4 ? ld_x4<kGeneric>(xr + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (i0 + j * kThreads < q4) v[j] = val4(v[j], b, i0 + j * kThreads);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
    }
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp * NB + b] = m;
  }
  __syncthreads();
  row_exponents();
  __syncthreads();
  for (int i0 = tid; i0 < units; i0 += 2 * kThreads) {
    float4 v[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (i0 + j * kThreads < units) load_unit(i0 + j * kThreads, v[j]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = i0 + j * kThreads;
      if (i >= units) break;
      normed_unit(i, v[j]);
      put_unit(i, v[j]);
    }
  }
  __syncthreads();
}

// The multiplier 2^(sb - 127) of a tile's sum (sb its E8M0 byte) is taken on the fast path when sb is
// in the window of scale_fast (a property of the weight alone): then it is exact, the float with
// exponent bits sb. Otherwise the tile takes exact_tile. x row b's power of two 2^(e_b + kExp)
// multiplies the finished output (block_rows).
// One warp's task: W rows [o0, o0 + 16) (rows >= the end clamped for the loads; their sums unused)
// over tiles [t0, t1), against NB rows of x (NT = ceil(3 NB / 8) mma column tiles, one decoded A
// fragment per tile for all of them). prologue() issues the first U tiles' loads (before the block
// stages x, so the weights' latency overlaps the staging); run() streams the rest and accumulates
// acc[c] = sum over tiles of (column tile c's D fragment) * 2^(tile scale - 127), i.e. y * 2^-(e + kExp)
// for the column's x row.
// A D column's value is its own x row's dot with the tile whatever the other columns hold, so a
// row gets the same bits in any column of any NB (row-count invariance).
template <int NB>
struct Cols {
  static constexpr int J = 3 * NB, NT = (J + 7) / 8;
  // Blocks per SM the registers are budgeted for: 2 (128 registers a thread) up to 3 rows; from 4
  // rows the accumulators of 2-3 column tiles and both A fragments want more (spills at 128), and
  // their staged x mostly leaves one block per SM anyway.
  static constexpr int kMinBlocks = NB <= 3 ? 2 : 1;
};
// The blocks per SM a kernel's registers are budgeted for: Cols<NB>'s, or one for an InFlight format (launched
// at most one block per SM: its extra steps' registers are spare there).
template <class D, int NB>
struct MinBlocks {
  static constexpr int value = Cols<NB>::kMinBlocks;
};
template <class D, int U, int NB>
struct MinBlocks<InFlight<D, U>, NB> {
  static constexpr int value = 1;
};

// kRing: the weights stream through a shared-memory ring of `rd` stages per warp (2, 3 or 4) of
// D::kRingSteps steps each, filled by the bulk copy engine (one copy per W row and stage, completing
// on the stage's mbarrier; the scale words by cp.async, one group per stage) up to rd - 1 stages ahead
// of the one multiplied, instead of the U-step register ring: 4-5 KB per stage in flight per warp
// without registers or per-lane load instructions. The same bytes reach the same arithmetic, so the
// same bits.
template <class D, bool kFp8, int NB, bool kRing = false>
struct WarpTask {
  static constexpr int U = D::kU, NT = Cols<NB>::NT;
  // The next step's loads: rows r and r + 8 (ra, rb) and their scale bytes (sa, sb), advanced by one
  // step per tile() (pointer increments, no 64-bit index arithmetic per load).
  const uint8_t *ra, *rb, *sa, *sb;
  int s_shift;    // FP4: 8 x (scale row address % 4), see Fp4::load_at / funnel
  int64_t t0, n;  // steps (D::kSub tiles each)
  typename D::Raw q[kRing ? 1 : U];
  uint8_t* ring = nullptr;  // kRing: this warp's rd stages of D::kRingStageBytes
  uint64_t* bars = nullptr;  // kRing: the stages' mbarriers
  int rd = 0;
  // kRing: the task's rows and scales (issue()), the stage of the next step (slot, its first step
  // k0, the step's place j in it) and the parity each stage's next wait expects (bit per stage).
  const uint8_t *w_data = nullptr, *w_sc = nullptr;
  int64_t w_in = 0, w_o0 = 0, w_row_end = 0, r_k0 = 0;
  int r_slot = 0, r_j = 0, r_aux = 0;
  uint32_t parity = 0;

  __device__ __forceinline__ void prologue(const uint8_t* __restrict__ data, const uint8_t* __restrict__ sc,
                                           int64_t in, int64_t o0, int64_t row_end, int64_t t_begin,
                                           int64_t t_end) {
    const int lane = threadIdx.x & 31, r = lane >> 2, g = lane & 3;
    const int64_t oa = min(o0 + r, row_end - 1), ob = min(o0 + r + 8, row_end - 1);
    const int64_t tiles = in / 32;
    t0 = t_begin;
    n = t_end - t_begin;
    ra = D::row_ptr(data, in, oa, g) + t0 * D::kStepBytes;
    rb = D::row_ptr(data, in, ob, g) + t0 * D::kStepBytes;
    if constexpr (D::kScaleStep == 0) {  // BF16: no scales
      sa = sb = sc;
    } else if constexpr (kFp8) {
      sa = sc + (o0 >> 5) * ((in + 31) >> 5) + t0 * D::kScaleStep;  // the 16 rows share one row of tiles
      sb = sa;
    } else {
      sa = sc + oa * tiles + t0 * D::kScaleStep;
      sb = sc + ob * tiles + t0 * D::kScaleStep;
    }
    s_shift = 8 * static_cast<int>(reinterpret_cast<uintptr_t>(sa) & 3u);  // tiles % 4 == 0 on the FP4 path
    if constexpr (kRing) {
      // Stages 0 .. rd - 1 of the task (steps [u P, (u + 1) P), P = D::kRingSteps), one cp.async group
      // each (empty past n): a stage's first tile() then waits for all but the newest rd - 1 groups.
      w_data = data;
      w_sc = sc;
      w_in = in;
      w_o0 = o0;
      w_row_end = row_end;
      r_k0 = 0;
      r_slot = 0;
      r_j = 0;
      for (int u = 0; u < rd; ++u) issue(u, static_cast<int64_t>(u) * D::kRingSteps);
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u < n) q[u] = D::load_at(ra, rb, sa, sb, s_shift);
        advance();
      }
    }
  }

  // kRing: steps [k, k + P) of the task (those < n) into stage u: the bulk copies of its 16 rows (lane
  // i < 16 copies row o0 + i, clamped as the loads) on the stage's barrier, announced by lane 0
  // first; the scale words by cp.async. One cp.async group per call, also when nothing is left.
  __device__ __forceinline__ void issue(int u, int64_t k) {
    const int lane = threadIdx.x & 31;
    const int steps = static_cast<int>(min(static_cast<int64_t>(D::kRingSteps), n - k));
    if (steps > 0) {
      uint8_t* st = ring + u * D::kRingStageBytes;
      const unsigned bytes = static_cast<unsigned>(steps * D::kStepBytes);
      const int64_t step0 = (t0 + k) * D::kStepBytes;
      const uint8_t* row0 = w_data + min(w_o0, w_row_end - 1) * D::row_bytes(w_in) + step0;
      if ((reinterpret_cast<uintptr_t>(row0) & 15u) == 0) {
        if (lane == 0) dev::mbar_arrive_expect_tx(bars + u, 16 * bytes);
        __syncwarp();
        if (lane < 16)
          dev::bulk_copy_g2s(st + lane * D::kRingRowStride,
                             w_data + min(w_o0 + lane, w_row_end - 1) * D::row_bytes(w_in) + step0, bytes, bars + u);
      } else {
        // W not 16-byte aligned (the host's FP8 check asks for 8; an expert's rows are read on the
        // device): the warp copies the rows itself, then lane 0 arrives with nothing to expect.
        const int per_row = static_cast<int>(bytes / 8);
        for (int q = lane; q < 16 * per_row; q += 32) {
          const int i = q / per_row, c = q - i * per_row;
          *reinterpret_cast<uint2*>(st + i * D::kRingRowStride + 8 * c) = ld_nc<uint2>(
              w_data + min(w_o0 + i, w_row_end - 1) * D::row_bytes(w_in) + step0 + 8 * c);
        }
        __syncwarp();
        if (lane == 0) dev::mbar_arrive_expect_tx(bars + u, 0);
      }
      D::ring_scales(st + 16 * D::kRingRowStride, w_sc, w_in / 32, w_o0, w_row_end, (t0 + k) * D::kSub, steps);
    }
    dev::cp_async_commit();
  }

  __device__ __forceinline__ void advance() {
    ra += D::kStepBytes;
    rb += D::kStepBytes;
    sa += D::kScaleStep;
    if constexpr (!kFp8) sb += D::kScaleStep;
  }

  struct Adds {
    float v[NT][4];
  };

  // The tile in the oracle's arithmetic: each weight dequantized as the host does (one float product
  // with its scale, inf on overflow), times x (its parts added back, times 2^e), summed over the
  // lane's 8 K positions and the 4 lanes of a row; the sums go to the hi-part column of each x row.
  // Out of line: it is rare, and inlined at every tile it made the kernel ~17 K instructions long
  // (ncu: 15-17 % of the warps' stall samples were instruction fetch, "no_inst").
  __device__ DS41_TCG_NOINLINE static Adds exact_tile(typename D::Q cur, uint32_t sra, uint32_t srb, const uint2* xs,
                                                      int J, int64_t t, const int* ex) {
    const int lane = threadIdx.x & 31, g = lane & 3, nb = J / 3;
    float tot[2][NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) tot[0][b] = tot[1][b] = 0.f;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int sl = 0; sl < 4; ++sl) {
        const int idx = D::kofs(m, sl);
        const float wa = D::dequant(cur, 0, idx, sra), wb = D::dequant(cur, 1, idx, srb);
#pragma unroll
        for (int b = 0; b < NB; ++b) {
          if (b >= nb) break;
          float part[3];
#pragma unroll
          for (int p = 0; p < 3; ++p) {
            const uint2 v = xs[((t * 2 + m) * J + 3 * b + p) * 4 + g];
            part[p] = part_float<D::kBf>((sl < 2 ? v.x : v.y) >> (16 * (sl & 1)));
          }
          const float xv = scalbnf((part[0] + part[1]) + part[2], ex[b]);
          tot[0][b] = __fadd_rn(tot[0][b], __fmul_rn(wa, xv));
          tot[1][b] = __fadd_rn(tot[1][b], __fmul_rn(wb, xv));
        }
      }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1)
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        tot[0][b] += __shfl_xor_sync(0xffffffffu, tot[0][b], o);
        tot[1][b] += __shfl_xor_sync(0xffffffffu, tot[1][b], o);
      }
    Adds add;
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) add.v[c][i] = 0.f;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      // The hi column of x row b: column tile j / 8, lane group (j % 8) / 2, D entry j % 2 (+2 for row r + 8),
      // in the accumulator's units (y * 2^-(e_b + kExp); block_rows multiplies them back).
      const int j = 3 * b, c = j >> 3, jj = j & 7;
      if (b < nb && g == (jj >> 1)) {
        add.v[c][jj & 1] += scalbnf(tot[0][b], -(ex[b] + D::kExp));
        add.v[c][2 + (jj & 1)] += scalbnf(tot[1][b], -(ex[b] + D::kExp));
      }
    }
    return add;
  }

  // Per task: where the lane's B fragments are.
  struct Fast {
    const uint2* b;             // the lane's B fragment of the next tile (column tile 0, m = 0; m = 1 at + 4J)
    int coff[NT];               // column tile c's fragment at b + coff[c]
    int bstride;                // uint2 per tile: 2 mmas x J columns x 4 lane groups
  };

  // One tile on the fast path: the decoded A fragments times every column tile's B fragments at bp, the
  // sum times 2^(scale - 127) into acc: one exact power of two (FP8: the tile's scale; FP4: rows r and r + 8
  // each their own).
  // b00, b10: column tile 0's fragments (bp[0], bp[4 J]), loaded by the caller (before its branch, where it has one).
  __device__ __forceinline__ static void fast_tile(const typename D::Q& w, uint32_t sc0, uint32_t sc1, const uint2* bp,
                                                   uint2 b00, uint2 b10, const Fast& f, int J, float (&acc)[NT][4]) {
    uint32_t a0[4], a1[4];
    D::frags(w, a0, a1);
    const float m0 = __uint_as_float(sc0 << 23), m1 = __uint_as_float(sc1 << 23);
#pragma unroll
    for (int c = 0; c < NT; ++c) {
      const uint2 b0 = c == 0 ? b00 : bp[f.coff[c]], b1 = c == 0 ? b10 : bp[f.coff[c] + 4 * J];
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      mma_16816<D::kBf>(d, a0, b0.x, b0.y);
      mma_16816<D::kBf>(d, a1, b1.x, b1.y);
      acc[c][0] = __fmaf_rn(d[0], m0, acc[c][0]);
      acc[c][1] = __fmaf_rn(d[1], m0, acc[c][1]);
      acc[c][2] = __fmaf_rn(d[2], m1, acc[c][2]);
      acc[c][3] = __fmaf_rn(d[3], m1, acc[c][3]);
    }
  }

  // A step whose vote failed, tile by tile: a tile that passes the scale window alone as fast_tile, another
  // in the oracle's arithmetic (exact_tile: a scale that can overflow a dequantized weight, where the oracle's
  // fl(w * s) is inf, a NaN scale, or a multiplier outside the normal floats; rare). f.b advances past the
  // step. t: the step's first tile.
  __device__ __forceinline__ static void step_tiles(const typename D::Raw& cur, Fast& f, int J, int64_t t,
                                                    const uint2* xs, const int* ex, float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < D::kSub; ++j) {
      const typename D::Q w = D::sub(cur, j);
      const uint32_t sc0 = D::scale_a(cur, j), sc1 = D::scale_b(cur, j);
      const uint2* bp = f.b;
      f.b += f.bstride;
      const bool fast = __all_sync(0xffffffffu, scale_fast(sc0) && scale_fast(sc1));
      if (fast) {
        fast_tile(w, sc0, sc1, bp, bp[0], bp[4 * J], f, J, acc);
      } else {
        const Adds add = exact_tile(w, sc0, sc1, xs, J, t + j, ex);
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[c][i] += add.v[c][i];
      }
    }
  }

  // Step t0 + k from registers q[u] (u = k % U); the loads of step k + U (if any) issued before it
  // is multiplied; its kSub tiles one by one. The arithmetic is the one documented at the top:
  // d = mma(m = 0) then mma(m = 1) from zero, acc = fma(d, 2^(scale - 127), acc), tile by tile, for
  // every column tile with the one decoded A fragment. The scale window is tested once per step (all
  // its tiles, one vote; FP8 / BF16: uniform over the warp, no vote); a tile is tested alone only in a
  // step that fails it (rare).
  __device__ __forceinline__ void tile(int u, int64_t k, const uint2* xs, int J, Fast& f, const int* ex,
                                       float (&acc)[NT][4]) {
    typename D::Raw cur;
    uint8_t* st = nullptr;
    if constexpr (kRing) {
      st = ring + r_slot * D::kRingStageBytes;
      if (r_j == 0) {  // the stage's first step: its rows (barrier) and scale words (cp.async group)
        dev::mbar_wait_parity(bars + r_slot, (parity >> r_slot) & 1u);
        parity ^= 1u << r_slot;
        dev::cp_async_wait_ring(rd);
        __syncwarp();  // the scale words were copied by other lanes
        r_aux = D::ring_aux(D::ring_scale_at(w_sc, w_in / 32, w_o0, w_row_end, (t0 + r_k0) * D::kSub, 0), s_shift);
      }
      cur = D::ring_read(st, r_j, r_aux);
    } else {
      cur = q[u];
#if !DS41_TCG_LOAD_AFTER_PREPARE
      if (k + U < n) q[u] = D::load_at(ra, rb, sa, sb, s_shift);
      advance();
#endif
    }
    D::prepare(cur, s_shift, kRing);
#if DS41_TCG_LOAD_AFTER_PREPARE
    // The loads of step k + U after prepare() (FP4 / Fp8x2: the quad transposes and the scale funnels write
    // new registers, so q[u]'s are dead): the loads may then land in q[u]'s own registers, where loading
    // before prepare() kept both alive and the two-step ring paid ~30 register moves per step (SASS,
    // docs/perf/README.md, session of 2026-12-07 07:09 UTC). The same loads, a few dozen instructions later.
    if constexpr (!kRing) {
      if (k + U < n) q[u] = D::load_at(ra, rb, sa, sb, s_shift);
      advance();
    }
#endif
    bool step_fast = D::step_fast(cur);
    if constexpr (!D::kUniformScale) step_fast = __all_sync(0xffffffffu, step_fast);
    // FP4 (issue-bound: ~65 warp instructions per tile, the FP8 kernels ~45): a step whose tiles are all on
    // the fast path (nearly every step) runs them straight, without a branch between tiles; another step
    // tests each tile (step_tiles, the same arithmetic). The FP8 / BF16 kernels keep the per-tile test in
    // the loop (the straight form spilled there at 128 registers).
    if constexpr (DS41_TCG_STEP_FAST && std::is_same_v<D, Fp4>) {
      if (step_fast) {
#pragma unroll
        for (int j = 0; j < D::kSub; ++j)
        {
          const uint2* bp = f.b + j * f.bstride;
          fast_tile(D::sub(cur, j), D::scale_a(cur, j), D::scale_b(cur, j), bp, bp[0], bp[4 * J], f, J, acc);
        }
      } else {
        Fast g = f;
        step_tiles(cur, g, J, (t0 + k) * D::kSub, xs, ex, acc);
      }
      f.b += D::kSub * f.bstride;
    } else {
#pragma unroll
      for (int j = 0; j < D::kSub; ++j) {
        const typename D::Q w = D::sub(cur, j);
        const uint32_t sc0 = D::scale_a(cur, j), sc1 = D::scale_b(cur, j);
        const uint2* bp = f.b;
        const uint2 b00 = bp[0], b10 = bp[4 * J];  // column tile 0's fragments, loaded before the branch
        f.b += f.bstride;
        bool fast = step_fast;
        if (D::kSub > 1 && !fast) fast = __all_sync(0xffffffffu, scale_fast(sc0) && scale_fast(sc1));
        if (fast) {
          fast_tile(w, sc0, sc1, bp, b00, b10, f, J, acc);
        } else {
          const int64_t t = (t0 + k) * D::kSub + j;
          const Adds add = exact_tile(w, sc0, sc1, xs, J, t, ex);
#pragma unroll
          for (int c = 0; c < NT; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[c][i] += add.v[c][i];
        }
      }
    }
    if constexpr (kRing) {  // the stage's last step: refill it with the stage rd further on
      if (++r_j == D::kRingSteps || k + 1 == n) {
        __syncwarp();  // every lane has read it
        issue(r_slot, r_k0 + static_cast<int64_t>(rd) * D::kRingSteps);
        r_k0 += D::kRingSteps;
        r_j = 0;
        r_slot = r_slot + 1 == rd ? 0 : r_slot + 1;
      }
    }
  }

  __device__ __forceinline__ void run(const uint2* xs, int J, const int* ex, float (&acc)[NT][4]) {
    const int lane = threadIdx.x & 31, r = lane >> 2, g = lane & 3;
    Fast f;
    // B column 8c + r of the mma: x column 8c + r where < J; lanes of columns >= J read column J - 1
    // (their D columns are never read: no zero fill, no predicate per tile).
    const int col0 = min(r, J - 1);
    f.b = xs + ((t0 * D::kSub * 2) * J + col0) * 4 + g;
#pragma unroll
    for (int c = 0; c < NT; ++c) f.coff[c] = (min(8 * c + r, J - 1) - col0) * 4;
    f.bstride = 8 * J;
    // Unrolled by U (the FP4 loop's SASS has ~5 register moves per tile for the ring; unrolling by 2U
    // to let the registers alternate spilled at 128 registers and was 5-17 % slower on the H200).
    const int64_t full = n - n % U;
    for (int64_t i = 0; i < full; i += U) {
#pragma unroll
      for (int u = 0; u < U; ++u) tile(u, i + u, xs, J, f, ex, acc);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (full + u < n) tile(u, full + u, xs, J, f, ex, acc);
  }
};

// What the block's reduction writes instead of y (linear_epilogue.h), pointers at the block's first row:
// - a pair with its SwiGLU (data2 set; try_dense / try_experts with a SwigluEpilogue): both matrices in
//   one block, warps [0, 4) on the first (data, sc) and [4, 8) on the second (data2, sc2) over the same
//   row groups (KS <= 4 warps per row group each), and act = row_scale[b] * swiglu(g, u)
//   (dev::swiglu_value) instead of g and u: the values the pair gives (each row group's sums are its KS
//   warps' in the same order) and then swiglu_kernel's operations, without the SwiGLU's launch or the
//   round trip of g and u through memory. act rows b of the block at act + b * ld; row_scale
//   (nullable) indexed by b.
// - the mHC expand (streams set; try_dense with an HcExpandEpilogue): output o of row b goes into the
//   row's c streams (streams + b * c * h, post + b * c, comb + b * c * c; h = the output width) with
//   dev::hc_expand_channel, hc_expand_kernel's operations, without its launch.
struct Epilogue {
  const uint8_t* data2 = nullptr;  // null: not a fused pair
  const uint8_t* sc2 = nullptr;
  float* act = nullptr;
  const float* row_scale = nullptr;
  float limit = 0.f;
  int64_t ld = 0;
  float* streams = nullptr;  // null: no expand
  const float* post = nullptr;
  const float* comb = nullptr;
  int64_t c = 0, h = 0;
};

// The block's row groups: iteration rgb covers row groups [rgb * RPB, +RPB), KS warps each; the
// partial D fragments meet in red_d, and nb x 16 x RPB outputs are written. The first iteration's
// weight loads are issued before stage() (the block's x staging; called once by every thread; the
// dense kernel's PDL wait is in it with the early start).
template <class D, bool kFp8, int NB, bool kRing, class Stage>
__device__ void block_rows(const uint8_t* data, const uint8_t* sc, int64_t in, int64_t out_rows, int64_t w_row0,
                           int ks_log2, const uint2* xs, int nb, const int* ex, float* __restrict__ y,
                           int64_t ldy, float* red_d, uint8_t* ring, int ring_depth, int64_t slot, int64_t n_slots,
                           Stage stage, bool stage_first = false, const Epilogue& sw = Epilogue{}) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // fused (block-uniform): the pair's SwiGLU (Epilogue), half the warps per matrix.
  const bool fused = sw.data2 != nullptr;
  const int half = fused ? kWarps / 2 : kWarps, mat = warp / half, wm = warp - mat * half;
  const int KS = 1 << ks_log2, RPB = half >> ks_log2;
  const int kp = wm & (KS - 1), rgl = wm >> ks_log2;
  if (mat != 0) {
    data = sw.data2;
    sc = sw.sc2;
  }
  const int64_t steps = in / (32 * D::kSub), n_rg = (out_rows + 15) / 16, n_rgb = (n_rg + RPB - 1) / RPB;
  const int64_t t0 = steps * kp / KS, t1 = steps * (kp + 1) / KS;
  const int J = 3 * nb;
  // The W rows of this launch start at global row w_row0 (a group's first row): FP8 scale rows are
  // global (w_row0 % 16 == 0 is required by the host), payload rows too. The loads of a warp's next
  // task are issued as soon as its current one is multiplied, before the block's reduction.
  constexpr int NT = Cols<NB>::NT;
  WarpTask<D, kFp8, NB, kRing> task;
  if constexpr (kRing) {  // the ring's region: the warps' barriers, then their stages
    task.bars = reinterpret_cast<uint64_t*>(ring) + warp * kMaxRingDepth;
    task.ring = ring + kRingBarBytes + warp * ring_depth * D::kRingStageBytes;
    task.rd = ring_depth;
    if (lane == 0)
      for (int u = 0; u < ring_depth; ++u) dev::mbar_init(task.bars + u, 1);
    dev::mbar_init_fence();
    __syncwarp();
  }

  // stage_first (experts, DS41_TCG_EXPERT_STAGE_FIRST=1): x staged before the first weight loads go out,
  // so that the row index and x loads are not queued behind every block's weight stream (the expert
  // GEMV's profile: 38 % of its stall samples before the main loop, the x-row barrier and the row-maximum
  // loads the largest). The same values either way.
  if (stage_first) stage();
  if (slot < n_rgb && slot * RPB + rgl < n_rg)
    task.prologue(data, sc, in, w_row0 + (slot * RPB + rgl) * 16, w_row0 + out_rows, t0, t1);
  if (!stage_first) stage();
  for (int64_t rgb = slot; rgb < n_rgb; rgb += n_slots) {
    const int64_t rg = rgb * RPB + rgl, rg_next = (rgb + n_slots) * RPB + rgl;
    float acc[NT][4];
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][i] = 0.f;
    if (rg < n_rg) task.run(xs, J, ex, acc);
    if (rgb + n_slots < n_rgb && rg_next < n_rg)
      task.prologue(data, sc, in, w_row0 + rg_next * 16, w_row0 + out_rows, t0, t1);
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) red_d[((warp * 32 + lane) * NT + c) * 4 + i] = acc[c][i];
    __syncthreads();
    for (int q = tid; q < RPB * 16 * nb; q += kThreads) {
      const int rl = q / (16 * nb), rem = q - rl * 16 * nb, b = rem >> 4, row = rem & 15;
      const int64_t o = (rgb * RPB + rl) * 16 + row;
      if (rl + rgb * RPB < n_rg && o < out_rows) {
        // Matrix m's output (its warps from m * half): the KS partial sums of each part in order,
        // then x row b's power of two (and FP4's 2^14) on the finished sum: exact wherever y is normal.
        auto out = [&](int m) {
          float part[3];
#pragma unroll
          for (int p = 0; p < 3; ++p) {
            const int j = 3 * b + p, c = j >> 3, jj = j & 7, ln = 4 * (row & 7) + (jj >> 1),
                      i = (row >= 8 ? 2 : 0) + (jj & 1);
            float sum = 0.f;
            for (int k = 0; k < KS; ++k)
              sum += red_d[((((m * half) + (rl << ks_log2) + k) * 32 + ln) * NT + c) * 4 + i];
            part[p] = sum;
          }
          return scalbnf(part[0] + (part[1] + part[2]), ex[b] + D::kExp);
        };
        if (fused) {
          const float a = dev::swiglu_value(out(0), out(1), sw.limit);
          sw.act[b * sw.ld + o] = sw.row_scale != nullptr ? __fmul_rn(sw.row_scale[b], a) : a;
        } else if (sw.streams != nullptr) {
          dev::hc_expand_channel(sw.streams + b * sw.c * sw.h, out(0), sw.post + b * sw.c, sw.comb + b * sw.c * sw.c,
                                 sw.c, sw.h, o);
        } else {
          y[b * ldy + o] = out(0);
        }
      }
    }
    __syncthreads();
  }
  if constexpr (kRing) dev::cp_async_wait<0>();  // no copy outlives the block (all are empty by now)
}

// Two weights of one input width and format over the same x with their own output widths, in one launch
// (try_dense_dual: the attention's wq_a and wkv of a decode step): the grid's slots [0, slots1) run the
// first weight as its own launch would (its KS, its slots), [slots1, slots1 + slots2) the second into y2
// (rows of ldy2 floats), so each output's bits are those of its own launch. out_rows2 = 0: not dual.
struct Dual {
  int64_t out_rows2 = 0, ldy2 = 0;
  int ks2 = 0, slots1 = 0, slots2 = 0;
};

// A site's map carried as extra blocks of a GEMV launch (HcMapFold, hc_site_map_device.cuh): the grid's first `rows`
// layers (the expert kernel: rows of y before its units; the dense kernel: layers of z before its groups), so that
// the scheduler dispatches them first; block b of them (x fastest) is map block b where b < blocks, the rest wait
// and exit.
struct MapArgs {
  HcSiteArgs site;
  int64_t splits = 0, steps = 0, blocks = 0;
  int rows = 0;  // 0: none
};
__device__ __forceinline__ void map_rows_block(const MapArgs& mp, int64_t b) {
  dev::pdl_enter();  // the streams: a kernel earlier in the stream wrote them
  if (b < mp.blocks) dev::hc_site_map_block<3, true, 4>(mp.site, mp.splits, mp.steps, b);
}

// ring_depth (kRing): the stages per warp of the weight ring, in the dynamic shared memory past the
// reduction's (smem_bytes(in, NB) + kRingBarBytes + kWarps x ring_depth x D::kRingStageBytes in all).
// kMap: the grid's first mp.rows z layers carry a site's map (MapArgs), the GEMV's follow.
template <class D, bool kFp8, int NB, bool kRing, bool kMap = false>
__global__ void __launch_bounds__(kThreads, MinBlocks<D, NB>::value)
    tc_dense_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ sc, int64_t in, int64_t out_rows,
                    const float* __restrict__ x, int64_t ldx, int64_t n, float* __restrict__ y, int64_t ldy,
                    int ks_log2, const uint8_t* __restrict__ data2, const uint8_t* __restrict__ sc2,
                    float* __restrict__ y2, int ring_depth, RowNorm norm, bool early, Epilogue sw, Dual du,
                    MapArgs mp) {
  // The map's layers first (the block scheduler dispatches them before the GEMV's persistent blocks, which fill
  // the SMs: behind them the map, its finisher's serial tail included, would start only as the GEMV drains).
  unsigned bz = blockIdx.z;  // the GEMV's layer
  if constexpr (kMap) {
    if (blockIdx.z < static_cast<unsigned>(mp.rows)) {  // block-uniform
      map_rows_block(mp, (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
      return;
    }
    bz -= static_cast<unsigned>(mp.rows);
  }
  // PDL (pdl.cuh): with `early` (early_on) the first task's weight loads go out before the wait (the
  // weights are written by no kernel), so they stream while the previous kernel finishes; x, the norm
  // and y are touched only after it (in the staging).
  if (!early) dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  uint2* smem_u2 = reinterpret_cast<uint2*>(smem);
  __shared__ float red[kWarps * NB];
  __shared__ int ex[NB];
  float* red_d = reinterpret_cast<float*>(smem_u2 + (in / 32) * 8 * Cols<NB>::J);
  // Grid (x-row units of NB, slots, groups): the blocks of one slot's W rows for every unit are
  // consecutive (run together, W from L2 for all but the first). Measured neutral against slots
  // first (wq_b 8 rows 62.4 vs 62.5 us): a pair's cost is its own decode of W into fragments.
  // A pair (data2 set: one group, z = 1 the second weight over the same x, into y2) or z = the group.
  // sw.act set: the pair with its SwiGLU in every block (grid z = 1; Epilogue), rows of act from r0;
  // sw.streams set: the expand into the streams of rows from r0.
  const bool fused = sw.act != nullptr, expand = sw.streams != nullptr, dual = du.out_rows2 > 0;
  const bool second = dual ? static_cast<int>(blockIdx.y) >= du.slots1 : !fused && data2 != nullptr && bz != 0;
  const int64_t slot = dual && second ? blockIdx.y - du.slots1 : blockIdx.y;
  const int64_t n_slots = dual ? (second ? du.slots2 : du.slots1) : gridDim.y;
  const int64_t rows = dual && second ? du.out_rows2 : out_rows, ldo = dual && second ? du.ldy2 : ldy;
  const int ks = dual && second ? du.ks2 : ks_log2;
  const int64_t grp = second || fused ? 0 : bz, r0 = static_cast<int64_t>(blockIdx.x) * NB;
  const int nb = static_cast<int>(min(static_cast<int64_t>(NB), n - r0));
  const float* xb = x + r0 * ldx + grp * in;
  uint8_t* ring = reinterpret_cast<uint8_t*>(red_d + 4 * Cols<NB>::NT * kThreads);
  Epilogue ps;
  if (fused)
    ps = Epilogue{data2, sc2, sw.act + r0 * sw.ld, sw.row_scale ? sw.row_scale + r0 : nullptr, sw.limit, sw.ld};
  if (expand) {
    ps.streams = sw.streams + r0 * sw.c * sw.h;
    ps.post = sw.post + r0 * sw.c;
    ps.comb = sw.comb + r0 * sw.c * sw.c;
    ps.c = sw.c;
    ps.h = sw.h;
  }
  block_rows<D, kFp8, NB, kRing>(second ? data2 : data, second ? sc2 : sc, in, rows, grp * out_rows, ks,
                                 smem_u2, nb, ex,
                                 fused || expand ? nullptr : (second ? y2 : y) + r0 * ldo + grp * out_rows, ldo,
                                 red_d, ring, ring_depth, slot, n_slots,
                                 [&] {
                                   if (early) dev::pdl_enter();
                                   stage_x<D, NB>(xb, ldx, nb, in, smem_u2, red, ex, nullptr, norm);
                                 },
                                 false, ps);
}

// The shared expert's units in a routed launch (SharedUnits, try_experts): grid rows [0, units x reps), unit
// su = blockIdx.y / reps (x rows [su NB, su NB + NB)), its row-group batches over the reps x gridDim.x blocks of
// the unit (persistent, as a dense launch's slots: a row's sums do not depend on the slots). The weight is a
// dense FP8 one (DS: Fp8x2) at the warps per row group its dense call takes (ks_log2), so its bits are that
// call's. data2 set: a pair with its SwiGLU (the launch's Epilogue limit, no row scale) into y as act.
struct SharedArgs {
  const uint8_t* data = nullptr;
  const uint8_t* sc = nullptr;
  const uint8_t* data2 = nullptr;
  const uint8_t* sc2 = nullptr;
  const float* x = nullptr;  // [n, in]
  int64_t n = 0;
  float* y = nullptr;  // [n, out_dim]
  int ks_log2 = 0;
  int units = 0, reps = 0;  // 0: none
};

// Experts: unit u = (expert, <= NB of its rows); unit_start[e] = units before expert e. blockIdx.z
// picks the matrix: 0 = weights into y, 1 = weights2 into y2 (a pair over the same rows of x: the
// MoE's w1 and w3 in one launch). DS (not void): the shared expert's units first (SharedArgs), then the
// routed ones.
template <class D, bool kFp8, int NB, bool kRing, class DS = void>
__global__ void __launch_bounds__(kThreads, Cols<NB>::kMinBlocks)
    tc_expert_kernel(const DeviceWeight* __restrict__ weights, const DeviceWeight* __restrict__ weights2,
                     int64_t n_experts, int64_t out_dim, int64_t in, const int64_t* __restrict__ offsets,
                     const float* __restrict__ x, const int64_t* __restrict__ x_rows, float* __restrict__ y,
                     float* __restrict__ y2, int ks_log2, int ring_depth, bool stage_first, bool early,
                     Epilogue sw, SharedArgs sh, MapArgs mp) {
  // PDL (pdl.cuh, launch.h): offsets and x_rows (the routing's) say which weights. Without `early` they
  // may come from the previous kernel, so nothing is loaded before the wait. With `early` (the routing
  // was written two or more launches back: launch.h contract 3; the MoE's w2 after its pair) the unit
  // lookup reads them through L2 and the first task's weight loads go out before the wait, which
  // precedes the x staging (x, the pair's act, is the previous kernel's): the lookup's round trips and
  // the first loads' latency overlap the previous kernel's tail. A shared unit's block reads no routing:
  // its first weight loads always go out before the wait (its x staging waits).
  // DS (not void): the grid's rows of y are the carried site map's (mp.rows), then the shared units', then the
  // routed units'.
  const int map_rows = std::is_void_v<DS> ? 0 : mp.rows;
  const int n_shared = std::is_void_v<DS> ? 0 : sh.units * sh.reps;
  const int yb = static_cast<int>(blockIdx.y) - map_rows;  // the row past the map's
  if (!early && yb >= n_shared) dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  uint2* smem_u2 = reinterpret_cast<uint2*>(smem);
  __shared__ float red[kWarps * NB];
  __shared__ int ex[NB];
  float* red_d = reinterpret_cast<float*>(smem_u2 + (in / 32) * 8 * Cols<NB>::J);
  if constexpr (!std::is_void_v<DS>) {
    if (yb < 0) {  // block-uniform
      map_rows_block(mp, static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x);
      return;
    }
    if (yb < n_shared) {  // block-uniform
      const int su = yb / sh.reps, rep = yb - su * sh.reps;
      const int64_t r0 = static_cast<int64_t>(su) * NB;
      const int nb = static_cast<int>(min(static_cast<int64_t>(NB), sh.n - r0));
      Epilogue ps;
      if (sh.data2 != nullptr) ps = Epilogue{sh.data2, sh.sc2, sh.y + r0 * out_dim, nullptr, sw.limit, out_dim};
      block_rows<DS, true, NB, false>(sh.data, sh.sc, in, out_dim, 0, sh.ks_log2, smem_u2, nb, ex,
                                      sh.data2 != nullptr ? nullptr : sh.y + r0 * out_dim, out_dim, red_d, nullptr, 0,
                                      static_cast<int64_t>(rep) * gridDim.x + blockIdx.x,
                                      static_cast<int64_t>(sh.reps) * gridDim.x,
                                      [&] {
                                        dev::pdl_enter();
                                        stage_x<DS, NB>(sh.x + r0 * in, in, nb, in, smem_u2, red, ex);
                                      },
                                      false, ps);
      return;
    }
  }
  __shared__ int wtot[kWarps];
  __shared__ const uint8_t* unit_w[4];  // the unit's weight: payload, scales (fused: then the second's)
  __shared__ const float* unit_x[NB];   // its rows of x
  __shared__ int64_t unit_r0;           // its first routed row
  __shared__ int unit_nb;
  // Unit u = blockIdx.y: the u-th (expert, <= NB of its routed rows) in expert order, unit_start[e] =
  // sum over e' < e of ceil(rows_e' / NB). The lookup is on the latency chain before any weight load
  // (the profile: the former scan by warp 0, 12 experts' offsets per lane one after another, then a
  // binary search, then the expert's weight pointers, then the row indices, each a round trip): every
  // thread loads its <= kPer experts' offsets at once, one shuffle scan, and the thread whose expert
  // holds u loads the weight pointers and the row indices together (one more round trip).
  constexpr int kPer = kMaxExperts / kThreads;
  const int u = yb - n_shared;
  {
    const dev::ThreadRange tr = dev::thread_range(n_experts);  // <= kPer experts per thread
    int64_t o[kPer + 1];
#pragma unroll
    for (int i = 0; i <= kPer; ++i) o[i] = tr.begin + i <= tr.end ? __ldcg(offsets + tr.begin + i) : 0;
    int s = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (tr.begin + i < tr.end) s += static_cast<int>((o[i + 1] - o[i] + NB - 1) / NB);
    int total = 0;
    int run = dev::block_exclusive_scan_shfl(s, wtot, &total);
    if (u >= total) {  // block-uniform
      if (early) dev::pdl_enter();  // waits before it exits (launch.h contract 3 for the next kernel)
      return;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      if (tr.begin + i >= tr.end) break;
      const int c = static_cast<int>((o[i + 1] - o[i] + NB - 1) / NB);
      if (u >= run && u < run + c) {  // one thread of the block
        const int64_t e = tr.begin + i, r0 = o[i] + static_cast<int64_t>(u - run) * NB;
        const int nb = static_cast<int>(min(static_cast<int64_t>(NB), o[i + 1] - r0));
        const DeviceWeight& dw = (blockIdx.z != 0 ? weights2 : weights)[e];
        const DeviceWeight* dw2 = sw.act != nullptr ? weights2 + e : nullptr;
        int64_t xr[NB];
#pragma unroll
        for (int b = 0; b < NB; ++b) xr[b] = b < nb ? (x_rows ? __ldcg(x_rows + r0 + b) : r0 + b) : 0;
        unit_w[0] = dw.data;
        unit_w[1] = dw.scale;
        unit_w[2] = dw2 != nullptr ? dw2->data : nullptr;
        unit_w[3] = dw2 != nullptr ? dw2->scale : nullptr;
#pragma unroll
        for (int b = 0; b < NB; ++b) unit_x[b] = x + xr[b] * in;
        unit_r0 = r0;
        unit_nb = nb;
      }
      run += c;
    }
  }
  __syncthreads();
  const int nb = unit_nb;
  const int64_t r0 = unit_r0;
  const bool fused = sw.act != nullptr, second = !fused && blockIdx.z != 0;
  Epilogue ps;  // fused: w1 and w3 of the unit in this block, act rows from r0
  if (fused)
    ps = Epilogue{unit_w[2], unit_w[3], sw.act + r0 * sw.ld, sw.row_scale ? sw.row_scale + r0 : nullptr, sw.limit,
                    sw.ld};
  uint8_t* ring = reinterpret_cast<uint8_t*>(red_d + 4 * Cols<NB>::NT * kThreads);
  block_rows<D, kFp8, NB, kRing>(unit_w[0], unit_w[1], in, out_dim, 0, ks_log2, smem_u2, nb, ex,
                                 fused ? nullptr : (second ? y2 : y) + r0 * out_dim, out_dim, red_d, ring, ring_depth,
                                 blockIdx.x, gridDim.x,
                                 [&] {
                                   if (early) dev::pdl_enter();
                                   stage_x<D, NB>(x, in, nb, in, smem_u2, red, ex, nullptr, RowNorm{}, unit_x);
                                 },
                                 stage_first, ps);
}

// The MoE's entry at one row (MoeEntryArgs, fused_moe_kernels.h): the gate's one-row dense GEMV whose
// staging first collapses and normalizes the row itself (CollapseRow, linear_epilogue.h): every block the
// same floats with dev::collapse_norm_quads (hc_collapse_norm_quads_kernel's code), the first block also
// writing them to c.x for the MoE's other readers, then stage_x over them with generic loads. The grid is
// try_dense's one-row call of the gate (the same KS, so the same logits bits as the collapse launch
// followed by the plain GEMV). The block that finishes last (an atomic counter, reset by it) routes and
// buckets the row (moe::route_row + moe::bucket_pairs, run_moe_route's code). With `early` the first weight
// loads go out before the PDL wait. Three launches of the decode step's critical path in one: the FFN
// site's collapse, the gate, the router. (The same collapse inside the attention site's wq_a and wkv
// launches measured slower and was removed: docs/gpu_kernels.md.)
// split_route (DS41_ENTRY_SPLIT_ROUTE=1, opt-in, not timed yet; the host checks entry_split_route_fits): the
// routing's first stage in the gate's blocks instead of the last block's tail. ncu (H100, session of
// 2026-12-07 14:51 UTC) put that tail, one block's serial program (the fp64 softplus of 384 experts, two
// stages of k picks, the weights, the bucketing), at ~12-13 us of every layer's chain. Here warp 0 of each
// block scores its own <= 32 experts right after its GEMV (one softplus chain per lane, route_row's
// expressions) and writes its k best as pick_key64 keys in pick order with their scores to the workspace;
// the last block's warp 0 then picks k times over the blocks' lists (lane b holds block b's, best first), and
// the weights are route_row's expressions of the same scores in the same order. The global k best are among
// the blocks' k best, so the picks, weights and bucketing are the same bits.
constexpr int kSplitRouteMaxBlocks = 32;  // one lane per gate block in the tail
__device__ __forceinline__ uint64_t* split_route_keys(void* ws) { return static_cast<uint64_t*>(ws); }
__device__ __forceinline__ float* split_route_scores(void* ws, int blocks) {
  return reinterpret_cast<float*>(split_route_keys(ws) + static_cast<int64_t>(blocks) * moe::kPickMaxK);
}

// Warp 0 of gate block `blk` (rows [row0, row0 + nrows) of the logits, nrows <= 32, its own output): the
// block's k best (biased score, index) keys in pick order, then none, with their unbiased scores.
__device__ __forceinline__ void split_route_block(const MoeRouteArgs& ra, const float* logits, int64_t row0, int nrows,
                                                  int blk, int blocks) {
  const int lane = threadIdx.x & 31;
  const float* bvec = moe::row_bias(ra.bias, ra.bias_vl, ra.vl, 0);
  float s = 0.0f;
  uint64_t key = 0;
  if (lane < nrows) {
    const int64_t e = row0 + lane;
    s = sqrtf(moe::softplus_ref(__fdiv_rn(logits[e], ra.temp)));
    const float b = __fadd_rn(s, bvec ? bvec[e] : 0.0f);
    key = b != -__int_as_float(0x7f800000) ? moe::pick_key64(b, static_cast<int>(e)) : 0;  // -inf never picked
  }
  uint64_t* keys = split_route_keys(ra.workspace) + static_cast<int64_t>(blk) * moe::kPickMaxK;
  float* scores = split_route_scores(ra.workspace, blocks) + static_cast<int64_t>(blk) * moe::kPickMaxK;
  for (int j = 0; j < moe::kPickMaxK; ++j) {
    const uint64_t best = j < ra.k ? moe::warp_max_key64(key) : 0;
    const int win = best != 0 ? __ffs(__ballot_sync(0xffffffffu, key == best)) - 1 : -1;
    const float sw = __shfl_sync(0xffffffffu, s, win < 0 ? 0 : win);
    if (lane == 0) {
      keys[j] = best;
      scores[j] = best != 0 ? sw : 0.0f;
    }
    if (lane == win) key = 0;
  }
}

// Warp 0 of the last block: the k picks over the blocks' lists, the weights (route_row's), into sm (sel, wsel)
// and the outputs; the caller buckets.
__device__ __forceinline__ void split_route_tail(const MoeRouteArgs& ra, int blocks, moe::RouterSmem& sm) {
  const int lane = threadIdx.x & 31;
  const int64_t k = ra.k;
  uint64_t ck[moe::kPickMaxK];
  float cs[moe::kPickMaxK];
  const uint64_t* keys = split_route_keys(ra.workspace) + static_cast<int64_t>(lane) * moe::kPickMaxK;
  const float* scores = split_route_scores(ra.workspace, blocks) + static_cast<int64_t>(lane) * moe::kPickMaxK;
#pragma unroll
  for (int j = 0; j < moe::kPickMaxK; ++j) {  // other blocks wrote them: through L2
    ck[j] = lane < blocks ? __ldcg(reinterpret_cast<const unsigned long long*>(keys) + j) : 0;
    cs[j] = lane < blocks ? __ldcg(scores + j) : 0.0f;
  }
  float pick_sc = 0.0f;  // lane j: pick j's score
  int pick_e = -1;       // lane j: pick j's expert
  for (int j = 0; j < static_cast<int>(k); ++j) {
    const uint64_t best = moe::warp_max_key64(ck[0]);
    const int win = best != 0 ? __ffs(__ballot_sync(0xffffffffu, ck[0] == best)) - 1 : -1;
    const float sw = __shfl_sync(0xffffffffu, cs[0], win < 0 ? 0 : win);
    if (lane == j) {
      pick_e = moe::pick_index(best);
      pick_sc = best != 0 ? sw : 0.0f;
    }
    if (lane == win) {  // the winner's list moves up by one
#pragma unroll
      for (int u = 0; u + 1 < moe::kPickMaxK; ++u) {
        ck[u] = ck[u + 1];
        cs[u] = cs[u + 1];
      }
      ck[moe::kPickMaxK - 1] = 0;
    }
  }
  const float w = moe::pick_weight(pick_e, pick_sc, static_cast<int>(k), ra.route_scale);  // route_row's weights
  if (lane < k) {
    ra.experts[lane] = pick_e;
    ra.weights[lane] = w;
    sm.sel[lane] = pick_e;
    sm.wsel[lane] = w;
  }
}

template <class D, int NB>
__global__ void __launch_bounds__(kThreads, 1)
    tc_moe_entry_kernel(const uint8_t* __restrict__ data, const uint8_t* __restrict__ sc, int64_t in, int ks_log2,
                        bool early, int sel_mode, CollapseRow c, MoeRouteArgs ra, bool one_fence, bool split_route) {
  if (!early) dev::pdl_enter();
  extern __shared__ __align__(16) float smem[];
  uint2* smem_u2 = reinterpret_cast<uint2*>(smem);
  __shared__ float red[kWarps * NB];
  __shared__ int ex[NB];
  __shared__ double scratch[32];
  __shared__ const float* xrow[NB];
  float* red_d = reinterpret_cast<float*>(smem_u2 + (in / 32) * 8 * Cols<NB>::J);
  float* xv = red_d + 4 * Cols<NB>::NT * kThreads;  // the collapsed, normed row (in floats)
  const int64_t E = ra.n_experts;
  float* logits = const_cast<float*>(ra.logits);  // the router's input: the gate writes it first
  block_rows<D, false, NB, false>(data, sc, in, E, 0, ks_log2, smem_u2, 1, ex, logits, E, red_d, nullptr, 0,
                                  blockIdx.y, gridDim.y, [&] {
                                   // With `early`, the wait after the norm weights' loads too.
                                   dev::collapse_norm_quads(c.streams, c.collapse_w, in, c.norm_weight, c.eps,
                                                            c.sum_threads, xv, scratch,
                                                            blockIdx.y == 0 ? c.x : nullptr, true, [&] {
                                                              if (early) dev::pdl_enter();
                                                            });
                                   if (threadIdx.x == 0) xrow[0] = xv;
                                   __syncthreads();
                                   stage_x<D, NB, true>(nullptr, in, 1, in, smem_u2, red, ex, nullptr, RowNorm{},
                                                        xrow);
                                 });
  {
    __shared__ moe::RouterSmem rsm;
    __shared__ int bex[moe::kChunk];
    __shared__ int bpart[kThreads];
    if (split_route && threadIdx.x < 32) {  // this block's rows: one row group of RPB x 16 <= 32 (host-checked)
      const int64_t rows = static_cast<int64_t>(kWarps >> ks_log2) * 16, row0 = blockIdx.y * rows;
      const int64_t nr = E - row0 < rows ? E - row0 : rows;  // the last group may be short, a spare block empty
      split_route_block(ra, logits, row0, static_cast<int>(nr > 0 ? nr : 0), blockIdx.y, gridDim.y);
    }
    // The routing by the block that finishes last (its logits are every block's; last_block.cuh).
    if (!dev::count_last_block(&ra.counters[0], gridDim.x * gridDim.y * gridDim.z, one_fence)) return;
    if (split_route) {
      if (threadIdx.x < 32) split_route_tail(ra, gridDim.y, rsm);
      __syncthreads();
      moe::bucket_pairs(ra, rsm, bex, bpart, true);
      return;
    }
    // The x parts are done with: the logits through L2 (other blocks wrote them) and the row's bias (route_row's
    // choice of bias / bias_vl) into shared memory, the loads of both in flight together (route_row would load
    // the image flag, then the bias, after the logits).
    float* lg = smem;
    float* bs = smem + E;
    const float* bvec = moe::row_bias(ra.bias, ra.bias_vl, ra.vl, 0);
    for (int64_t i = threadIdx.x; i < E; i += kThreads) {
      lg[i] = __ldcg(ra.logits + i);
      if (bvec) bs[i] = bvec[i];
    }
    __syncthreads();
    moe::route_row(lg, E, bvec ? bs : nullptr, nullptr, nullptr, ra.k, ra.temp, ra.route_scale, ra.experts, ra.weights,
                   0, rsm, sel_mode);
    __syncthreads();
    moe::bucket_pairs(ra, rsm, bex, bpart, true);
  }
}

// ---------------------------------------------------------------------------------------------
int g_mode = -1;
int g_slot_cap = 0;  // set_slot_cap_for_tests


// Dynamic shared memory of a block of NB x rows: the staged parts (2 mmas x 3 NB columns x 4 lane
// groups of 8 bytes per tile) and the D fragments of the KS reduction (NT column tiles per lane).
size_t smem_bytes(int64_t in, int nb) {
  const int J = 3 * nb, NT = (J + 7) / 8;
  return static_cast<size_t>(in / 32) * 8 * J * sizeof(uint2) + sizeof(float) * 4 * NT * kThreads;
}

// A kernel as a type (for the launchers' generic lambdas).
template <auto F>
struct KernelT {
  static constexpr auto value = F;
};

template <auto K>
void allow_smem() {
  static const bool done = [] {
    cudaFuncSetAttribute(reinterpret_cast<const void*>(K), cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
    return true;
  }();
  (void)done;
}

// Resident blocks per SM of kernel K at `smem` bytes of dynamic shared memory, as the runtime
// computes it from the kernel's registers and shared memory (cached per kernel and size: a decode
// step asks for it on every linear). The slots of a launch come from it, so a grid is one wave
// (a guess from NB alone had FP8 at NB = 4, 128 registers, at one block per SM where two fit:
// wo_a at 64 rows ran 128 blocks instead of 256, 304 us instead of 208 on the H200).
template <auto K>
int resident_blocks(size_t smem) {
  static std::mutex mu;
  static std::vector<std::pair<size_t, int>> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [sz, v] : cache)
    if (sz == smem) return v;
  int v = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, reinterpret_cast<const void*>(K), kThreads, smem) !=
          cudaSuccess ||
      v < 1) {
    (void)cudaGetLastError();  // clear it: the launch reports real errors
    v = 1;
  }
  cache.emplace_back(smem, v);
  return v;
}

// Blocks per SM by shared memory alone (at most 2): the reference of KS, which must not depend on
// the kernel a call takes.
int blocks_per_sm(size_t smem) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(2, (227 * 1024) / static_cast<int64_t>(smem + 1024))));
}

// KS (log2): the fewest warps per row group that give ~2 blocks' warps per SM for a launch of ONE
// row-pair unit per group (the shared memory of NB = 2, whatever NB the call takes), while every
// warp keeps >= 2 U tiles. It depends on the weight's shape only (out_rows, groups, in), never on
// the rows of x: KS fixes the order of a row's sums, and a row must get the same bits whether it is
// decoded alone, in a batch, or in a DSpark verification (row-count invariance). Blocks: as many
// as fill the SMs (at the call's own blocks per SM) over `units` x-row units per group
// (persistent), at most one per row-group batch.
// The balanced KS (DS41_TCG_KS_BALANCE=0: off, measurements; tests: set_ks_balance_for_tests). The
// rule above stops at the first KS whose warp tasks reach the reference warps, which can leave a
// second round of row-group batches for a fraction of the blocks: wo_b (320 row groups, KS = 8: 320
// batches on 264 block slots, 56 blocks run a second round alone), wo_a (8 x 64 batches on 8 x 33
// slots), the shared expert's w2 and pair. Measured on the H100 (`bench kernels --n 1 --row-invariant`
// with DS41_TCG_DENSE_KS forced, docs/perf/README.md, session of 2026-12-06 08:47 UTC): wo_b 25.8 us
// at KS = 8 against 22.9 at 4, wo_a 16.7 against 15.4, shared w2 10.7 against 8.9; where KS = 8 is one
// round already (wq_a, shared w1 alone) it stays best. So: among KS <= the rule's, the fewest rounds of
// one x-row unit's batches over the reference block slots, as long as the launch keeps at least half
// the reference blocks (a KS that leaves the GPU half empty is not taken); on a tie, the larger KS.
// From the weight's shape only (and the GPU's SM count, as the rule above): row-count invariant.
int g_ks_balance = -1;
bool ks_balance() {
  if (g_ks_balance >= 0) return g_ks_balance != 0;
  static const bool on = switch_on("DS41_TCG_KS_BALANCE");
  return on;
}

struct Shape {
  int ks_log2;
  unsigned slots;
};
// mats: matrices of one launch over the same units (an expert pair: 2); they share the slots.
// fused (a pair with its SwiGLU, Epilogue): both matrices in each block, half the warps each, so at
// most 4 warps per row group (KS <= 4: the pair's KS where it is <= 4) and no grid z for the matrix.
Shape shape(int64_t out_rows, int64_t groups, int64_t units, int64_t in, int U, int sub, int per_sm,
            int force_l = -1, int64_t mats = 1, bool fused = false) {
  const int64_t ref_warps = sm_count() * blocks_per_sm(smem_bytes(in, 2)) * kWarps;
  const int64_t target_blocks = sm_count() * std::max(1, per_sm);
  const int64_t n_rg = (out_rows + 15) / 16, tiles = in / 32;
  const int64_t steps = tiles / sub;
  int l = force_l >= 0 ? force_l : 0;  // force_l: a caller's own rule (experts) or a switch
  while (force_l < 0 && l < 3 && n_rg * groups * mats * (int64_t{1} << l) < ref_warps && steps >> (l + 1) >= 2 * U) ++l;
  if (fused) l = std::min(l, 2);
  if (force_l < 0 && ks_balance()) l = balanced_ks_log2(l, n_rg, groups, mats, fused, ref_warps / kWarps);
  const int64_t rpb = (fused ? kWarps / 2 : kWarps) >> l, n_rgb = (n_rg + rpb - 1) / rpb,
                other = (fused ? 1 : mats) * groups * std::max<int64_t>(1, units);
  // At most one wave: blocks are persistent over the row-group batches, and a grid past the resident
  // blocks ran its last few blocks alone afterwards (measured on the H200: wq_b at 64 rows, NB = 2,
  // 32 units x 9 slots = 288 blocks for 264 resident took 548 us, at 48 rows (264 blocks) 278 us).
  int64_t slots = std::max<int64_t>(1, std::min<int64_t>(n_rgb, target_blocks / other));
  if (g_slot_cap > 0) slots = std::min<int64_t>(slots, g_slot_cap);
  return Shape{l, static_cast<unsigned>(slots)};
}

// x rows per block (NB, a kernel template argument): each block decodes its W fragments once for NB
// rows, so wide calls (a batch's decode step, a DSpark verification) re-decode W ceil(n / NB) times
// instead of ceil(n / 2). The choice never changes a row's bits (see WarpTask); only the speed. The
// rule is the H200's measurements (docs/gpu_kernels.md, `bench kernels --row-invariant --n 1 6 8 64`
// with DS41_TCG_NB forced): up to 4 rows, 2; a small weight (fewer row groups than two blocks per SM
// want) keeps 2 below 32 rows, where its launch is short of blocks rather than of bandwidth, and 6
// from 32 rows; grouped weights (wo_a) 3 up to 12 rows, then 4; otherwise the fewest units
// ceil(n / NB) among the NB whose staged x fits, the smaller NB on a tie (8 rows: 4 + 4, not 6 + 2).
// DS41_TCG_NB=2|3|4|6 forces one (measurements), as set_rows_per_block_for_tests.
constexpr int kNbChoices[] = {2, 3, 4, 6};
int g_nb = 0;

int env_nb() {
  static const int v = [] {
    const char* e = std::getenv("DS41_TCG_NB");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return (n == 2 || n == 3 || n == 4 || n == 6) ? n : 0;
  }();
  return v;
}

// DS41_TCG_EXPERT_KS / DS41_TCG_DENSE_KS = 1|2|4|8: the warps per row group of the expert / dense
// calls (experiment switches: measurements only; KS changes the order of a row's sums). -1: unset.
int env_ks_log2(const char* name) {
  const char* e = std::getenv(name);
  const int n = e != nullptr ? std::atoi(e) : 0;
  return n == 1 ? 0 : n == 2 ? 1 : n == 4 ? 2 : n == 8 ? 3 : -1;
}
// DS41_TCG_PAIRS=0: a pair (try_dense / try_experts with a second weight) is refused, so the caller
// runs two launches (measurements; a pair's experts take another KS, see expert_ks_log2).
bool pairs_enabled() {
  static const bool on = switch_on("DS41_TCG_PAIRS");
  return on;
}

int env_expert_ks_log2() {
  static const int v = env_ks_log2("DS41_TCG_EXPERT_KS");
  return v;
}
int env_dense_ks_log2() {
  static const int v = env_ks_log2("DS41_TCG_DENSE_KS");
  return v;
}

// KS (log2) of an expert call: 2 warps per row group wherever each keeps >= 2 U steps, from the
// expert's shape alone (row-count invariance, as shape()). shape()'s rule sizes KS for ONE weight
// filling the GPU alone (8 warps per 16 rows of a 2304 x 5120 expert: tasks of 5 steps, a block
// reduction every 5 steps), but an expert call always carries the top-k experts of every row (>= 6
// units at one row): the H200 (docs/perf/README.md, session of 2026-12-03 20:49 UTC, `bench kernels
// --row-invariant` with DS41_TCG_EXPERT_KS) measured KS = 2 against the old 8 / 4 (w1 / w2) at
// 28.2 / 26.6 vs 32.2 / 30.4 us at one row, 176 / 170 vs 193 / 197 at 8 rows, 1,227 / 1,325 vs
// 1,541 / 1,593 at 64 rows; KS = 1 was within 5 % of 2 except w1 at one row (33.5: too few warps).
// DS41_TCG_EXPERT_KS forces another (measurements).
// A pair (w1 with w3, twice the blocks of one matrix) takes KS = 1: at one row its 2 x 6 experts
// then fill 216 blocks of 8 row groups, one batch each, where KS = 2 would need 432 (1.6 waves).
// So does a single weight with short rows (<= kExpertShortSteps steps: the MoE's w2, 2304 inputs = 18
// FP4 steps): at KS = 2 its 6 experts x 320 row groups are 480 batches on 264 block slots (a second
// round for most blocks, a block reduction every 9 steps), at KS = 1 240 batches in one round. H100,
// same machine (docs/perf/README.md, session of 2026-12-06 08:47 UTC): w2 25.8 -> 23.2 us at one row,
// 158.8 -> 140.4 at 8 rows; batch-1 decode layers 2,183 / 2,174 -> 2,154 / 2,142 us, batch 8 7,011 /
// 7,010 -> 6,943 / 6,948. w1 alone (40 steps, used only with DS41_TCG_PAIRS=0) keeps KS = 2.
constexpr int64_t kExpertShortSteps = 24;
int expert_ks_log2(int64_t in, int U, int sub, int64_t mats) {
  const int forced = env_expert_ks_log2();
  if (forced >= 0) return forced;
  const int64_t steps = in / 32 / sub;
  return mats == 1 && steps >> 1 >= 2 * U && steps > kExpertShortSteps ? 1 : 0;
}

// The shared-memory weight ring (WarpTask kRing, filled by the bulk copy engine): DS41_TCG_RING unset
// or 0: the register ring; 1: the deepest ring of 4, 3 or 2 stages that keeps the register kernel's
// blocks per SM, else the deepest that fits; 2, 3 or 4: that depth wherever the shared memory fits
// (measurements). FP8 / FP4 at up to 3 x rows per block (decode); the bits are the register ring's
// (LinearParity.TensorCoreGemvRingKeepsTheBits). Off by default until measured (an earlier ring filled
// by per-lane cp.async was slower at every shape: docs/perf/README.md, session of 2026-12-04 23:07).
int g_ring = -1;
bool ring_mode_valid(int n) { return n == 0 || n == 1 || n == 2 || n == 3 || n == 4; }
int ring_mode() {
  if (g_ring >= 0) return g_ring;
  static const int v = [] {
    const char* e = std::getenv("DS41_TCG_RING");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return ring_mode_valid(n) ? n : 0;
  }();
  return v;
}

// Dynamic shared memory of a ring kernel: the register kernel's `smem`, the barriers, d stages per warp.
size_t ring_smem(size_t smem, int d, int stage_bytes) {
  return smem + kRingBarBytes + static_cast<size_t>(kWarps) * d * stage_bytes;
}

// The ring's stages per warp for a call the register kernel K would run with `smem` bytes (0: take K).
template <auto K, auto KR>
int ring_depth(size_t smem, int stage_bytes) {
  const int mode = ring_mode();
  if (mode == 0 || stage_bytes == 0) return 0;
  auto fits = [&](int d) { return ring_smem(smem, d, stage_bytes) <= static_cast<size_t>(kMaxSmem); };
  if (mode >= 2) return fits(mode) ? mode : 0;
  allow_smem<KR>();
  const int base = resident_blocks<K>(smem);
  for (int d = kMaxRingDepth; d >= 2; --d)
    if (fits(d) && resident_blocks<KR>(ring_smem(smem, d, stage_bytes)) >= base) return d;
  for (int d = kMaxRingDepth; d >= 2; --d)
    if (fits(d)) return d;
  return 0;
}

// DS41_TCG_RING_WIDE=0 (measurements): the ring modes above leave the dense FP8 16-byte-piece kernel
// (Fp8x2) on its register ring, so that DS41_TCG_RING times the experts' FP4 ring alone.
bool ring_dense() {
  static const bool on = switch_on("DS41_TCG_RING_WIDE");
  return on;
}

// Dense FP8 calls with in % 64 == 0 read 16-byte pieces (Fp8x2) unless DS41_TCG_FP8_WIDE=0 (tests:
// set_fp8_wide_for_tests). Measured on the H100 (docs/perf/README.md, session of 2026-12-05 11:51 UTC):
// wo_b 34.1 -> 27.2 us, wq_b 21.1 -> 19.5 us at one row; batch-1 decode 3.261 -> 3.071 ms. The choice
// depends on the weight and the switch only, so a row keeps its bits across row counts either way.
int g_fp8_wide = -1;
bool fp8_wide() {
  if (g_fp8_wide >= 0) return g_fp8_wide != 0;
  static const bool on = switch_on("DS41_TCG_FP8_WIDE");
  return on;
}

// DS41_TCG_EARLY (default on; 0: off): the dense kernel issues its first task's weight loads before its
// PDL wait, so a block that lands while the previous kernel drains starts streaming at once. Measured
// on the H100 (docs/perf/README.md, session of 2026-12-05 11:51 UTC): 0.5-1.3 us less per dense GEMV
// at one row. (A prefetch of each warp's whole task into L2, tried with it, was slower: removed.)
int g_early = -1;
bool early_on() {
  if (g_early >= 0) return g_early != 0;
  static const bool on = switch_on("DS41_TCG_EARLY");
  return on;
}

// DS41_ENTRY_IN_FLIGHT (default 8; 2 or 4 also): the MoE entry's gate GEMV with 8 steps in flight per warp
// (InFlight) instead of Bf16's 2. The same bits (FusedRowsParity.MoeEntry runs 2, 4 and 8). H100, alternating in
// one call (session of 2026-12-07 12:01 UTC): batch-1 layers 2,080 / 2,078 / 2,053 us against 2,084 / 2,082 /
// 2,056 right before each (a few us per step; batch 8 mixed, +-25 us).
int g_split_route = -1;
std::atomic<uint64_t> g_split_route_launches{0};
bool entry_split_route() {
  if (g_split_route >= 0) return g_split_route != 0;
  static const bool on = switch_opt_in("DS41_ENTRY_SPLIT_ROUTE");
  return on;
}
int g_entry_in_flight = -1;
int entry_in_flight() {
  if (g_entry_in_flight >= 0) return g_entry_in_flight;
  static const int env = [] {
    const char* v = std::getenv("DS41_ENTRY_IN_FLIGHT");
    const int u = v != nullptr ? std::atoi(v) : 8;
    return u == 4 || u == 8 ? u : Bf16::kU;
  }();
  return env;
}

// DS41_DENSE_IN_FLIGHT=4|8 (opt-in; timed neutral on an H100, session of 2026-12-07 12:01 UTC: batch-1 layers
// 2,090 us at 8 against 2,064-2,091 for the default): a one-row dense launch (Fp8x2 or BF16, the register
// ring) whose grid has at most one block per SM takes InFlight<D, 4 or 8>: the same grid and KS (the same bits),
// more of each warp's chain of round trips in flight (the dual wq_a + wkv launch, the indexer's head weights).
int g_dense_in_flight = -1;
std::atomic<uint64_t> g_dense_in_flight_launches{0};
int dense_in_flight() {
  if (g_dense_in_flight >= 0) return g_dense_in_flight;
  static const int env = [] {
    const char* v = std::getenv("DS41_DENSE_IN_FLIGHT");
    const int u = v != nullptr ? std::atoi(v) : 0;
    return u == 4 || u == 8 ? u : 0;
  }();
  return env;
}

// DS41_TCG_EXPERT_STAGE_FIRST=1 (opt-in until timed on a device): the expert kernel stages x before its
// first weight loads (block_rows' stage_first). No value changes.
// DS41_TCG_DENSE_SWIGLU=1 (opt-in until timed on a device): a dense pair's SwiGLU epilogue (the shared
// expert). Its block holds both matrices' rows, so at one row the shared w1 / w3 (144 row groups each)
// run as 144 blocks of KS = 4 where the two-launch pair runs 264 of KS = 8: half the warps in flight, the
// SwiGLU launch saved. The routed experts' pair keeps its blocks and warps fused (KS = 1 either way), so
// it is fused always. A process-wide choice: every decode call of a pair takes the same path (bits).
// DS41_MOE_SHARED_FOLD=1 (opt-in until timed on a device): the shared expert's pair (with its SwiGLU) and w2 as
// extra units of the routed experts' pair and w2 launches (SharedUnits, shared_args): three launches fewer per
// MoE layer in decode (the shared pair, its SwiGLU, its w2), no side stream for it. Its warps per row group are
// its dense pair's fused ones, so with it on, every decode call of a dense pair with a SwiGLU takes that
// epilogue too (dense_swiglu below): the shared expert's bits are then the same folded or not.
// DS41_MOE_SHARED_REPS=N (measurements) forces the blocks per shared unit (N x the routed launch's slots).
TestableSwitch g_shared_fold{"DS41_MOE_SHARED_FOLD", false};
std::atomic<uint64_t> g_shared_fold_launches{0};
std::atomic<uint64_t> g_map_fold_launches{0};  // launches that carried a site's map (HcMapFold)
bool moe_shared_fold() { return g_shared_fold.enabled(); }
int moe_shared_reps() {
  static const int v = [] {
    const char* e = std::getenv("DS41_MOE_SHARED_REPS");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return n > 0 && n <= 64 ? n : 0;
  }();
  return v;
}

int g_dense_swiglu = -1;
bool dense_swiglu() {
  if (g_dense_swiglu >= 0) return g_dense_swiglu != 0 || moe_shared_fold();
  static const bool on = switch_opt_in("DS41_TCG_DENSE_SWIGLU");
  return on || moe_shared_fold();
}

int g_stage_first = -1;
bool expert_stage_first() {
  if (g_stage_first >= 0) return g_stage_first != 0;
  static const bool on = switch_opt_in("DS41_TCG_EXPERT_STAGE_FIRST");
  return on;
}

// DS41_TCG_EXPERT_EARLY (default on; 0: off): a call whose routing was written two or more launches back
// (try_experts' routing_early: the MoE's w2) looks its unit up and issues its first weight loads before
// its PDL wait. No value changes. Measured on an H100 (docs/perf/README.md, session of 2026-12-06 15:19
// UTC): batch-1 layers 2,122 / 2,124 us against 2,148-2,155 without, batch 8 6,857-6,867 against 6,901-6,923.
int g_expert_early = -1;
bool expert_early() {
  if (g_expert_early >= 0) return g_expert_early != 0;
  static const bool on = switch_on("DS41_TCG_EXPERT_EARLY");
  return on;
}

bool nb_fits(int nb, int64_t in) { return smem_bytes(in, nb) <= static_cast<size_t>(kMaxSmem); }

// rows: x rows of the call (experts: the average per expert); row_groups: 16-row groups of W over
// all groups; groups > 1: a grouped weight.
int pick_nb(int64_t rows, int64_t in, int64_t row_groups, int64_t groups) {
  const int forced = g_nb > 0 ? g_nb : env_nb();
  if (forced > 0) return nb_fits(forced, in) ? forced : 2;
  if (rows <= 4) return 2;
  auto fit = [&](int nb) { return nb_fits(nb, in) ? nb : 2; };
  if (groups > 1) return fit(rows <= 12 ? 3 : 4);
  if (row_groups < 2 * sm_count()) return rows < 32 ? 2 : (nb_fits(6, in) ? 6 : fit(4));
  int best = 2;
  int64_t best_units = (rows + 1) / 2;
  for (int nb : kNbChoices) {
    const int64_t units = (rows + nb - 1) / nb;
    if (nb_fits(nb, in) && units < best_units) {
      best = nb;
      best_units = units;
    }
  }
  return best;
}

// Calls f(std::integral_constant<int, NB>) for a runtime nb in kNbChoices.
template <class F>
void with_nb(int nb, F&& f) {
  switch (nb) {
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    default: f(std::integral_constant<int, 2>{}); break;
  }
}

}  // namespace

// On unless DS41_TC_GEMV=0 (then the CUDA-core GEMV of linear_kernels.cu serves every shape). Every
// FP8 / FP4 call the GPU forward does not send to the tensor-core GEMMs takes these kernels (dense
// any rows, experts up to kMaxExpertRows routed rows) and a row's sums do not depend on the other
// rows (KS from the weight's shape, each x row its own power of two and its own mma columns), so a
// row gets the same bits alone, batched or in a DSpark verification forward
// (LinearParity.DecodeGemvRowCountInvariance).
bool enabled() {
  if (g_mode >= 0) return g_mode != 0;
  static const bool on = [] {
    const char* e = std::getenv("DS41_TC_GEMV");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }();
  return on;
}

void set_enabled_for_tests(int mode) { g_mode = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_slot_cap_for_tests(int cap) { g_slot_cap = cap > 0 ? cap : 0; }
void set_rows_per_block_for_tests(int nb) { g_nb = (nb == 2 || nb == 3 || nb == 4 || nb == 6) ? nb : 0; }
void set_ring_for_tests(int mode) { g_ring = ring_mode_valid(mode) ? mode : -1; }
void set_fp8_wide_for_tests(int mode) { g_fp8_wide = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_early_for_tests(int before_wait) { g_early = before_wait < 0 ? -1 : (before_wait ? 1 : 0); }
void set_expert_stage_first_for_tests(int mode) { g_stage_first = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_expert_early_for_tests(int mode) { g_expert_early = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_dense_swiglu_for_tests(int mode) { g_dense_swiglu = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_ks_balance_for_tests(int mode) { g_ks_balance = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_entry_split_route_for_tests(int mode) { g_split_route = mode < 0 ? -1 : (mode ? 1 : 0); }
void set_moe_shared_fold_for_tests(int mode) { g_shared_fold.set(mode); }
bool moe_shared_fold_enabled() { return moe_shared_fold(); }
uint64_t moe_shared_fold_launches() { return g_shared_fold_launches.load(std::memory_order_relaxed); }
uint64_t map_fold_launches() { return g_map_fold_launches.load(std::memory_order_relaxed); }
uint64_t entry_split_route_launches() { return g_split_route_launches.load(std::memory_order_relaxed); }
size_t entry_split_route_bytes(int64_t blocks) {
  return static_cast<size_t>(blocks) * moe::kPickMaxK * (sizeof(uint64_t) + sizeof(float));
}
void set_entry_in_flight_for_tests(int steps) {
  g_entry_in_flight = steps == 2 || steps == 4 || steps == 8 ? steps : -1;
}
void set_dense_in_flight_for_tests(int steps) { g_dense_in_flight = steps == 4 || steps == 8 ? steps : (steps == 0 ? 0 : -1); }
uint64_t dense_in_flight_launches() { return g_dense_in_flight_launches.load(); }

int balanced_ks_log2(int l_max, int64_t n_rg, int64_t groups, int64_t mats, bool fused, int64_t ref_blocks) {
  const int64_t other = (fused ? 1 : mats) * groups;
  const int64_t slot_cap = std::max<int64_t>(1, ref_blocks / other);
  int best = l_max;
  int64_t best_rounds = -1;
  for (int l = l_max; l >= 0; --l) {
    const int64_t rpb = (fused ? kWarps / 2 : kWarps) >> l, n_rgb = (n_rg + rpb - 1) / rpb;
    const int64_t slots = std::min(n_rgb, slot_cap), rounds = (n_rgb + slots - 1) / slots;
    if (l != l_max && 2 * slots * other < ref_blocks) break;  // fewer KS only shrinks the launch further
    if (best_rounds < 0 || rounds < best_rounds) {
      best = l;
      best_rounds = rounds;
    }
  }
  return best;
}


// The kernel of a dense launch of `blocks` blocks: K, or (dense_in_flight, decode-sized blocks (NB 2), Fp8x2 / BF16 on the
// register ring, at most one block per SM) K's InFlight<D, 4 or 8> twin: the same parameters, grid and KS.
using DenseKernelFn = decltype(&tc_dense_kernel<Bf16, false, 2, false>);
template <class D, bool kFp8, int NB, bool kR>
DenseKernelFn dense_kernel_for(int64_t blocks) {
  DenseKernelFn k = tc_dense_kernel<D, kFp8, NB, kR>;
  if constexpr (NB == 2 && !kR && (std::is_same_v<D, Bf16> || std::is_same_v<D, Fp8x2>)) {
    const int u = dense_in_flight();
    if (u > D::kU && blocks <= sm_count()) {
      g_dense_in_flight_launches.fetch_add(1);
      if (u == 4) {
        allow_smem<tc_dense_kernel<InFlight<D, 4>, kFp8, NB, false>>();
        k = tc_dense_kernel<InFlight<D, 4>, kFp8, NB, false>;
      } else {
        allow_smem<tc_dense_kernel<InFlight<D, 8>, kFp8, NB, false>>();
        k = tc_dense_kernel<InFlight<D, 8>, kFp8, NB, false>;
      }
    }
  }
  return k;
}

bool try_dense(const DeviceWeight& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
               float* y, int64_t ldy, cudaStream_t stream, const DeviceWeight* w2, float* y2, const RowNorm* norm,
               const SwigluEpilogue* swiglu, const HcExpandEpilogue* expand, HcMapFold* map) {
  if (map != nullptr) map->folded = false;
  if (swiglu != nullptr && (w2 == nullptr || swiglu->act == nullptr || !dense_swiglu())) return false;
  if (expand != nullptr && (w2 != nullptr || swiglu != nullptr || groups != 1 || expand->streams == nullptr ||
                            expand->post == nullptr || expand->comb == nullptr || expand->c < 1 ||
                            expand->c > dev::kHcExpandMaxC))
    return false;
  if (!enabled() || n < 1 || n > kMaxRows || w.in_dim % 32 != 0 || groups > 65535) return false;
  // A norm: one weight over whole rows (ldx = in), its weight vector 16-byte aligned (float4 loads).
  if (norm != nullptr && (groups != 1 || w2 != nullptr || ldx != w.in_dim || norm->weight == nullptr ||
                          reinterpret_cast<uintptr_t>(norm->weight) % 16 != 0 || norm->sum_threads < 32 ||
                          norm->sum_threads % 32 != 0 || norm->sum_threads > 1024))
    return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || ldx % 4 != 0) return false;  // float4 staging
  const bool fp8 = w.format == WeightFormat::kFp8Tiles, fp4 = w.format == WeightFormat::kFp4Rows,
             bf16 = w.format == WeightFormat::kBF16;
  if (!fp8 && !fp4 && !bf16) return false;
  if (fp4 && w.in_dim % 128 != 0) return false;  // steps of four tiles
  const uintptr_t p = reinterpret_cast<uintptr_t>(w.data);
  if (p % (fp8 ? 8 : 16) != 0 || (!bf16 && w.scale == nullptr)) return false;
  if (fp8 && groups > 1 && out_rows % 16 != 0) return false;  // a row group in one row of 32 x 32 tiles
  if (smem_bytes(w.in_dim, 2) > static_cast<size_t>(kMaxSmem)) return false;
  if ((swiglu == nullptr && (w2 == nullptr) != (y2 == nullptr)) || (w2 != nullptr && !pairs_enabled())) return false;
  if (w2 != nullptr) {  // a pair: one group, the same shape, format and alignment
    if (groups != 1 || w2->format != w.format || w2->out_dim != w.out_dim || w2->in_dim != w.in_dim) return false;
    if (reinterpret_cast<uintptr_t>(w2->data) % (fp8 ? 8 : 16) != 0 || (!bf16 && w2->scale == nullptr)) return false;
  }
  const int64_t mats = w2 != nullptr ? 2 : 1;
  // Fp8x2: 16-byte loads of the payload (16-byte aligned rows), 16-bit loads of the scale pairs.
  const bool wide = fp8 && fp8_wide() && w.in_dim % 64 == 0 && p % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(w.scale) % 2 == 0 &&
                    (w2 == nullptr || (reinterpret_cast<uintptr_t>(w2->data) % 16 == 0 &&
                                       reinterpret_cast<uintptr_t>(w2->scale) % 2 == 0));
  const int nbr = pick_nb(n, w.in_dim, (out_rows + 15) / 16 * groups * mats, groups);
  const size_t smem = smem_bytes(w.in_dim, nbr);
  const int64_t units = (n + nbr - 1) / nbr;
  // kernel: the register ring; ring_kernel: the shared-memory ring (stage_bytes 0: none). U (the
  // register ring's) sizes KS in both, so both give the same bits.
  // pick(blocks): the register ring's kernel for a grid of that many blocks (dense_kernel_for).
  auto go = [&](auto kernel, auto ring_kernel, int U, int sub, int stage_bytes, auto pick) {
    constexpr auto K = decltype(kernel)::value;
    constexpr auto KR = decltype(ring_kernel)::value;
    allow_smem<K>();
    const int rd = ring_depth<K, KR>(smem, stage_bytes);
    auto run = [&](auto kt, size_t sm, bool ring) {
      constexpr auto KK = decltype(kt)::value;
      allow_smem<KK>();
      const bool fused = swiglu != nullptr;
      const Shape s = shape(out_rows, groups, units, w.in_dim, U, sub, resident_blocks<KK>(sm), env_dense_ks_log2(), mats,
                            fused);
      const dim3 grid(static_cast<unsigned>(units), s.slots, static_cast<unsigned>(fused ? 1 : groups * mats));
      Epilogue sw = fused ? Epilogue{nullptr, nullptr, swiglu->act, swiglu->row_scale, swiglu->limit, out_rows}
                          : Epilogue{};
      if (expand != nullptr) {
        sw.streams = expand->streams;
        sw.post = expand->post;
        sw.comb = expand->comb;
        sw.c = expand->c;
        sw.h = out_rows;
      }
      const DenseKernelFn kk =
          ring ? KK : pick(static_cast<int64_t>(grid.x) * static_cast<int64_t>(grid.y) * static_cast<int64_t>(grid.z));
      launch(kk, grid, kThreads, sm, stream, w.data, w.scale, w.in_dim, out_rows, x, ldx, n, y, ldy, s.ks_log2,
             w2 != nullptr ? w2->data : nullptr, w2 != nullptr ? w2->scale : nullptr, y2, rd,
             norm != nullptr ? *norm : RowNorm{}, early_on(), sw, Dual{}, MapArgs{});
    };
    if (rd > 0) {
      run(ring_kernel, ring_smem(smem, rd, stage_bytes), true);
    } else {
      run(kernel, smem, false);
    }
  };
  // A carried site map (HcMapFold): the register-ring Fp8x2 kernel at two rows per block, a plain output (no
  // epilogue), no in-flight variant: that kernel's kMap twin, the same shape (KS: the same bits), the map's blocks
  // in the z layers before the GEMV's.
  if (map != nullptr && map->blocks > 0 && fp8 && wide && nbr == 2 && swiglu == nullptr && expand == nullptr &&
      ring_mode() == 0 && dense_in_flight() == 0) {
    constexpr auto KM = tc_dense_kernel<Fp8x2, true, 2, false, true>;
    allow_smem<KM>();
    const Shape s = shape(out_rows, groups, units, w.in_dim, Fp8x2::kU, Fp8x2::kSub, resident_blocks<KM>(smem),
                          env_dense_ks_log2(), mats, false);
    const int64_t layer = units * static_cast<int64_t>(s.slots);
    MapArgs mp;
    mp.site = map->site;
    mp.splits = map->splits;
    mp.steps = map->steps;
    mp.blocks = map->blocks;
    mp.rows = static_cast<int>((map->blocks + layer - 1) / layer);
    const dim3 grid(static_cast<unsigned>(units), s.slots, static_cast<unsigned>(groups * mats + mp.rows));
    launch(KM, grid, kThreads, smem, stream, w.data, w.scale, w.in_dim, out_rows, x, ldx, n, y, ldy, s.ks_log2,
           w2 != nullptr ? w2->data : nullptr, w2 != nullptr ? w2->scale : nullptr, y2, 0,
           norm != nullptr ? *norm : RowNorm{}, early_on(), Epilogue{}, Dual{}, mp);
    map->folded = true;
    g_map_fold_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  with_nb(nbr, [&](auto nbc) {
    constexpr int NB = decltype(nbc)::value;
    constexpr bool kR = NB <= 3;  // the ring for decode-sized blocks only
    if (fp8 && wide) {
      go(KernelT<tc_dense_kernel<Fp8x2, true, NB, false>>{}, KernelT<tc_dense_kernel<Fp8x2, true, NB, kR>>{},
         Fp8x2::kU, Fp8x2::kSub, kR && ring_dense() ? Fp8x2::kRingStageBytes : 0,
         dense_kernel_for<Fp8x2, true, NB, false>);
    } else if (fp8) {
      go(KernelT<tc_dense_kernel<Fp8, true, NB, false>>{}, KernelT<tc_dense_kernel<Fp8, true, NB, kR>>{}, Fp8::kU,
         Fp8::kSub, kR ? Fp8::kRingStageBytes : 0, dense_kernel_for<Fp8, true, NB, false>);
    } else if (fp4) {
      go(KernelT<tc_dense_kernel<Fp4, false, NB, false>>{}, KernelT<tc_dense_kernel<Fp4, false, NB, kR>>{}, Fp4::kU,
         Fp4::kSub, kR ? Fp4::kRingStageBytes : 0, dense_kernel_for<Fp4, false, NB, false>);
    } else {
      go(KernelT<tc_dense_kernel<Bf16, false, NB, false>>{}, KernelT<tc_dense_kernel<Bf16, false, NB, false>>{},
         Bf16::kU, Bf16::kSub, 0, dense_kernel_for<Bf16, false, NB, false>);
    }
  });
  return true;
}

bool try_dense_dual(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, int64_t ldy,
                    float* y2, int64_t ldy2, cudaStream_t stream, const RowNorm* norm) {
  // try_dense's conditions for each weight alone (one group, rows of x of in floats), plus one format and width.
  if (!enabled() || !pairs_enabled() || n < 1 || n > kMaxRows || y == nullptr || y2 == nullptr) return false;
  if (ring_mode() != 0) return false;  // the shared-memory ring (measurements) takes no dual launch
  if (w.format != w2.format || w.in_dim != w2.in_dim || w.in_dim % 32 != 0 || w.out_dim < 1 || w2.out_dim < 1 ||
      ldy < w.out_dim || ldy2 < w2.out_dim)
    return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || w.in_dim % 4 != 0) return false;  // float4 staging
  if (norm != nullptr && (norm->weight == nullptr || reinterpret_cast<uintptr_t>(norm->weight) % 16 != 0 ||
                          norm->sum_threads < 32 || norm->sum_threads % 32 != 0 || norm->sum_threads > 1024))
    return false;  // try_dense's conditions for a norm
  const bool fp8 = w.format == WeightFormat::kFp8Tiles, fp4 = w.format == WeightFormat::kFp4Rows,
             bf16 = w.format == WeightFormat::kBF16;
  if (!fp8 && !fp4 && !bf16) return false;
  if (fp4 && w.in_dim % 128 != 0) return false;
  for (const DeviceWeight* d : {&w, &w2}) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(d->data);
    if (p % (fp8 ? 8 : 16) != 0 || (!bf16 && d->scale == nullptr)) return false;
  }
  if (smem_bytes(w.in_dim, 2) > static_cast<size_t>(kMaxSmem)) return false;
  // The kernel each weight alone would take (the wide FP8 pieces by each weight's own alignment).
  auto wide_ok = [&](const DeviceWeight& d) {
    return fp8 && fp8_wide() && d.in_dim % 64 == 0 && reinterpret_cast<uintptr_t>(d.data) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(d.scale) % 2 == 0;
  };
  const bool wide = wide_ok(w);
  if (wide != wide_ok(w2)) return false;
  // NB by the first weight's rule (a row's bits do not depend on NB), so one kernel serves both.
  const int nbr = pick_nb(n, w.in_dim, (w.out_dim + 15) / 16, 1);
  const size_t smem = smem_bytes(w.in_dim, nbr);
  const int64_t units = (n + nbr - 1) / nbr;
  bool launched = false;
  auto go = [&](auto kernel, int U, int sub, auto pick) {
    constexpr auto K = decltype(kernel)::value;
    allow_smem<K>();
    const int per_sm = resident_blocks<K>(smem);
    // Each weight's shape as its own launch computes it (try_dense: mats 1, one group).
    const Shape s1 = shape(w.out_dim, 1, units, w.in_dim, U, sub, per_sm, env_dense_ks_log2());
    const Shape s2 = shape(w2.out_dim, 1, units, w.in_dim, U, sub, per_sm, env_dense_ks_log2());
    Dual du;
    du.out_rows2 = w2.out_dim;
    du.ldy2 = ldy2;
    du.ks2 = s2.ks_log2;
    du.slots1 = static_cast<int>(s1.slots);
    du.slots2 = static_cast<int>(s2.slots);
    const dim3 grid(static_cast<unsigned>(units), s1.slots + s2.slots, 1);
    launch(pick(static_cast<int64_t>(grid.x) * static_cast<int64_t>(grid.y)), grid, kThreads, smem, stream, w.data, w.scale, w.in_dim, w.out_dim, x, w.in_dim, n, y, ldy, s1.ks_log2,
           w2.data, w2.scale, y2, 0, norm != nullptr ? *norm : RowNorm{}, early_on(), Epilogue{}, du, MapArgs{});
    launched = true;
  };
  with_nb(nbr, [&](auto nbc) {
    constexpr int NB = decltype(nbc)::value;
    if (fp8 && wide) {
      go(KernelT<tc_dense_kernel<Fp8x2, true, NB, false>>{}, Fp8x2::kU, Fp8x2::kSub, dense_kernel_for<Fp8x2, true, NB, false>);
    } else if (fp8) {
      go(KernelT<tc_dense_kernel<Fp8, true, NB, false>>{}, Fp8::kU, Fp8::kSub, dense_kernel_for<Fp8, true, NB, false>);
    } else if (fp4) {
      go(KernelT<tc_dense_kernel<Fp4, false, NB, false>>{}, Fp4::kU, Fp4::kSub, dense_kernel_for<Fp4, false, NB, false>);
    } else {
      go(KernelT<tc_dense_kernel<Bf16, false, NB, false>>{}, Bf16::kU, Bf16::kSub, dense_kernel_for<Bf16, false, NB, false>);
    }
  });
  return launched;
}

// The shared units of a routed launch (SharedUnits) where they fit it: the shared weight(s) dense FP8 read as
// 16-byte pieces (Fp8x2: what try_dense takes for them), the routed call's shape, a pair with its SwiGLU where
// the routed call is one (else the single weight), x rows 16-byte aligned. The warps per row group (a row's
// bits) are try_dense's for the same call (shape(): from the weight's shape, the pair fused), the reps so that
// a shared block's warps stream about as many steps as a routed block's (reps x slots blocks per unit).
namespace {

bool shared_fits(const SharedUnits* su, int64_t out_dim, int64_t in_dim, bool pair) {
  if (su == nullptr || !moe_shared_fold() || su->w == nullptr || su->x == nullptr || su->y == nullptr || su->n < 1 ||
      su->n > kMaxExpertRows || (su->w2 != nullptr) != pair || !fp8_wide() || in_dim % 64 != 0 || ring_mode() != 0 ||
      !pairs_enabled() || reinterpret_cast<uintptr_t>(su->x) % 16 != 0)
    return false;
  for (const DeviceWeight* w : {su->w, su->w2}) {
    if (w == nullptr) continue;
    if (w->format != WeightFormat::kFp8Tiles || w->out_dim != out_dim || w->in_dim != in_dim ||
        reinterpret_cast<uintptr_t>(w->data) % 16 != 0 || w->scale == nullptr ||
        reinterpret_cast<uintptr_t>(w->scale) % 2 != 0)
      return false;
  }
  return true;
}

// For a call shared_fits takes.
// pair: the routed call is the fused pair with its SwiGLU (so are the shared units), else a single weight.
SharedArgs shared_args(const SharedUnits* su, int64_t out_dim, int64_t in_dim, bool pair, int routed_ks,
                       unsigned slots, int nb) {
  SharedArgs a;
  const int ks = shape(out_dim, 1, 1, in_dim, Fp8x2::kU, Fp8x2::kSub, 1, env_dense_ks_log2(), pair ? 2 : 1, pair)
                     .ks_log2;
  const int64_t n_rg = (out_dim + 15) / 16;
  auto batches = [&](bool f, int l) {
    const int64_t rpb = (f ? kWarps / 2 : kWarps) >> l;
    return (n_rg + rpb - 1) / rpb;
  };
  const int64_t routed_steps = ((batches(pair, routed_ks) + slots - 1) / slots) * ((in_dim / (32 * Fp4::kSub)) >> routed_ks);
  const int64_t task_steps = std::max<int64_t>(1, (in_dim / (32 * Fp8x2::kSub)) >> ks);
  const int64_t rounds = std::max<int64_t>(1, routed_steps / task_steps), nb_s = batches(pair, ks);
  int64_t reps = (nb_s + rounds * slots - 1) / (rounds * slots);
  if (const int forced = moe_shared_reps(); forced > 0) reps = forced;
  reps = std::clamp<int64_t>(reps, 1, (nb_s + slots - 1) / slots);
  a.data = su->w->data;
  a.sc = su->w->scale;
  if (pair) {
    a.data2 = su->w2->data;
    a.sc2 = su->w2->scale;
  }
  a.x = su->x;
  a.n = su->n;
  a.y = su->y;
  a.ks_log2 = ks;
  a.units = static_cast<int>((su->n + nb - 1) / nb);
  a.reps = static_cast<int>(reps);
  return a;
}

}  // namespace

bool try_experts(quant::WeightFormat format, const DeviceWeight* weights, int64_t n_experts, int64_t out_dim,
                 int64_t in_dim, const int64_t* offsets, const float* x, int64_t m_max, float* y,
                 cudaStream_t stream, const DeviceWeight* weights2, float* y2, const int64_t* x_rows,
                 const SwigluEpilogue* swiglu, bool routing_early, SharedUnits* shared) {
  HcMapFold* map = shared != nullptr ? shared->map : nullptr;
  if (shared != nullptr) shared->folded = false;
  if (map != nullptr) map->folded = false;
  if (swiglu != nullptr && (weights2 == nullptr || swiglu->act == nullptr)) return false;
  // Decode and DSpark verification (about one row per used expert): every such call takes this
  // kernel, so a row's bits do not depend on the batch (row-count invariance, as try_dense).
  if (!enabled() || m_max < 1 || m_max > kMaxExpertRows || in_dim % 32 != 0 ||
      n_experts > kMaxExperts)
    return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;  // float4 staging
  const bool fp8 = format == WeightFormat::kFp8Tiles, fp4 = format == WeightFormat::kFp4Rows;
  if (!fp8 && !fp4) return false;
  if (fp4 && in_dim % 128 != 0) return false;  // steps of four tiles
  if (smem_bytes(in_dim, 2) > static_cast<size_t>(kMaxSmem)) return false;
  if ((swiglu == nullptr && (weights2 == nullptr) != (y2 == nullptr)) || (weights2 != nullptr && !pairs_enabled()))
    return false;
  const int64_t mats = weights2 != nullptr ? 2 : 1;
  // NB from the average rows per expert: about one in decode, so NB = 2 (measured: forcing 4 or 6
  // rows per block there is up to 2x slower); NB > 2 only where the experts average 5 rows or more
  // (a wide verification).
  const int nbr = pick_nb(std::max<int64_t>(1, m_max / n_experts), in_dim, (out_dim + 15) / 16, 1);
  const size_t smem = smem_bytes(in_dim, nbr);
  // Blocks over units <= rows <= m_max.
  const int64_t units = (m_max + nbr - 1) / nbr + n_experts;  // an upper bound of the units
  const int64_t grid_units = std::min(m_max, units);
  // with_shared: the kernel has the shared units (tc_expert_kernel's DS), taken where they fit (shared_args).
  auto go = [&](auto kernel, auto ring_kernel, int U, int sub, int stage_bytes, bool with_shared = false) {
    constexpr auto K = decltype(kernel)::value;
    constexpr auto KR = decltype(ring_kernel)::value;
    allow_smem<K>();
    const int rd = ring_depth<K, KR>(smem, stage_bytes);
    auto run = [&](auto kt, size_t sm) {
      constexpr auto KK = decltype(kt)::value;
      allow_smem<KK>();
      const bool fused = swiglu != nullptr;
      const Shape s = shape(out_dim, 1, grid_units, in_dim, U, sub, resident_blocks<KK>(sm),
                            expert_ks_log2(in_dim, U, sub, mats), mats, fused);
      const SharedArgs sh = with_shared ? shared_args(shared, out_dim, in_dim, fused, s.ks_log2,
                                                                 s.slots, nbr)
                                                   : SharedArgs{};
      // The carried map (with the shared units only: tc_expert_kernel's DS form): rows of s.slots blocks.
      MapArgs mp;
      if (sh.units > 0 && map != nullptr && map->blocks > 0) {
        mp.site = map->site;
        mp.splits = map->splits;
        mp.steps = map->steps;
        mp.blocks = map->blocks;
        mp.rows = static_cast<int>((map->blocks + s.slots - 1) / s.slots);
      }
      const dim3 grid(s.slots, static_cast<unsigned>(mp.rows + grid_units + int64_t{sh.units} * sh.reps),
                      static_cast<unsigned>(fused ? 1 : mats));
      const Epilogue sw = fused ? Epilogue{nullptr, nullptr, swiglu->act, swiglu->row_scale, swiglu->limit, out_dim}
                                  : Epilogue{};
      launch(KK, grid, kThreads, sm, stream, weights, weights2, n_experts, out_dim, in_dim, offsets, x, x_rows, y,
             y2, s.ks_log2, rd, expert_stage_first(), routing_early && expert_early(), sw, sh, mp);
      if (sh.units > 0) {
        shared->folded = true;
        g_shared_fold_launches.fetch_add(1, std::memory_order_relaxed);
      }
      if (mp.rows > 0) {
        map->folded = true;
        g_map_fold_launches.fetch_add(1, std::memory_order_relaxed);
      }
    };
    if (rd > 0) {
      run(ring_kernel, ring_smem(smem, rd, stage_bytes));
    } else {
      run(kernel, smem);
    }
  };
  // The shared units: FP4 routed experts at two rows per block (decode), a single weight or a fused pair
  // (a pair into y / y2 has its matrix in grid z). Elsewhere the caller runs the shared expert itself, with the
  // same bits (the same warps per row group in its dense launch).
  const bool fold = fp4 && nbr == 2 && (swiglu != nullptr || weights2 == nullptr) &&
                    shared_fits(shared, out_dim, in_dim, swiglu != nullptr);
  if (fold) {
    using KS = KernelT<tc_expert_kernel<Fp4, false, 2, false, Fp8x2>>;
    go(KS{}, KS{}, Fp4::kU, Fp4::kSub, 0, true);
    return true;
  }
  with_nb(nbr, [&](auto nbc) {
    constexpr int NB = decltype(nbc)::value;
    constexpr bool kR = NB <= 3;
    if (fp8) {
      go(KernelT<tc_expert_kernel<Fp8, true, NB, false>>{}, KernelT<tc_expert_kernel<Fp8, true, NB, kR>>{}, Fp8::kU,
         Fp8::kSub, kR ? Fp8::kRingStageBytes : 0);
    } else {
      go(KernelT<tc_expert_kernel<Fp4, false, NB, false>>{}, KernelT<tc_expert_kernel<Fp4, false, NB, kR>>{},
         Fp4::kU, Fp4::kSub, kR ? Fp4::kRingStageBytes : 0);
    }
  });
  return true;
}

namespace {

bool collapse_row_fits(const CollapseRow& c, int64_t in) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return in > 0 && in % (4 * kThreads) == 0 && in <= 16384 && c.streams != nullptr && c.collapse_w != nullptr &&
         al(c.streams) && (c.x == nullptr || al(c.x)) && (c.norm_weight == nullptr || al(c.norm_weight)) &&
         c.sum_threads >= 32 && c.sum_threads % 32 == 0 && c.sum_threads <= 1024;
}

// The entry kernel's dynamic shared memory beside its static (the router's ~36 KB; 227 KB in all).
constexpr int kEntryMaxSmem = 160 * 1024;

}  // namespace

bool try_moe_entry(const DeviceWeight& gate, const MoeEntryArgs& a, cudaStream_t stream) {
  const MoeRouteArgs& r = a.route;
  const int64_t E = gate.out_dim;
  if (!moe_entry_enabled() || gate.format != WeightFormat::kBF16 || a.row.x == nullptr) return false;
  if (r.n != 1 || E != r.n_experts || r.k < 1 || r.k > moe::kMaxK || E < r.k || E > moe::kMaxExperts ||
      r.k > moe::kChunk || r.k > kThreads)
    return false;
  if (r.logits == nullptr || r.counters == nullptr || r.experts == nullptr || r.weights == nullptr ||
      r.offsets == nullptr || r.perm_rows == nullptr || r.perm_weight == nullptr || r.slot_pos == nullptr)
    return false;
  const int64_t in = gate.in_dim;
  if (!enabled() || !collapse_row_fits(a.row, in) || gate.data == nullptr ||
      reinterpret_cast<uintptr_t>(gate.data) % 16 != 0)
    return false;
  const size_t parts = smem_bytes(in, 2), smem = parts + static_cast<size_t>(in) * sizeof(float);
  if (smem > static_cast<size_t>(kEntryMaxSmem) || 2 * static_cast<size_t>(E) * sizeof(float) > parts) return false;
  // KS (a row's bits) and the slots as try_dense's one-row call of the gate (tc_dense_kernel<Bf16, false, 2>,
  // the register ring).
  constexpr auto KD = tc_dense_kernel<Bf16, false, 2, false>;
  allow_smem<KD>();
  const Shape s = shape(E, 1, 1, in, Bf16::kU, Bf16::kSub, resident_blocks<KD>(parts), env_dense_ks_log2());
  // The split routing where every gate block is one row group of <= 32 rows, k <= 8, <= 32 blocks and the
  // workspace holds the candidates (tc_moe_entry_kernel's split_route).
  const int64_t rpb = kWarps >> s.ks_log2, n_rgb = ((E + 15) / 16 + rpb - 1) / rpb;
  const bool split = entry_split_route() && rpb * 16 <= 32 && n_rgb <= s.slots && s.slots <= kSplitRouteMaxBlocks &&
                     r.k <= moe::kPickMaxK && r.workspace != nullptr &&
                     r.workspace_bytes >= entry_split_route_bytes(s.slots) &&
                     reinterpret_cast<uintptr_t>(r.workspace) % 8 == 0;
  if (split) g_split_route_launches.fetch_add(1, std::memory_order_relaxed);
  // The gate's steps in flight per warp (entry_in_flight): its 24 blocks at the released width are one per
  // SM, each warp a chain of 20 one-tile steps.
  const auto go = [&](auto kt) {
    constexpr auto K = decltype(kt)::value;
    static const bool attr = cudaFuncSetAttribute(reinterpret_cast<const void*>(K),
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  kEntryMaxSmem) == cudaSuccess;
    if (!attr) return false;
    launch(K, dim3(1, s.slots, 1), kThreads, smem, stream, gate.data, gate.scale, in, s.ks_log2, early_on(),
           router_selection(), a.row, r, one_fence_enabled(), split);
    return true;
  };
  switch (entry_in_flight()) {
    case 4: return go(KernelT<tc_moe_entry_kernel<InFlight<Bf16, 4>, 2>>{});
    case 8: return go(KernelT<tc_moe_entry_kernel<InFlight<Bf16, 8>, 2>>{});
    default: return go(KernelT<tc_moe_entry_kernel<Bf16, 2>>{});
  }
}

}  // namespace ds41::cuda::tcg
