// ds41 backends/cuda: the byte offset of a sequence's entry in the KV pool's pages (MODEL_SPEC 5.2: fixed-size
// pages of entries, a sequence's pages listed in order). Shared by the index-list kernels (gx_step_kernels.cu)
// and the packed indexer (indexer_kernels.cu, keys addressed through the pages).
#pragma once

#include <cstdint>

#include "backends/cuda/gx_step_kernels.h"

namespace ds41::cuda::dev {

// Entry k of sequence s (its pages from p.seq_page_begin[s] on).
__device__ __forceinline__ int64_t paged_offset(const PagedRowsArgs& p, int64_t s, int64_t k) {
  const int64_t page = p.pages[p.seq_page_begin[s] + k / p.entries_per_page];
  return page * p.page_bytes + p.offset_in_page + (k % p.entries_per_page) * p.row_bytes;
}

}  // namespace ds41::cuda::dev
