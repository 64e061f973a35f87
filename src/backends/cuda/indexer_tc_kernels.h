// ds41 backends/cuda: the tensor-core indexer scores (indexer_tc_kernels.cu) behind
// run_indexer_scores: bit-identical to the float kernel (a per-row exactness certificate, the CPU's
// order where it fails), head_dim 128 and up to 32 heads. Same contract as run_indexer_scores.
#pragma once

#include <cuda_runtime_api.h>

#include "backends/cuda/indexer_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

bool indexer_scores_tc_supported(const IndexerDeviceArgs& a);
// q and keys 16-byte aligned.
Status run_indexer_scores_tc(const IndexerDeviceArgs& a, cudaStream_t stream);

}  // namespace ds41::cuda
