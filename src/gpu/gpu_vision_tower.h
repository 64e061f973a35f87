// ds41 gpu: GpuVisionTower — the device twin of model::VisionTower (MODEL_SPEC 3.11): patch
// embedding, the pre-norm blocks with split-half 2D RoPE and full attention within each image, the
// final RMSNorm, then the aligner (zero-padded 3x3 unshuffle, Linear, exact GELU, Linear), batched
// over images, on the DeviceModel's vision weights. The file pair mirrors the reference's:
//   gpu_vision_tower.cpp   ~ vision_tower.cpp    batches, patch embedding, blocks, final norm
//   gpu_vision_aligner.cpp ~ vision_aligner.cpp  unshuffle, the two linears, GELU
//
// Numerics (docs/vision.md "GPU tower"): every linear is a BF16 tensor-core GEMM through
// TensorCoreLinear (the weights are BF16 in the checkpoint, MODEL_SPEC 2.5, so they are read in
// place; the float32 activations are split into three bfloat16 parts, so each product is the CPU
// op's exact product and only the order of the float32 sums differs); norms, RoPE, SwiGLU, GELU,
// bias and residual adds are the backends/cuda kernels with the CPU ops' arithmetic; attention is
// a float32 online-softmax kernel (dense_attention_kernels.h). The golden tolerance (e_r <= 1e-4
// per row of vit_out / aligner_out / span_embeds) is met with two orders of magnitude to spare on
// the H200 (tests/gpu/engine/gpu_vision_test.cpp prints the numbers).
//
// Memory: one workspace allocated at creation for `max_patches` patches per batch; encode()
// splits a larger request into batches of whole images (attention never crosses images, so the
// split is exact). encode() is synchronous (uploads, kernels on `stream`, downloads, wait).
// Thread model: one per engine stream (not thread-safe); the DeviceModel must outlive it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "gpu/device_buffer.h"
#include "gpu/device_model.h"
#include "gpu/tensor_core_linear.h"
#include "model/vision_span.h"
#include "model/vision_tower.h"

namespace ds41::gpu {

struct GpuVisionLimits {
  int64_t max_patches = 0;   // patches of one batch (all its images); 0: one image of the config's maximum
  int64_t gemm_rows = 2048;  // rows of one tensor-core GEMM chunk (sizes the split buffers)
};

class GpuVisionTower {
 public:
  // FailedPrecondition when the model has no vision weights.
  static Result<std::unique_ptr<GpuVisionTower>> create(const DeviceModel& m, const GpuVisionLimits& lim,
                                                        cudaStream_t stream);

  // As model::VisionTower::encode: the same input checks and messages, the same outputs
  // (vit_out only with keep_vit_out).
  Result<std::vector<model::VisionImageOutput>> encode(std::span<const model::VisionImageInput> images,
                                                       bool keep_vit_out = false);

  // Host copies of the span delimiters (image_start / image_end / image_newline).
  const model::ImageSpanMarkers& markers() const { return markers_; }
  int64_t max_patches() const { return R_; }
  size_t workspace_bytes() const { return ws_.size(); }

 private:
  GpuVisionTower() = default;
  // One batch (every image fits the workspace together): fills out[0 .. images.size()).
  Status run_batch(std::span<const model::VisionImageInput> images, bool keep, model::VisionImageOutput* out);
  Status block(const DeviceVisionBlock& bw, int64_t n, int64_t n_segs, int64_t max_seg);
  // The aligner over the batch's final ViT rows in x_ (gpu_vision_aligner.cpp).
  Status align(std::span<const model::VisionImageInput> images, const std::vector<int64_t>& segs,
               model::VisionImageOutput* out);
  Status linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y);

  const DeviceModel* m_ = nullptr;
  const model::ModelConfig* c_ = nullptr;
  const DeviceVisionWeights* w_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<TensorCoreLinear> tc_;
  int64_t R_ = 0;  // patches per batch
  int64_t M_ = 0;  // aligner windows per batch (ceil(R / k) bounds any set of grids of R patches)
  // Workspace (one allocation).
  DeviceBuffer ws_;
  float *patches_ = nullptr, *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *o_ = nullptr, *y_ = nullptr;
  float *g_ = nullptr, *u_ = nullptr, *win_ = nullptr, *a1_ = nullptr, *a2_ = nullptr, *inv_freq_ = nullptr;
  int32_t *rows_ = nullptr, *cols_ = nullptr;
  int64_t* segs_ = nullptr;  // [R + 1]
  std::vector<float> start_, end_, newline_;
  model::ImageSpanMarkers markers_;
};

}  // namespace ds41::gpu
