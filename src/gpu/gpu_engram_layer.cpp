// ds41 gpu: the Engram module on the device (MODEL_SPEC 3.2.4) — the twin of
// src/model/engram_layer.cpp: gather the dequantized table rows of the positions' hash ids (the
// hasher ran on the host in the step plan; tables in device memory or mapped host-pinned memory),
// project with engram.wkv into one key per stream and a shared value, gated update of every stream.
#include <string>

#include "backends/cuda/engram_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "gpu/gpu_forward.h"

namespace ds41::gpu {

Status GpuForward::engram_stage(int64_t l) {
  const auto& eng = m_->weights().layers[l].engram;
  if (!eng || !m_->hasher()) return internal_error("engram layer without weights or hasher");
  const int64_t n = n_, H = c_->hidden_size, C = c_->hc_mult, ed = c_->engram_head_dim;
  const int64_t li = c_->engram_index(l), cols = m_->hasher()->n_cols();
  DS41_RETURN_IF_ERROR(cuda::run_engram_gather(eng->table, eng->table_scale, eng->rows, ed, engram_ids_[li],
                                               n, cols, ws_.erows, stream_));
  DS41_RETURN_IF_ERROR(linear(eng->wkv, ws_.erows, n, ws_.ez));
  // Image-span rows are DEAD (MODEL_SPEC 3.2.4): their gates are 0, the streams stay unchanged.
  return cuda::run_engram_update(ws_.streams, ws_.ez, eng->omega.ptr, vl_, n, C, H,
                                 static_cast<float>(c_->rms_norm_eps), ws_.gates, stream_);
}

}  // namespace ds41::gpu
