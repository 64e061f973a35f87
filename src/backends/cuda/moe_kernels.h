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
// The router's expert picks in two stages (each warp its k best, then warp 0 the k best of those:
// moe_device.cuh) where E <= 512 and k <= 8, else block-wide rounds; the same picks either way.
// Default on; DS41_ROUTE_TWO_STAGE=0 turns it off (measurements). Tests: -1 the environment, 0 off, 1 on.
bool router_two_stage();
void set_router_two_stage_for_tests(int mode);

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
