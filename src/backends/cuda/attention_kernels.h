// ds41 backends/cuda: sparse attention over window rows + selected compressed entries with the sink
// (MODEL_SPEC 3.4.7). Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the
// stream last, errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op
// in src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// As ops::AttentionArgs, but the entries are rows of one float buffer addressed by index.
struct SparseAttentionArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0;
  const float* q = nullptr;             // [n, n_heads, head_dim]
  const int64_t* kv_offsets = nullptr;  // [n + 1]
  const int32_t* kv_index = nullptr;    // [kv_offsets[n]] row numbers into kv
  const float* kv = nullptr;            // [rows, head_dim]
  const float* sink = nullptr;          // [n_heads]
  float scale = 1.0f;
  float* out = nullptr;             // [n, n_heads, head_dim]
  int64_t max_entries_per_row = 0;  // host: an upper bound of kv_offsets[r+1] - kv_offsets[r]
  // Device scratch of at least sparse_attention_workspace_bytes(n, n_heads, head_dim,
  // max_entries_per_row) bytes, 4-byte aligned: the per-split softmax states of the decode path (rows
  // split over several CTAs when few rows leave SMs idle). May be null where that size is 0.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The caller's promise that every entry value is exact in bf16 (fake-quantized rows: Q_win, Q_kv,
  // MODEL_SPEC 3.9). Lets calls of more than 16 rows take the tensor-core kernel
  // (sparse_attention_tc_kernels.h: q and the probabilities split into three bf16 parts, so the
  // products stay exact); false keeps the float kernels. DS41_TC_ATTENTION=0 in the environment
  // turns the tensor-core kernel off (A/B measurements).
  bool entries_on_bf16_grid = false;
  // The caller's request that each row's bits not depend on the call (its row count, the other
  // rows): decode steps and DSpark verification forwards, whose rows must equal a one-row step's
  // (MODEL_SPEC 3.10.7 lossless). Every such call takes the decode path with the splits of a
  // one-row call (decode_splits of 1 row: from n_heads and max_entries_per_row alone), in passes of
  // at most kInvariantRowsPerPass rows when the splits need the workspace.
  bool row_invariant = false;
  // Optional (rope_n_freq > 0): the output rows rotated back (MODEL_SPEC 7.9), exactly as
  // run_rope(out, n, n_heads, head_dim, rope_pos, rope_inv_freq, rope_n_freq, /*inverse=*/true)
  // after the attention: inside the decode path's split combine (one launch less), a run_rope
  // launch on the other paths.
  const int64_t* rope_pos = nullptr;
  const float* rope_inv_freq = nullptr;
  int64_t rope_n_freq = 0;
  // With rope_n_freq > 0: q is rotated forward first (MODEL_SPEC 3.4.2), exactly as
  // run_rope(q, n, n_heads, head_dim, rope_pos, rope_inv_freq, rope_n_freq, /*inverse=*/false):
  // inside the decode path's split kernel as it loads q (one launch less; q unchanged), a run_rope
  // launch in place on the other paths (q must then be writable).
  bool rotate_q = false;
  // Optional: zeroed device counters, at least sparse_attention_counter_count(n, n_heads) of them,
  // left zeroed by every call (self-resetting; calls on one stream may share them). With them the
  // decode path's split combine runs in the split kernel's last CTA of each (row, head group): one
  // launch instead of two, the same bits. Null: the combine launch.
  uint32_t* counters = nullptr;
  int64_t counters_size = 0;
};
// Workspace run_sparse_attention needs for any call with up to n rows and up to max_entries_per_row
// entries per row (so it can be sized once from the step limits), row_invariant calls included; 0
// when no such call splits.
size_t sparse_attention_workspace_bytes(int64_t n, int64_t n_heads, int64_t head_dim,
                                        int64_t max_entries_per_row);
// Counters SparseAttentionArgs::counters needs for any call with up to n rows (0 for n <= 0).
int64_t sparse_attention_counter_count(int64_t n, int64_t n_heads);
Status run_sparse_attention(const SparseAttentionArgs& a, cudaStream_t stream);
// Tests: the decode vector kernel's prefetch ring depth (0: one entry in flight; 2, 4: cp.async slots),
// -1 back to DS41_ATTN_PREFETCH. Every depth gives the same bits.
void set_attention_prefetch_for_tests(int depth);
// Tests: the vector split kernel's warp merge weights in shared memory (1) or per thread (0), -1 back to
// DS41_ATTN_MERGE_SHARED (default 1). The same bits either way.
void set_attention_merge_shared_for_tests(int mode);

}  // namespace ds41::cuda
