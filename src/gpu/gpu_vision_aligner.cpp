// ds41 gpu: the aligner on the device (MODEL_SPEC 3.11) — the twin of src/model/vision_aligner.cpp:
// each image's final ViT rows laid on its patch grid, zero-padded to multiples of
// downsample_ratio, k x k windows in reading order flattened channel-major (space_to_depth), then
// all images' windows through Linear (+bias) -> exact GELU -> Linear (+bias) as one batch.
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/space_to_depth_kernels.h"
#include "backends/cuda/vision_pointwise_kernels.h"
#include "gpu/gpu_vision_tower.h"

namespace ds41::gpu {

Status GpuVisionTower::align(std::span<const model::VisionImageInput> images,
                             const std::vector<int64_t>& segs, model::VisionImageOutput* out) {
  const int64_t D = c_->vision_hidden_size, k = c_->vision_downsample_ratio, H = c_->hidden_size;
  const DeviceVisionWeights& w = *w_;
  std::vector<int64_t> first{0};  // first window row of each image
  for (size_t i = 0; i < images.size(); ++i) {
    model::VisionImageOutput& o = out[i];
    o.n_llm_h = (images[i].grid_h + k - 1) / k;
    o.n_llm_w = (images[i].grid_w + k - 1) / k;
    first.push_back(first.back() + o.n_llm_h * o.n_llm_w);
  }
  const int64_t m = first.back();
  if (m > M_)
    return internal_error("aligner windows " + std::to_string(m) + " over the workspace's " +
                          std::to_string(M_));
  for (size_t i = 0; i < images.size(); ++i)
    DS41_RETURN_IF_ERROR(cuda::run_space_to_depth(x_ + segs[i] * D, images[i].grid_h, images[i].grid_w, D, k,
                                                  win_ + first[i] * D * k * k, stream_));
  DS41_RETURN_IF_ERROR(linear(w.aligner_w1, win_, m, a1_));
  DS41_RETURN_IF_ERROR(cuda::run_add_bias(a1_, m, H, w.aligner_b1.ptr, stream_));
  DS41_RETURN_IF_ERROR(cuda::run_gelu_erf(a1_, m * H, stream_));
  DS41_RETURN_IF_ERROR(linear(w.aligner_w2, a1_, m, a2_));
  DS41_RETURN_IF_ERROR(cuda::run_add_bias(a2_, m, H, w.aligner_b2.ptr, stream_));
  for (size_t i = 0; i < images.size(); ++i) {
    std::vector<float>& dst = out[i].aligner_out;
    dst.resize(static_cast<size_t>((first[i + 1] - first[i]) * H));
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cudaMemcpyAsync(dst.data(), a2_ + first[i] * H, dst.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_),
                          "download of aligner_out"));
  }
  return ok_status();
}

}  // namespace ds41::gpu
