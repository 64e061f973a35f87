// ds41 backends/cuda: indexer scores over the visible compressed keys (MODEL_SPEC 3.4.6).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backends/cuda/gx_step_kernels.h"
#include "core/status.h"

namespace ds41::cuda {

// out[r, t] = sum_h w[r,h] * relu(q[r,h] . keys[key_begin[r] + t]) * scale for t < visible[r],
// -inf for visible[r] <= t < t_stride. keys: float [*, head_dim] (sequences' keys concatenated).
struct IndexerDeviceArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0, t_stride = 0;
  const float* q = nullptr;            // [n, n_heads, head_dim]
  const float* w = nullptr;            // [n, n_heads]
  const float* keys = nullptr;         // [*, head_dim]
  const int64_t* key_begin = nullptr;  // [n]
  const int64_t* visible = nullptr;    // [n]
  float scale = 1.0f;
  float* out = nullptr;  // [n, t_stride]
  // Packed keys instead of `keys` (indexer_scores_packed_supported): key key_begin[r] + t is the Q_idx
  // row (MODEL_SPEC 3.9 / 5.2: head_dim / 2 bytes of E2M1 codes, low nibble first, then head_dim / 32
  // E8M0 scale bytes) at key_base + key_offsets[key_begin[r] + t] (a negative offset: a zero key), as
  // run_decode_rows_gather(kIdx) reads them; the scores are the bits of the float path over the keys it
  // decodes. No float copy of the keys is written or read.
  const uint8_t* key_base = nullptr;
  const int64_t* key_offsets = nullptr;
  // Packed keys addressed through the pool's pages instead of key_offsets (key_offsets null, row_seq set): key t
  // of row r is entry t of sequence row_seq[r] in key_pages (dev::paged_offset), as run_paged_row_offsets would
  // list it; the same bytes, no offsets launch.
  PagedRowsArgs key_pages;
  const int32_t* row_seq = nullptr;  // [n]
  // The packed kernel only: each head weight w[r, h] multiplied by w_scale as it is read (the float product of
  // run_scale(w, .., w_scale), so the same bits as scaling w first: one launch fewer per index layer). Other
  // paths take 1 only (anything else: invalid_argument).
  float w_scale = 1.0f;
};
Status run_indexer_scores(const IndexerDeviceArgs& a, cudaStream_t stream);

// Whether run_indexer_scores takes packed keys for this call: head_dim 128 (the released width; a lane
// decodes its key into registers), at least 4 heads, fewer than 32 rows (prefill-shaped calls take the
// tensor cores over float keys), and DS41_PACKED_INDEXER not 0.
bool indexer_scores_packed_supported(const IndexerDeviceArgs& a);

}  // namespace ds41::cuda
