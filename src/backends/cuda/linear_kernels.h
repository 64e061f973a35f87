// ds41 backends/cuda: linear layers over quantized weights (FP8 32x32 tiles, FP4 rows, BF16, F32),
// dequantized in registers / shared memory, never as a full copy. Contract shared by the GPU executor
// (src/gpu) and the kernels: device pointers, the stream last, errors as Status, no allocation or
// synchronisation (graph-capturable), semantics of the CPU op in src/ops/backend.h (the oracle;
// tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "backends/cuda/linear_epilogue.h"
#include "core/status.h"

namespace ds41::cuda {

// y[n, out] = x[n, in] . W^T. FP8 / FP4 weights take the tensor-core GEMV (tc_gemv_kernels.h,
// row-count invariant) up to 16 rows, and FP8 / FP4 / BF16 weights at any n with row_invariant
// (decode steps and DSpark verification forwards: a row's bits must not depend on the batch); other
// calls keep the CUDA-core kernels (prefill chunks below the tensor-core GEMMs' row count, the
// DSpark draft's BF16 heads).
Status run_linear(const DeviceWeight& w, const float* x, int64_t n, float* y, cudaStream_t stream,
                  bool row_invariant = false);
// Two weights of the same shape and format over the same x (the shared expert's w1 and w3): y = x .
// w^T and y2 = x . w2^T, each as run_linear computes it; calls the tensor-core GEMV takes run as one
// launch, others as two.
// y = RMSNorm(x; norm_weight, eps) . W^T (MODEL_SPEC 3.4.2's q_r = RMSNorm(wq_a x) into wq_b): the bits of
// run_rms_norm(x, n, in, norm_weight, eps, x) followed by run_linear(w, x, n, y). Where the tensor-core GEMV
// takes the call (decode-sized or row_invariant, a dense FP8 / FP4 / BF16 weight) the norm happens inside
// its staging of x (one launch, x untouched); otherwise x is normalized in place first (x may be
// overwritten: the caller must not read the raw rows afterwards).
// map (nullable; fused_rows_kernels.h HcMapFold, DS41_HC_MAP_FOLD): a site's map as extra blocks of the one launch
// where the tensor-core GEMV takes it (tcg::try_dense); map->folded says whether it ran (else the caller's).
Status run_linear_normed(const DeviceWeight& w, float* x, int64_t n, float* y, const float* norm_weight, float eps,
                         cudaStream_t stream, bool row_invariant = false, HcMapFold* map = nullptr);
// run_linear_normed's one-launch form alone: *took = true when the tensor-core GEMV took the call (the norm
// inside its staging, x untouched), false when nothing was launched (x untouched; a bad weight is left to
// the caller's fallback to report). So x may feed several normed calls (an index source's wq_b and
// idx_wq_b, MODEL_SPEC 3.4.2 / 3.4.6).
Status try_linear_normed(const DeviceWeight& w, const float* x, int64_t n, float* y, const float* norm_weight,
                         float eps, cudaStream_t stream, bool row_invariant, bool* took, HcMapFold* map = nullptr);
Status run_linear_pair(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, float* y2,
                       cudaStream_t stream, bool row_invariant = false);
// Two weights of one format and input width over the same rows of x, each with its own output width (y:
// rows of w.out_dim floats, y2: rows of w2.out_dim), in one launch where the tensor-core GEMV takes both
// (decode-sized or row_invariant calls): *took = true, and y, y2 hold the bits of run_linear(w) and
// run_linear(w2). Otherwise nothing is launched and *took = false (the caller runs the two linears; a bad
// weight is left to them to report). The attention's wq_a and wkv of a decode step (one launch fewer).
Status try_linear_dual(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y, float* y2,
                       cudaStream_t stream, bool row_invariant, bool* took);
// try_linear_dual over the rows of x normalized (run_rms_norm(x, n, in, norm_weight, eps) then the two linears,
// x itself left as it is): one launch where the tensor-core GEMV takes both with the norm in the staging they
// share (*took = true; y and y2 the bits of run_linear_normed's); otherwise nothing launched, *took = false. The
// attention's wq_b and idx_wq_b over q_r at an index layer of a decode step (DS41_QB_DUAL_NORMED).
Status try_linear_dual_normed(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* y,
                              float* y2, const float* norm_weight, float eps, cudaStream_t stream, bool row_invariant,
                              bool* took);
// MODEL_SPEC 3.4.8 grouped projection (as ops::Backend::grouped_linear).
Status run_grouped_linear(const DeviceWeight& w, int64_t groups, const float* x, int64_t n, float* y,
                          cudaStream_t stream, bool row_invariant = false);
// Grouped expert linear: rows [offsets[e], offsets[e+1]) of x use weights[e] (a DEVICE array of
// n_experts DeviceWeight, all with the same format and dims). offsets: device int64
// [n_experts + 1]; m_max: host upper bound of offsets[n_experts] (rows of x and y).
// Kernel limits (linear_kernels.cu, docs/gpu_kernels.md): n_experts <= 2048; the format is read
// per expert on the device, so only the vector decoders run: in_dim % 4 == 0 (FP4: % 32) and
// payloads aligned (FP8 / FP4 4 bytes, BF16 8, F32 16); rows >= offsets[n_experts] are not written.
// format: the experts' common format when the caller knows it (kNone: unknown); an FP8 / FP4 format
// lets decode-sized calls (m_max <= 16) take the tensor-core GEMV (tc_gemv_kernels.h).
// routing_early: offsets were written two or more launches back in this stream (launch.h contract 3;
// the MoE's w2 after its pair), so the tensor-core GEMV may start before its PDL wait (tcg::try_experts).
Status run_expert_linear(const DeviceWeight* weights, int64_t n_experts, int64_t out_dim, int64_t in_dim,
                         const int64_t* offsets, const float* x, int64_t m_max, float* y,
                         cudaStream_t stream, quant::WeightFormat format = quant::WeightFormat::kNone,
                         bool routing_early = false, SharedUnits* shared = nullptr);

// Two expert matrices of the same shape and format over the same rows (the MoE's w1 and w3): y =
// x . weights^T and y2 = x . weights2^T, the contract of run_expert_linear for each. Decode-sized
// calls of a known FP8 / FP4 format run as one launch (tc_gemv_kernels.h); everything else as two.
Status run_expert_linear_pair(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                              int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                              int64_t m_max, float* y, float* y2, cudaStream_t stream,
                              quant::WeightFormat format = quant::WeightFormat::kNone);

// run_expert_linear_pair over routed rows read through x_rows: routed row r is x[x_rows[r]] (rows of
// in_dim floats; the MoE's routing permutation, gpu_moe_layer.cpp). The tensor-core GEMV stages those
// rows straight from x (no gathered copy, no launch for it: the same floats, so the same bits as
// gathering first); a call it does not take gathers them into `gathered` ([m_max, in_dim]) and runs as
// run_expert_linear_pair.
Status run_expert_linear_pair_rows(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                                   int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                                   const int64_t* x_rows, float* gathered, int64_t m_max, float* y, float* y2,
                                   cudaStream_t stream, quant::WeightFormat format);

// y = x . w^T into the rows' mHC streams (linear_epilogue.h HcExpandEpilogue: the attention's wo_b and
// the expand after it). Where the tensor-core GEMV takes the call (run_linear's rule) it is one launch
// and y is not written; otherwise run_linear into y, then run_hc_expand.
Status run_linear_expand(const DeviceWeight& w, const float* x, int64_t n, float* y, const HcExpandEpilogue& ex,
                         cudaStream_t stream, bool row_invariant = false);

// A pair with its SwiGLU (linear_epilogue.h): act = swiglu(x . w^T, x . w2^T) with the epilogue's limit
// and row scales. Where the tensor-core GEMV takes the pair (decode sizes, row_invariant) with its dense
// SwiGLU switch on it is one launch and g / u are not written; otherwise run_linear_pair into g / u, then
// run_swiglu into act.
Status run_linear_pair_swiglu(const DeviceWeight& w, const DeviceWeight& w2, const float* x, int64_t n, float* g,
                              float* u, const SwigluEpilogue& sw, cudaStream_t stream, bool row_invariant = false);

// The routed experts' pair with its SwiGLU: run_expert_linear_pair_rows (x_rows non-null) or
// run_expert_linear_pair (x_rows null; `gathered` unused) into g / u, then run_swiglu over the m_max
// rows into act (row_scale per routed row: the routing weights); one launch where the tensor-core GEMV
// takes the call (g / u then not written).
Status run_expert_linear_pair_swiglu(const DeviceWeight* weights, const DeviceWeight* weights2, int64_t n_experts,
                                     int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                                     const int64_t* x_rows, float* gathered, int64_t m_max, float* g, float* u,
                                     const SwigluEpilogue& sw, cudaStream_t stream, quant::WeightFormat format,
                                     SharedUnits* shared = nullptr);

// Tests: caps the row-group slots (blocks along W rows) of the persistent GEMV launches and of the
// tensor-core GEMV (0: the device's fill), so small shapes exercise warps that loop over many row
// groups. Not thread-safe.
void set_persist_slot_cap_for_tests(int cap);
// Tests: the persistent GEMV's pipeline: 0 the register double buffer, 1 the shared-memory ring
// (cp.async, 4 stages per warp), -1 as DS41_GEMV_PIPELINE says (regs | ring; default regs).
void set_persist_ring_for_tests(int mode);
// Tests: the chunks per lane per batch (U, 3..5) of the one-row persistent GEMV (FP8 dense, experts
// of a known format); 0: the launcher's choice (fewest idle lanes). Every U gives the same bits.
void set_persist_u_for_tests(int u);
// Tests: the tensor-core GEMV of decode (tc_gemv_kernels.h): 0 off, 1 on, -1 as DS41_TC_GEMV says
// (default on; DS41_TC_GEMV=0 turns it off).
void set_tc_gemv_for_tests(int mode);
// Tests: the x rows per block of the tensor-core GEMV (2, 3, 4 or 6; 0: the launcher's choice). A
// row's bits do not depend on it.
void set_tc_gemv_rows_per_block_for_tests(int nb);
// The tensor-core GEMV's shared-memory weight ring (tcg::set_ring_for_tests): -1 the environment
// (DS41_TCG_RING), 0 off, 1 where it keeps the blocks per SM, 2 / 3 / 4 stages forced.
void set_tc_gemv_ring_for_tests(int mode);
// The tensor-core GEMV's FP8 16-byte pieces (tcg::set_fp8_wide_for_tests): -1 the environment
// (DS41_TCG_FP8_WIDE), 0 off, 1 on.
void set_tc_gemv_fp8_wide_for_tests(int mode);
// The tensor-core GEMV's early start (DS41_TCG_EARLY, default on): the dense kernel's first weight
// loads before its PDL wait (-1 the environment, 0 off, 1 on). No value changes.
void set_tc_gemv_early_for_tests(int before_wait);
// The expert GEMV's x staging before its first weight loads (tcg::set_expert_stage_first_for_tests, opt-in
// DS41_TCG_EXPERT_STAGE_FIRST=1): -1 the environment, 0 off, 1 on. No value changes.
void set_tc_gemv_expert_stage_first_for_tests(int mode);
// The expert GEMV's early start where run_expert_linear's caller says the routing is settled
// (tcg::set_expert_early_for_tests, DS41_TCG_EXPERT_EARLY, default on): -1 the environment, 0 off, 1 on.
void set_tc_gemv_expert_early_for_tests(int mode);
// A dense pair's SwiGLU as the tensor-core GEMV's epilogue (tcg::set_dense_swiglu_for_tests, opt-in
// DS41_TCG_DENSE_SWIGLU=1): -1 the environment, 0 off, 1 on. Off: run_linear_pair_swiglu is two launches.
void set_tc_gemv_dense_swiglu_for_tests(int mode);
// The shared expert as extra units of the decode MoE's routed launches (DS41_MOE_SHARED_FOLD=1, opt-in until
// timed; linear_epilogue.h SharedUnits, passed to run_expert_linear_pair_swiglu and run_expert_linear): -1 the
// environment, 0 off, 1 on; moe_shared_fold() its state. On, dense pairs with a SwiGLU take the epilogue
// (set_tc_gemv_dense_swiglu_for_tests' on), so the shared expert's bits do not depend on where it ran.
void set_moe_shared_fold_for_tests(int mode);
bool moe_shared_fold();
// Rows up to which FP8 / FP4 calls without row_invariant take the tensor-core GEMV (tcg::kDecodeRows): the
// calls whose dense pairs run_linear_pair_swiglu fuses.
inline constexpr int64_t kTensorCoreGemvRows = 16;

}  // namespace ds41::cuda
