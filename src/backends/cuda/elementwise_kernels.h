// ds41 backends/cuda: embeddings, RMSNorm, RoPE, SwiGLU and row movement (gather / scatter / slices).
// Contract shared by the GPU executor (src/gpu) and the kernels: device pointers, the stream last,
// errors as Status, no allocation or synchronisation (graph-capturable), semantics of the CPU op in
// src/ops/backend.h (the oracle; tests/parity/cuda compares them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// An id outside [0, rows) gives a NaN row (the CPU op aborts; kernels cannot).
Status run_embed_bf16(const uint8_t* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                      float* out, cudaStream_t stream);
// y may alias x.
Status run_rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y,
                    cudaStream_t stream);
// The layout of run_rms_norm's float64 sum of squares for n rows of dim: thread t of T (the
// returned count) sums elements t, t + T, t + 2T, ... in that order, then dev::block_sum over T
// threads. Fused kernels that normalize rows reproduce it (fused_rows_kernels.cu), so they keep
// run_rms_norm's bits.
int rms_norm_sum_threads(int64_t n, int64_t dim);
Status run_rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int64_t* pos,
                const float* inv_freq, int64_t n_freq, bool inverse, cudaStream_t stream);
Status run_swiglu(const float* g, const float* u, int64_t n, int64_t dim, float limit,
                  const float* row_scale /* nullable */, float* out, cudaStream_t stream);
Status run_scale(float* x, int64_t count, float s, cudaStream_t stream);               // x *= s
Status run_add_inplace(float* y, const float* x, int64_t count, cudaStream_t stream);  // y += x
// dst[i, :] = src[idx[i], :] (idx: device int64 [m]; idx < 0 writes zeros).
Status run_gather_rows(const float* src, const int64_t* idx, int64_t m, int64_t dim, float* dst,
                       cudaStream_t stream);
// dst[i, :] = *row_ptrs[i] (device array of m device pointers, each to dim floats; null: zeros).
Status run_gather_row_ptrs(const float* const* row_ptrs, int64_t m, int64_t dim, float* dst,
                           cudaStream_t stream);
// dst[idx[i], :] = src[i, :] (idx < 0: skipped).
Status run_scatter_rows(const float* src, const int64_t* idx, int64_t m, int64_t dim, float* dst,
                        cudaStream_t stream);
// out[r, :] = x[r, col_begin : col_begin + width] of x [n, x_cols].
Status run_slice_cols(const float* x, int64_t n, int64_t x_cols, int64_t col_begin, int64_t width, float* out,
                      cudaStream_t stream);

}  // namespace ds41::cuda
