// ds41 backends/cuda: the tensor-core sparse attention (sparse_attention_tc_kernels.cu) behind
// run_sparse_attention for prefill-shaped calls whose entries lie on the bf16 grid
// (SparseAttentionArgs::entries_on_bf16_grid). Same contract as run_sparse_attention.
#pragma once

#include <cuda_runtime_api.h>

#include "backends/cuda/attention_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

// True when the tensor-core kernel can take the call: entries on the bf16 grid, head_dim 64, 128 or
// 512 (4 warps x multiples of 16 channels; the released width is 512).
bool sparse_attention_tc_supported(const SparseAttentionArgs& a);
// The kernel itself (run_sparse_attention dispatches to it; exposed for the parity table and the
// benchmark). kv 16-byte aligned, out 8-byte aligned.
Status run_sparse_attention_tc(const SparseAttentionArgs& a, cudaStream_t stream);

}  // namespace ds41::cuda
