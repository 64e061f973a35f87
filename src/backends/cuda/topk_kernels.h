// ds41 backends/cuda: top-k with the house tie order, the candidate pool and its restriction
// (MODEL_SPEC 3.4.6). Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the
// stream last, errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op
// in src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// As ops::Backend::topk_rows over scores [n, t] (row stride t): ascending indices, -1 padded.
// workspace: topk_workspace_bytes(n, t, k) (nonzero for long rows of calls of at most 64 rows: the
// chunks' candidates; a call of more rows needs no more than 64 rows' worth).
size_t topk_workspace_bytes(int64_t n, int64_t t, int64_t k);
Status run_topk_rows(const float* scores, int64_t n, int64_t t, int64_t k, int32_t* out, void* workspace,
                     cudaStream_t stream);
// The selection inside run_topk_rows' kernels: the wide select (two passes over the row, then the
// chosen bin's keys; radix_select.cuh) by default, the four-pass select with DS41_TOPK_WIDE=0. The
// same index sets. Tests: 1 wide, 0 four-pass, -1 back to the environment.
void set_topk_wide_for_tests(int wide);
// The emit of rows held in shared memory with one barrier (DS41_TOPK_EMIT_RUNS=1, opt-in until timed) or in
// chunks of blockDim scores with two each; the same outputs. Tests: 1 / 0, -1 back to the environment.
void set_topk_emit_runs_for_tests(int runs);
// The register select (reg_select.cuh: every key in registers, T by a radix-4 search of block-wide counts) for
// rows, chunks and merges of at most 10,240 scores in calls of at most 64 rows, by default (DS41_TOPK_REG=0: the
// radix selects above; calls of more rows keep them until prefill is timed with it). The same index sets and
// order. The pool (run_candidate_pool) takes it too for up to 10,240 blocks in calls of at most 64 rows. CTAs of 256
// threads, or 512 with DS41_TOPK_REG_THREADS=512. Tests: 1 on (256), 2 on (512), 0 off, -1 back to the environment.
void set_topk_reg_for_tests(int reg);
// As ops::Backend::candidate_pool (mask [n, t]).
size_t candidate_pool_workspace_bytes(int64_t n, int64_t t, int64_t block, int64_t keep_blocks);
Status run_candidate_pool(const float* scores, const int64_t* visible, int64_t n, int64_t t, int64_t block,
                          int64_t keep_blocks, uint8_t* mask, void* workspace, cudaStream_t stream);
// scores[r, j] = -inf where j >= t_mask[r] or mask[r * mask_stride + j] == 0 (j < t).
Status run_mask_restrict(float* scores, int64_t n, int64_t t, const uint8_t* mask, int64_t mask_stride,
                         const int64_t* t_mask, cudaStream_t stream);

}  // namespace ds41::cuda
