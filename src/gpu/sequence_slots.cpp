// ds41 gpu: SequenceSlots (sequence_slots.h).
#include "gpu/sequence_slots.h"

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "core/check.h"

namespace ds41::gpu {

Result<SequenceSlots> SequenceSlots::create(const model::KvLayout& layout, int64_t max_slots) {
  if (max_slots <= 0 || max_slots > INT32_MAX)
    return invalid_argument("sequence slots: max_slots must be > 0");
  SequenceSlots s;
  s.max_slots_ = max_slots;
  s.n_layers_ = layout.n_layers;
  s.window_ = layout.window;
  s.row_bytes_ = layout.window_row_bytes;
  s.layer_stride_ = max_slots * s.window_ * s.row_bytes_;
  for (const model::KvSourceLayout& src : layout.sources) {
    if (src.ratio > 1) {
      s.pending_of_source_.push_back(s.n_pending_++);
      s.r_max_ = std::max(s.r_max_, src.ratio);
      s.kv_dim_ = src.kv_dim;
    } else {
      s.pending_of_source_.push_back(-1);
    }
  }
  // The CPU counts ratio * kv_dim floats per part; with mixed ratios r_max pads (none today).
  for (const model::KvSourceLayout& src : layout.sources)
    if (src.ratio > 1) s.pending_slot_floats_ += 2 * src.ratio * src.kv_dim;
  DS41_ASSIGN_OR_RETURN(s.rings_,
                        DeviceBuffer::allocate(static_cast<size_t>(s.n_layers_ * s.layer_stride_),
                                               "window rings (" + std::to_string(max_slots) + " sequences)"));
  DS41_ASSIGN_OR_RETURN(s.pending_, DeviceBuffer::allocate(static_cast<size_t>(max_slots * s.n_pending_ * 2 *
                                                                               s.r_max_ * s.kv_dim_ * 4),
                                                           "pending compressor groups"));
  s.free_.reserve(static_cast<size_t>(max_slots));
  for (int64_t i = max_slots - 1; i >= 0; --i) s.free_.push_back(static_cast<int32_t>(i));
  return s;
}

Result<int32_t> SequenceSlots::allocate() {
  if (free_.empty())
    return resource_exhausted("GPU engine: all " + std::to_string(max_slots_) +
                              " sequence slots are live (raise the engine's max_sequences)");
  const int32_t s = free_.back();
  free_.pop_back();
  return s;
}

void SequenceSlots::release(int32_t slot) {
  DS41_CHECK(slot >= 0 && slot < max_slots_, "release of an unknown sequence slot");
  free_.push_back(slot);
}

Status SequenceSlots::clear_pending(int32_t slot, cudaStream_t stream) const {
  const size_t p = static_cast<size_t>(n_pending_ * 2 * r_max_ * kv_dim_) * sizeof(float);
  if (p == 0) return ok_status();
  return cuda::cuda_status(cudaMemsetAsync(pending_.as<uint8_t>() + slot * p, 0, p, stream), "clear pending groups");
}

Status SequenceSlots::copy(int32_t src, int32_t dst, cudaStream_t stream) const {
  const size_t w = static_cast<size_t>(window_ * row_bytes_);
  if (n_layers_ > 0 && w > 0)
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpy2DAsync(rings_.as<uint8_t>() + dst * w, static_cast<size_t>(layer_stride_),
                          rings_.as<uint8_t>() + src * w, static_cast<size_t>(layer_stride_), w,
                          static_cast<size_t>(n_layers_), cudaMemcpyDeviceToDevice, stream),
        "copy window rings"));
  const size_t p = static_cast<size_t>(n_pending_ * 2 * r_max_ * kv_dim_) * sizeof(float);
  if (p > 0)
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cudaMemcpyAsync(pending_.as<uint8_t>() + dst * p, pending_.as<uint8_t>() + src * p,
                                          p, cudaMemcpyDeviceToDevice, stream),
                          "copy pending groups"));
  return ok_status();
}

Status SequenceSlots::download_rings(int32_t slot, uint8_t* host, cudaStream_t stream) const {
  const size_t w = static_cast<size_t>(window_ * row_bytes_);
  if (n_layers_ == 0 || w == 0) return ok_status();
  return cuda::cuda_status(cudaMemcpy2DAsync(host, w, rings_.as<uint8_t>() + slot * w,
                                             static_cast<size_t>(layer_stride_), w, static_cast<size_t>(n_layers_),
                                             cudaMemcpyDeviceToHost, stream),
                           "download window rings");
}

Status SequenceSlots::upload_rings(int32_t slot, const uint8_t* host, cudaStream_t stream) const {
  const size_t w = static_cast<size_t>(window_ * row_bytes_);
  if (n_layers_ == 0 || w == 0) return ok_status();
  return cuda::cuda_status(cudaMemcpy2DAsync(rings_.as<uint8_t>() + slot * w, static_cast<size_t>(layer_stride_),
                                             host, w, w, static_cast<size_t>(n_layers_), cudaMemcpyHostToDevice,
                                             stream),
                           "upload window rings");
}

Status SequenceSlots::download_pending(int32_t slot, int64_t j, int64_t rows, float* a, float* b,
                                       cudaStream_t stream) const {
  DS41_CHECK(j >= 0 && j < n_pending_ && rows <= r_max_, "pending group out of range");
  const size_t bytes = static_cast<size_t>(rows * kv_dim_) * sizeof(float);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(a, pending_base() + pending_row(slot, j, 0, 0) * kv_dim_,
                                                         bytes, cudaMemcpyDeviceToHost, stream),
                                         "download a pending group"));
  return cuda::cuda_status(cudaMemcpyAsync(b, pending_base() + pending_row(slot, j, 1, 0) * kv_dim_, bytes,
                                           cudaMemcpyDeviceToHost, stream),
                           "download a pending group");
}

Status SequenceSlots::upload_pending(int32_t slot, int64_t j, int64_t rows, const void* a, const void* b,
                                     cudaStream_t stream) const {
  DS41_CHECK(j >= 0 && j < n_pending_ && rows <= r_max_, "pending group out of range");
  const size_t bytes = static_cast<size_t>(rows * kv_dim_) * sizeof(float);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpyAsync(pending_base() + pending_row(slot, j, 0, 0) * kv_dim_, a,
                                                         bytes, cudaMemcpyHostToDevice, stream),
                                         "upload a pending group"));
  return cuda::cuda_status(cudaMemcpyAsync(pending_base() + pending_row(slot, j, 1, 0) * kv_dim_, b, bytes,
                                           cudaMemcpyHostToDevice, stream),
                           "upload a pending group");
}

}  // namespace ds41::gpu
