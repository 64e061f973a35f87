// ds41 backends/cuda: the tensor-core GEMV of decode (tc_gemv_kernels.cu) — y = x . W^T for up to
// six rows of x per block over FP8 32x32-tile, FP4-row and BF16 weights (MODEL_SPEC 2.1), the weights decoded in
// registers straight into mma.sync f16 fragments (BF16: used as bf16 fragments as loaded). Internal to linear_kernels.cu, which sends the
// shapes these accept here and everything else to its CUDA-core kernels; the numerics and the
// measurements are in docs/gpu_kernels.md ("Decode GEMV on the tensor cores").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "backends/cuda/fused_moe_kernels.h"
#include "backends/cuda/fused_rows_kernels.h"
#include "backends/cuda/linear_epilogue.h"

namespace ds41::cuda::tcg {

// Whether the kernels are used (tests: set_tc_gemv_for_tests in linear_kernels.h). Default ON,
// DS41_TC_GEMV=0 turns them off. A row's bits do not depend on the row count of the call (dense:
// any rows, experts up to 65535 routed rows), which DSpark's bit-exact rollback and lossless
// verification at any batch rely on.
bool enabled();
void set_enabled_for_tests(int mode);  // -1: the environment, 0: off, 1: on
void set_slot_cap_for_tests(int cap);  // caps the blocks along W rows (0: the device's fill)
// Forces the x rows per block (2, 3, 4 or 6; 0: the launcher's choice, or DS41_TCG_NB). A row's
// bits do not depend on it (LinearParity.DecodeGemvRowCountInvariance).
void set_rows_per_block_for_tests(int nb);
// The shared-memory weight ring (DS41_TCG_RING): -1 the environment, 0 off (the register ring), 1 where
// it keeps the blocks per SM, 2 / 3 / 4 stages forced. A row's bits do not depend on it.
void set_ring_for_tests(int mode);
// FP8 dense calls through 16-byte pieces (Fp8x2, the default; DS41_TCG_FP8_WIDE=0 off): -1 the
// environment, 0 off, 1 on.
void set_fp8_wide_for_tests(int mode);
// The dense kernel's early start (DS41_TCG_EARLY, default on): its first weight loads before its PDL
// wait. -1 the environment, 0 off, 1 on. No value changes.
void set_early_for_tests(int before_wait);
// The expert kernel stages x before its first weight loads (DS41_TCG_EXPERT_STAGE_FIRST=1, opt-in until
// timed): -1 the environment, 0 off, 1 on. No value changes.
void set_expert_stage_first_for_tests(int mode);
// The expert kernel's early start where the caller says the routing is settled (try_experts'
// routing_early; DS41_TCG_EXPERT_EARLY, default on): -1 the environment, 0 off, 1 on.
void set_expert_early_for_tests(int mode);
// A dense pair's SwiGLU epilogue (DS41_TCG_DENSE_SWIGLU=1, opt-in until timed; try_dense with a
// SwigluEpilogue refuses it while off): -1 the environment, 0 off, 1 on. Experts' pairs take it always.
void set_dense_swiglu_for_tests(int mode);
// The balanced KS rule (tc_gemv_kernels.cu, balanced_ks_log2): 1 on, 0 off, -1 the default (DS41_TCG_KS_BALANCE).
void set_ks_balance_for_tests(int mode);
// The MoE entry's gate with 2, 4 or 8 steps in flight per warp; any other value: the environment
// (DS41_ENTRY_IN_FLIGHT, default 8). The same bits.
void set_entry_in_flight_for_tests(int steps);
// The MoE entry's split routing (tc_moe_entry_kernel: each gate block's k best, the last block picks over
// them): DS41_ENTRY_SPLIT_ROUTE=1 (opt-in, not timed yet), tests: -1 the environment, 0 off, 1 on. Its
// launches so far, and the workspace it needs (MoeRouteArgs::workspace_bytes) for `blocks` gate blocks.
void set_entry_split_route_for_tests(int mode);
// The shared expert folded into the routed experts' launches (DS41_MOE_SHARED_FOLD=1, opt-in until timed):
// -1 the environment, 0 off, 1 on. On, dense pairs take their SwiGLU epilogue (as DS41_TCG_DENSE_SWIGLU=1).
// Its state, and the launches that ran shared units so far (tests).
void set_moe_shared_fold_for_tests(int mode);
bool moe_shared_fold_enabled();
uint64_t moe_shared_fold_launches();
uint64_t map_fold_launches();  // launches that carried a site's map so far (HcMapFold; tests)
uint64_t entry_split_route_launches();
size_t entry_split_route_bytes(int64_t blocks);
// One-row dense launches of at most one block per SM (Fp8x2 / BF16) with 4 or 8 steps in flight per warp
// (DS41_DENSE_IN_FLIGHT, opt-in: timed neutral); 0 off, any other value the environment. The same bits.
void set_dense_in_flight_for_tests(int steps);
uint64_t dense_in_flight_launches();  // launches that took an InFlight kernel so far (tests)
// The balanced rule itself (host only, no device): the warps per row group (log2) for a weight of n_rg
// row groups of 16 in `groups` groups, `mats` matrices per launch (a pair: 2; `fused`: both in one
// block), given the old rule's l_max and the reference blocks (SMs x blocks per SM by shared memory).
int balanced_ks_log2(int l_max, int64_t n_rg, int64_t groups, int64_t mats, bool fused, int64_t ref_blocks);

// Rows up to which run_linear / run_grouped_linear send FP8 / FP4 calls here without row_invariant
// (BF16 calls come here only with it)
// (above: the CUDA-core kernels read W once per 8 rows, where these re-read it per row pair).
inline constexpr int64_t kDecodeRows = 16;

// Dense / grouped linear (groups column blocks of x, out_rows rows of W each), n rows of x (row
// stride ldx, y row stride ldy). Launches and returns true when the shape is one these kernels
// take (format FP8 tiles / FP4 rows / BF16, in % 32 == 0, aligned rows, x staging within the
// shared memory); false: nothing launched. w2 / y2 (both or neither, groups = 1): a second weight of
// the same shape and format over the same x, into y2 (row stride ldy), in the same launch (run_linear_pair).
// norm (optional; one weight, groups = 1, ldx = in): x's rows are first RMS-normalized as run_rms_norm
// with this weight and eps would (its float64 sum of squares in the order of sum_threads threads,
// elementwise_kernels.h rms_norm_sum_threads, then fl(fl(x inv) weight[k])), inside the staging of
// every block: the same bits as run_rms_norm followed by the plain call, without the launch.
struct RowNorm {
  const float* weight = nullptr;  // [in] device, 16-byte aligned
  float eps = 0.0f;
  int sum_threads = 0;
};
// expand (optional, one weight, groups = 1): y's rows go into their mHC streams in the same launch
// (linear_epilogue.h), y itself not written (then unused).
// map (optional; fused_rows_kernels.h HcMapFold, DS41_HC_MAP_FOLD): a site's map as extra blocks of the launch where
// it takes the FP8 16-byte-piece kernel at two rows per block with no epilogue; map->folded says whether it ran.
// swiglu (optional, with a pair): the pair's SwiGLU in the same launch (linear_epilogue.h), act written
// instead of y and y2 (then unused); dense pairs only with set_dense_swiglu_for_tests / DS41_TCG_DENSE_SWIGLU. Each block multiplies both weights for its rows (half its warps
// each), so a pair whose KS (warps per row group) would be 8 takes 4 here; every call of a pair through
// this path takes the same KS, so a row's bits still do not depend on the call's rows.
bool try_dense(const DeviceWeight& w, int64_t out_rows, int64_t groups, const float* x, int64_t ldx, int64_t n,
               float* y, int64_t ldy, cudaStream_t stream, const DeviceWeight* w2 = nullptr, float* y2 = nullptr,
               const RowNorm* norm = nullptr, const SwigluEpilogue* swiglu = nullptr,
               const HcExpandEpilogue* expand = nullptr, HcMapFold* map = nullptr);

// Routed experts (the contract of run_expert_linear) with the experts' common format given by the
// host: launches and returns true for FP8 / FP4 experts, in_dim % 32 == 0 and m_max <= 65535;
// false: nothing launched. weights2 / y2 (both or neither): a second set of experts of the same
// shape and format over the same rows of x, in the same launch (the pair run_expert_linear_pair).
// x_rows (nullable): routed row r is x[x_rows[r]] (rows of in_dim floats) instead of x[r].
// routing_early: offsets and x_rows were written by a kernel two or more launches back in this stream
// (launch.h contract 3), so the kernel may read them and issue its first weight loads before its PDL
// wait (DS41_TCG_EXPERT_EARLY=0 / set_expert_early_for_tests turn it off; the same values either way).
// Two weights of one format and input width over the same rows of x (ldx = in), each with its own output
// width, in one launch: the slots of each run as its own try_dense launch would (its KS and slots), so y
// and y2 get the bits of two try_dense calls. False (nothing launched) where either would not be taken,
// or where the weights would take the shared-memory ring (DS41_TCG_RING). norm (as try_dense's): x's rows are
// normalized in the staging both weights share (run_rms_norm's bits), x itself is not written.
bool try_dense_dual(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, int64_t ldy,
                    float* y2, int64_t ldy2, cudaStream_t stream, const RowNorm* norm = nullptr);

// shared (nullable; DS41_MOE_SHARED_FOLD, linear_epilogue.h SharedUnits): the shared expert's rows as extra
// units of this launch where they fit (FP4 routed experts at decode sizes; the shared weight FP8 of the routed
// shape; a pair with swiglu or a single weight); shared->folded says whether they ran. Their bits are those of
// try_dense on the same weight and rows (its warps per row group; a pair fused with its SwiGLU).
// shared->map (nullable; fused_rows_kernels.h HcMapFold, DS41_HC_MAP_FOLD): a site's map as extra blocks of a
// launch that takes the shared units; map->folded says whether it ran.
bool try_experts(quant::WeightFormat format, const DeviceWeight* weights, int64_t n_experts, int64_t out_dim,
                 int64_t in_dim, const int64_t* offsets, const float* x, int64_t m_max, float* y,
                 cudaStream_t stream, const DeviceWeight* weights2 = nullptr, float* y2 = nullptr,
                 const int64_t* x_rows = nullptr, const SwigluEpilogue* swiglu = nullptr,
                 bool routing_early = false, SharedUnits* shared = nullptr);

// The MoE entry's one launch (fused_moe_kernels.h run_moe_entry's contract): true if launched, false if
// the shape is not taken or moe_entry_enabled() is off (nothing launched).
bool try_moe_entry(const DeviceWeight& gate, const MoeEntryArgs& a, cudaStream_t stream);

}  // namespace ds41::cuda::tcg
