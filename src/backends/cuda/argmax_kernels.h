// ds41 backends/cuda: the greedy choice over long rows (a vocabulary of 129,280 logits): the index of
// the largest value, the lowest index on ties, as model::argmax_lowest (MODEL_SPEC 3.10.5, the
// DSpark draft's greedy c_k): a sequential `z[i] > z[best]` scan from index 0, so NaN entries never
// win, +0 and -0 tie, and a row whose first entry is NaN (or whose entries are all NaN) gives 0.
// Many CTAs per row (a slice each) and one small reduction: the one-CTA-per-row top-k took
// ~0.9 ms per vocabulary row. Device pointers, the stream last, no allocation or synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace ds41::cuda {

// Workspace of run_argmax_rows for n rows of t entries (bytes; 8-byte aligned).
size_t argmax_workspace_bytes(int64_t n, int64_t t);
// out[r] = argmax_lowest(x[r * t .. r * t + t)), r < n; t in [1, 2^31).
// checked: the greedy draw of engine::Sampler instead (a served temperature-0 step: engine.h
// StepItem::greedy_only): a row holding NaN or +inf, or whose every entry is -inf, gives
// kArgmaxInvalidRow (the sampler refuses it); any other row the same index (it holds no NaN, so
// argmax_lowest is the first maximum, engine::argmax_token's).
inline constexpr int32_t kArgmaxInvalidRow = -2;
Status run_argmax_rows(const float* x, int64_t n, int64_t t, int32_t* out, void* workspace, cudaStream_t stream,
                       bool checked = false);

}  // namespace ds41::cuda
