// ds41 backends/cuda: fused MoE kernels of the decode step (issue 11: fewer launches per layer),
// each bit-identical to the unfused sequence it names and falling back to it for shapes the fused
// kernel does not take. Contract as moe_kernels.h (device pointers, the stream last, errors as
// Status, no allocation or synchronisation); tests/parity/cuda/fused_rows_parity_test.cpp compares
// each with its unfused sequence bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

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
  uint32_t* counters = nullptr;
};
Status run_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// run_moe_combine(out_perm, slot_pos, experts, n, k, h, y), then y += add (nullable: the shared
// expert's output), then run_hc_expand(streams, y, post, comb, n, c, h): one launch, one thread per
// (row, channel).
Status run_moe_combine_expand(const float* out_perm, const int64_t* slot_pos, const int32_t* experts,
                              int64_t n, int64_t k, int64_t h, const float* add, float* y, float* streams,
                              const float* post, const float* comb, int64_t c, cudaStream_t stream);

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
