// ds41 backends/cuda: MoE routing, stable bucketing by expert and the combine (MODEL_SPEC 3.5).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// As ops::Backend::router (same tie order, same outputs). A row with fewer than k selectable
// (non -inf) experts gets expert -1 / weight 0 in the missing slots (the CPU op aborts).
// The router's expert selection (moe_device.cuh route_row's sel_mode): 1 (default) two stages by k picks
// each, 2 two stages by sorting (each warp's 64 keys by a bitonic network, then warp 0's 64 candidates;
// DS41_ROUTE_SORT=1, opt-in: not faster on an H100, docs/perf/README.md session of 2026-12-07 14:51 UTC),
// 0 block-wide rounds (DS41_ROUTE_TWO_STAGE=0); the two stages where E <= 512 and k <= 8, else the rounds.
// The same picks in every mode. Tests: -1 the environment, else the mode.
int router_selection();
void set_router_selection_for_tests(int mode);

Status run_router(const float* logits, int64_t n, int64_t n_experts, const float* bias,
                  const float* bias_vl /* nullable */, const uint8_t* vl /* nullable */, int64_t k,
                  float temp, float route_scale, int32_t* experts, float* weights, cudaStream_t stream);
// Stable bucketing of the n*k (row, slot) pairs by expert: perm lists the pairs expert by expert
// (ascending id), rows ascending inside an expert (the CPU's order). offsets: int64
// [n_experts + 1]; perm_rows: int64 [n*k]; perm_weight: float [n*k] (the pair's routing weight);
// slot_pos: int64 [n*k], slot_pos[r*k + j] = index in perm of pair (r, j). Deterministic.
// A pair whose expert is outside [0, n_experts) is not bucketed (slot_pos -1; combine skips it).
size_t moe_bucket_workspace_bytes(int64_t n, int64_t k, int64_t n_experts);
Status run_moe_bucket(const int32_t* experts, const float* weights, int64_t n, int64_t k, int64_t n_experts,
                      int64_t* offsets, int64_t* perm_rows, float* perm_weight, int64_t* slot_pos,
                      void* workspace, cudaStream_t stream);
// y[r, :] = sum over the k pairs of row r, in ascending expert id, of out_perm[slot_pos[r*k+j], :]
// (overwrites y: the CPU adds expert outputs into a zeroed y in ascending expert order).
Status run_moe_combine(const float* out_perm, const int64_t* slot_pos, const int32_t* experts, int64_t n,
                       int64_t k, int64_t dim, float* y, cudaStream_t stream);

}  // namespace ds41::cuda
