// ds41 backends/cuda: a prefill chunk's routed experts over FP4 rows as ONE grouped GEMM on the tensor
// cores, reading the experts' packed E2M1 rows and E8M0 scales as they lie in memory (no per-chunk
// decode of every expert into a BF16 scratch, no per-expert cuBLAS launches; gpu/tensor_core_linear.h
// takes it for FP4 experts, docs/gpu_kernels.md "The FP4 expert GEMM").
//
// The numerics are the decode GEMV's (tc_gemv_kernels.cu, top): x's row is scaled by a power of two
// (its largest |x| into [2^14, 2^15)) and split into three f16 parts; each E2M1 weight is decoded
// exactly to f16 (value * 2^-14); mma.sync m16n8k16 multiplies a 32-wide K tile (two mmas from zero),
// and the tile's sum goes into the fp32 accumulator times ONE exact power of two, the row's E8M0 scale
// (an fma per output and tile); at the end the parts are added, hi + (lo + lo2), and multiplied by
// x's power of two. So a product differs from the CPU op only in the order of the fp32 additions
// (and, as in the GEMV, an element under 2^-29 of its row's largest loses bits to f16's subnormals:
// terms ~2^-40 of the output's scale). An output's arithmetic depends on its W row and its x row
// alone — not on the other rows of its unit, the unit size or the chunk — so a routed row gets the
// same bits in any prefill chunk (row-count invariance).
//
// Contract of the fast path: every E8M0 scale byte of the experts lies in the window [64, 191]
// (tc_frag.cuh scale_fast; real checkpoints' expert scales are near 2^-10 .. 2^0). Callers check it
// with run_fp4_scales_outside_window first (gpu/tensor_core_linear.cpp: the decode path otherwise).
//
// Layouts: the routed rows are grouped per expert (offsets, as the MoE's bucketing); a unit is at
// most kExpertGemmRows consecutive routed rows of one expert (expert_gemm_units, on the host from the
// offsets read back). run_expert_gemm_split writes each routed row's three parts in the mma's B
// fragment order ([tile][mma][part][lane group] of 4 f16, 6 bytes per K) and its exponent.
// All launchers: device pointers, the stream last, no allocation or synchronisation.
#pragma once

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "core/status.h"

namespace ds41::cuda {

constexpr int kExpertGemmRows = 32;  // routed rows (x rows) of a unit: 96 B columns, 12 column tiles
// With one part per routed row (run_expert_gemm_split / run_expert_gemm_fp4 n_parts 1: rows whose values are
// exact in f16 after the row's power of two, as --numerics fp8-act's quantized inputs are down to 2^-35 of the
// row's largest): a unit holds this many routed rows, one B column each (a third of the mma work per row).
constexpr int kExpertGemmRows1 = 3 * kExpertGemmRows;

// The GEMM's kernel: the mma.sync form, or the wgmma form (Hopper's warpgroup MMA: expert_gemm_wgmma below).
enum class ExpertGemmForm { kMma, kWgmma };

// Routed rows [row0, row0 + rows) of `expert`, 1 <= rows <= kExpertGemmRows.
struct ExpertGemmUnit {
  int32_t expert = 0, row0 = 0, rows = 0, pad = 0;
};

// The units of host offsets[E + 1] (expert e's rows [off[e], off[e + 1])): each expert's rows cut into
// runs of kExpertGemmRows, in expert order, into units (room for expert_gemm_max_units). Returns their
// count.
// rows_per_unit: kExpertGemmRows (three parts) or kExpertGemmRows1 (one part).
int64_t expert_gemm_units(const int64_t* off, int64_t E, ExpertGemmUnit* units,
                          int64_t rows_per_unit = kExpertGemmRows);
int64_t expert_gemm_max_units(int64_t m_max, int64_t E);

// Whether run_expert_gemm_fp4 takes experts of this shape (FP4 rows, in_dim a positive multiple of
// 128, both dims within the grid's limits).
bool expert_gemm_supported(int64_t out_dim, int64_t in_dim);
// Bytes of the parts of m routed rows of in_dim (3 f16 per element; n_parts 1: one).
inline int64_t expert_gemm_parts_bytes(int64_t m, int64_t in_dim, int n_parts = 3) { return m * in_dim * 2 * n_parts; }

// parts / ex for routed rows i < m: row i of the split is x row rows_of[i] (rows_of null: row i), of
// in_dim floats (ld in_dim). parts: expert_gemm_parts_bytes(m, in_dim) bytes, 16-byte aligned; ex: m.
// n_parts 1: the hi part alone (exact only for rows whose values are exact in f16 after the row's power of
// two: kExpertGemmRows1); with such rows the GEMM gives the three parts' bits (their lo parts are zero).
// form: the GEMM that reads the parts (their B layout); kWgmma only where expert_gemm_wgmma() is true.
Status run_expert_gemm_split(const float* x, int64_t in_dim, const int64_t* rows_of, int64_t m, uint2* parts,
                             int32_t* ex, cudaStream_t stream, int n_parts = 3,
                             ExpertGemmForm form = ExpertGemmForm::kMma);

// count (device int32, set to 0 by the caller) += the E experts' scale bytes outside the fast window
// (0 or more; any non-zero value means the GEMM's contract does not hold). weights: DEVICE array; in_dim a
// multiple of 128. wide (optional, device int32, set to 0 by the caller) += the (W row, step of 4 tiles) whose
// scale bytes span more than 15 (non-zero: the wgmma form's contract does not hold; the mma form takes them).
Status run_fp4_scales_outside_window(const DeviceWeight* weights, int64_t E, int64_t out_dim, int64_t in_dim,
                                     int32_t* count, cudaStream_t stream, int32_t* wide = nullptr);

// y[row][o] (ld out_dim) for every routed row of the units = x_row . W_e[o] (the unit's expert's FP4 rows
// from weights, a DEVICE array), from run_expert_gemm_split's parts / ex. weights2 / y2 (both or neither):
// the second matrix of a pair over the same rows (the MoE's w1 and w3), in the same launch. Rows of y
// not in a unit are not written.
// The block layout (expert_gemm_kernels.cu Layout): 4 warps of 32 W rows x 12 column tiles by default;
// DS41_TC_FP4_GEMM_WARPS8=1 takes 8 warps of 32 rows x 6 column tiles (the same arithmetic per output, so the
// same bits; slower folded, docs/perf). Tests: 1 / 0 force one, -1 the switch.
void set_expert_gemm_warps8_for_tests(int mode);
// The step fold (expert_gemm_kernels.cu, "The step fold"; on unless DS41_TC_FP4_GEMM_FOLD=0): a step's four K
// tiles of a W row as one mma chain, the weights times 2^(s_j - s_min) (exact), where every row of a warp has its
// step's scale bytes within 15 of their least (else that step takes the per-tile products): the same terms
// summed in another order, so not the bits of the per-tile form. Tests: 1 / 0 force it, -1 the switch.
void set_expert_gemm_fold_for_tests(int mode);
// The folded step's column tiles in groups of DS41_TC_FP4_GEMM_CG (4 warps: 2, the default, 3 or 4; 8 warps: 3;
// 1 or any other value: tile by tile) with no branch between them, so their mma chains interleave (+5 % prefill at
// 8K / 2048 on the H100); the same operations per output, so the folded bits. Tests: the group's tiles, 0 the
// switch.
void set_expert_gemm_group_for_tests(int tiles);
// --numerics fp8-act's quantized inputs on one part (DS41_TC_ONE_PART, default on): the FP4 expert GEMM with
// n_parts 1 and the dense / grouped tensor-core GEMMs on the first bfloat16 part only
// (gpu/tensor_core_linear.h). Off: three parts (two of them zero): the same bits, three times the mma work.
// Tests: 1 / 0 force it, -1 the switch.
bool tc_one_part();
void set_tc_one_part_for_tests(int mode);
// The wgmma form (expert_gemm_kernels.cu "The wgmma form"; DS41_TC_FP4_GEMM_WGMMA=1, opt-in): the folded GEMM on
// Hopper's warpgroup MMA, on a compute capability 9.0 device with the step fold on. The split and the GEMM must
// run under the same answer: the split then writes the parts in the wgmma form's B layout (a (tile, mma, part)'s
// four b0 words, then its four b1 words; the same bytes per row). Same terms and order per output as the folded
// mma form, the fold's vote taken per block of 128 W rows rather than per warp of 32. Tests: 1 / 0 force it,
// -1 the switch.
bool expert_gemm_wgmma();
void set_expert_gemm_wgmma_for_tests(int mode);

// form kWgmma (parts from a kWgmma split): the caller guarantees the scale check's wide count is zero for
// these experts; expert_gemm_wgmma() must be true.
Status run_expert_gemm_fp4(const DeviceWeight* weights, const DeviceWeight* weights2, const ExpertGemmUnit* units,
                           int64_t n_units, int64_t out_dim, int64_t in_dim, const uint2* parts, const int32_t* ex,
                           float* y, float* y2, cudaStream_t stream, int n_parts = 3,
                           ExpertGemmForm form = ExpertGemmForm::kMma);

}  // namespace ds41::cuda
