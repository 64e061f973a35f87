// ds41 backends/cuda: fused MoE kernels of the decode step (issue 11: fewer launches per layer),
// each bit-identical to the unfused sequence it names and falling back to it for shapes the fused
// kernel does not take. Contract as moe_kernels.h (device pointers, the stream last, errors as
// Status, no allocation or synchronisation); tests/parity/cuda/fused_rows_parity_test.cpp compares
// each with its unfused sequence bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "backends/cuda/linear_epilogue.h"
#include "core/status.h"

namespace ds41::cuda {

// run_router + run_moe_bucket in one launch: one router block per row, and the block that routes
// last (an atomic counter, reset by that block) buckets the n * k pairs (n * k <= 256: one
// bucketing chunk; more pairs run the unfused sequence). Arguments as run_router and
// run_moe_bucket; counters: at least 1 zeroed uint32 on the device that only this stream's fused
// kernels use (zero again after every call).
struct MoeRouteArgs {
  const float* logits = nullptr;
  int64_t n = 0, n_experts = 0, k = 0;
  const float* bias = nullptr;
  const float* bias_vl = nullptr;  // nullable
  const uint8_t* vl = nullptr;     // nullable
  float temp = 1.0f, route_scale = 1.0f;
  int32_t* experts = nullptr;
  float* weights = nullptr;
  int64_t* offsets = nullptr;
  int64_t* perm_rows = nullptr;
  float* perm_weight = nullptr;
  int64_t* slot_pos = nullptr;
  void* workspace = nullptr;  // moe_bucket_workspace_bytes(n, k, n_experts), for the unfused path
  // Its size where the caller knows it (0: unknown). The MoE entry's split routing (DS41_ENTRY_SPLIT_ROUTE=1)
  // keeps the gate blocks' candidates there: tcg::entry_split_route_bytes(slots).
  size_t workspace_bytes = 0;
  uint32_t* counters = nullptr;
};
Status run_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// The MoE's entry at ONE row of a decode step (MODEL_SPEC 3.3 collapse, 3.5 router): the FFN site's
// collapse of the row's C = 4 streams with collapse_w and its RMSNorm (run_hc_site's collapse part),
// written to x; the gate's GEMV (run_linear, row-invariant) into route.logits; run_moe_route of the
// row (route.n = 1). One launch of the tensor-core GEMV (tc_gemv_kernels.h tc_moe_entry_kernel) where
// it takes the shape (BF16 gate, h % 1024 == 0, 16-byte aligned streams / x / norm weight / gate,
// route.counters set), the three as separate launches otherwise: the same bits either way (every
// block collapses the row with hc_collapse_norm_quads_kernel's code, the gate's KS is try_dense's,
// the router's code is moe_route_kernel's). route.counters[0]: zero before, zero after.
struct MoeEntryArgs {
  CollapseRow row;     // its x required (the MoE's other readers)
  MoeRouteArgs route;  // n = 1, logits [n_experts] written
};
// Wanted unless DS41_MOE_ENTRY=0 or set_moe_entry_for_tests(0) (measured: fused_moe_kernels.cu).
bool moe_entry_enabled();
void set_moe_entry_for_tests(int mode);  // -1 the environment, 0 off, 1 on
Status run_moe_entry(const DeviceWeight& gate, const MoeEntryArgs& a, cudaStream_t stream);
// run_moe_entry calls that took the one launch so far (tests: the path is taken).
uint64_t moe_entry_fused_launches();

// run_moe_combine(out_perm, slot_pos, experts, n, k, h, y), then y += add (nullable: the shared
// expert's output), then run_hc_expand(streams, y, post, comb, n, c, h): one launch, one thread per
// (row, channel).
Status run_moe_combine_expand(const float* out_perm, const int64_t* slot_pos, const int32_t* experts,
                              int64_t n, int64_t k, int64_t h, const float* add, float* y, float* streams,
                              const float* post, const float* comb, int64_t c, cudaStream_t stream);

// The next site's collapse and norm in the combine's launch (MODEL_SPEC 3.3: the next layer's attention site
// collapses the streams this launch writes, with the pre of the FFN site that just ran): every thread collapses
// its channel's c = 4 new stream values (hc_collapse_kernel's fp32 order) into x, and the block of each row
// that finishes last (a counter per row, zero before and after) normalizes the row in place (run_rms_norm's
// float64 order for sum_threads threads, then fl(fl(v inv) norm_weight)): the bits of run_hc_site's collapse
// part (hc_collapse_norm_quads_kernel) over the streams written, one launch fewer on the decode's chain.
struct NextCollapse {
  const float* collapse_w = nullptr;   // [n, 4] the rows' pre weights
  const float* norm_weight = nullptr;  // [h] (nullable: 1)
  float eps = 0.0f;
  int sum_threads = 0;                 // rms_norm_sum_threads(n, h)
  float* x = nullptr;                  // [n, h] the collapsed, normed rows
  uint32_t* counters = nullptr;        // [n], zero
};
// run_moe_combine_expand, then (next set, c == 4) the next collapse; refused (invalid argument) where the fused
// launch cannot take the shape (more than 65535 rows, c != 4, h % 4 != 0, h > 16384).
Status run_moe_combine_expand_collapse(const float* out_perm, const int64_t* slot_pos, const int32_t* experts,
                                       int64_t n, int64_t k, int64_t h, const float* add, float* y, float* streams,
                                       const float* post, const float* comb, int64_t c, const NextCollapse& next,
                                       cudaStream_t stream);
// Whether the decode step takes run_moe_combine_expand_collapse (DS41_COMBINE_COLLAPSE=1, opt-in: measured slower).
bool combine_collapse_enabled();
void set_combine_collapse_for_tests(int mode);  // -1 the environment, 0 off, 1 on

// Two run_swiglu calls (the routed experts' rows and the shared expert's) in one launch: out_a =
// swiglu(g_a, u_a) over n_a x dim_a (row_scale_a nullable), out_b likewise, the same limit.
struct SwigluRows {
  const float* g = nullptr;
  const float* u = nullptr;
  int64_t n = 0, dim = 0;
  const float* row_scale = nullptr;
  float* out = nullptr;
};
Status run_swiglu_pair(const SwigluRows& a, const SwigluRows& b, float limit, cudaStream_t stream);

}  // namespace ds41::cuda
