// ds41 gpu: GpuVisionTower batches, patch embedding, the ViT blocks and the final norm (MODEL_SPEC
// 3.11) — the device twin of src/model/vision_tower.cpp, op for op; the aligner is in
// gpu_vision_aligner.cpp. One difference of layout, not of math: q, k and v come from ONE GEMM with
// the checkpoint's fused attn.wqkv (rows q | k | v) into [n, 3 D] rows, RoPE rotates q and k in
// place there, and attention reads them with a row stride (the reference runs three row slices).
#include "gpu/gpu_vision_tower.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/dense_attention_kernels.h"
#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/rope_2d_kernels.h"
#include "backends/cuda/vision_pointwise_kernels.h"

namespace ds41::gpu {
namespace {

constexpr size_t kTowerAlign = 256;

// Rows [first, first + rows) of a BF16 [out, in] weight as its own linear (as model's row_slice).
cuda::DeviceWeight row_slice(const cuda::DeviceWeight& w, int64_t first, int64_t rows) {
  cuda::DeviceWeight s = w;
  s.data = w.data + first * w.in_dim * 2;
  s.out_dim = rows;
  return s;
}

}  // namespace

Result<std::unique_ptr<GpuVisionTower>> GpuVisionTower::create(const DeviceModel& m,
                                                               const GpuVisionLimits& lim,
                                                               cudaStream_t stream) {
  const model::ModelConfig& c = m.config();
  if (!c.has_vision || !m.weights().vision)
    return failed_precondition("this model has no vision tower (no vision_config in config.json)");
  const int64_t D = c.vision_hidden_size, heads = c.vision_num_heads, I = c.vision_intermediate_size;
  const int64_t H = c.hidden_size, k = c.vision_downsample_ratio,
                P = 3 * c.vision_patch_size * c.vision_patch_size;
  if (heads <= 0 || D % heads != 0 || (D / heads) % 4 != 0 || D / heads > 128)
    return unimplemented("GPU vision tower: hidden " + std::to_string(D) + " over " + std::to_string(heads) +
                         " heads (the attention and RoPE kernels take a head width that is a multiple of 4, "
                         "at most 128)");
  if (lim.gemm_rows < 1) return invalid_argument("GPU vision tower: gemm_rows must be >= 1");
  std::unique_ptr<GpuVisionTower> t(new GpuVisionTower());
  t->m_ = &m;
  t->c_ = &c;
  t->w_ = &*m.weights().vision;
  t->stream_ = stream;
  t->R_ = lim.max_patches > 0 ? lim.max_patches : model::vision_max_patches_per_image(c);
  t->M_ = (t->R_ + k - 1) / k;
  const int64_t R = t->R_, M = t->M_;
  TensorCoreLimits tl;
  tl.min_rows = 1;  // every tower linear on the tensor cores
  tl.max_rows = std::min(lim.gemm_rows, R);
  tl.max_in = std::max({P, D, I, D * k * k, H});
  tl.max_out = std::max({3 * D, I, H});
  tl.decode_weights = false;  // BF16 weights only (MODEL_SPEC 2.5)
  tl.weight_scratch_bytes = 0;
  DS41_ASSIGN_OR_RETURN(t->tc_, TensorCoreLinear::create(tl, stream));
  // The workspace: two passes, sizes then pointers.
  auto carve = [&](uint8_t* base) {
    size_t off = 0;
    auto take = [&](auto*& p, int64_t count) {
      off = (off + kTowerAlign - 1) / kTowerAlign * kTowerAlign;
      p = base ? reinterpret_cast<std::remove_reference_t<decltype(p)>>(base + off) : nullptr;
      off += static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(*p);
    };
    take(t->patches_, R * P);
    for (float** p : {&t->x_, &t->h_, &t->o_, &t->y_}) take(*p, R * D);
    take(t->qkv_, R * 3 * D);
    take(t->g_, R * I);
    take(t->u_, R * I);
    take(t->win_, M * D * k * k);
    take(t->a1_, M * H);
    take(t->a2_, M * H);
    take(t->inv_freq_, std::max<int64_t>(D / heads / 4, 1));
    take(t->rows_, R);
    take(t->cols_, R);
    take(t->segs_, R + 1);
    return off;
  };
  DS41_ASSIGN_OR_RETURN(t->ws_, DeviceBuffer::allocate(carve(nullptr), "GPU vision tower workspace (" +
                                                                           std::to_string(R) + " patches)"));
  carve(t->ws_.as<uint8_t>());
  const std::vector<float> inv = model::vision_rope_inv_freq(c);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpy(t->inv_freq_, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice),
      "upload of the vision RoPE frequencies"));
  // Host copies of the span delimiters (the span rows are assembled on the host, vision_span.h).
  const DeviceVisionWeights& w = *t->w_;
  for (auto [dst, src] : {std::pair{&t->start_, &w.image_start}, std::pair{&t->end_, &w.image_end},
                          std::pair{&t->newline_, &w.image_newline}}) {
    dst->resize(static_cast<size_t>(src->size));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpy(dst->data(), src->ptr, dst->size() * sizeof(float), cudaMemcpyDeviceToHost),
        "download of the image markers"));
  }
  t->markers_ = model::ImageSpanMarkers{t->start_, t->end_, t->newline_};
  return t;
}

Status GpuVisionTower::linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y) {
  if (tc_->accepts(w, n)) return tc_->linear(w, x, n, y);
  return cuda::run_linear(w, x, n, y, stream_);
}

Result<std::vector<model::VisionImageOutput>> GpuVisionTower::encode(
    std::span<const model::VisionImageInput> images, bool keep_vit_out) {
  std::vector<model::VisionImageOutput> out(images.size());
  if (images.empty()) return out;
  DS41_RETURN_IF_ERROR(model::validate_vision_images(*c_, images));
  const int64_t k = c_->vision_downsample_ratio;
  // Batches of whole images that fit the workspace (patches, aligner windows, <= 65535 images).
  for (size_t b = 0; b < images.size();) {
    size_t e = b;
    int64_t np = 0, nw = 0;
    for (; e < images.size() && e - b < 65535; ++e) {
      const model::VisionImageInput& im = images[e];
      const int64_t p = im.grid_h * im.grid_w, w = ((im.grid_h + k - 1) / k) * ((im.grid_w + k - 1) / k);
      if (np + p > R_ || nw + w > M_) break;
      np += p;
      nw += w;
    }
    if (e == b)
      return invalid_argument("image " + std::to_string(b) + ": " +
                              std::to_string(images[b].grid_h * images[b].grid_w) +
                              " patches exceed the GPU vision tower's batch of " + std::to_string(R_) +
                              " (GpuVisionLimits::max_patches)");
    DS41_RETURN_IF_ERROR(
        run_batch(images.subspan(b, e - b), keep_vit_out, out.data() + b).with_context("GPU vision tower"));
    b = e;
  }
  return out;
}

Status GpuVisionTower::run_batch(std::span<const model::VisionImageInput> images, bool keep,
                                 model::VisionImageOutput* out) {
  const int64_t D = c_->vision_hidden_size, P = 3 * c_->vision_patch_size * c_->vision_patch_size;
  const std::vector<int64_t> segs = model::vision_patch_offsets(images);
  const int64_t n = segs.back();
  int64_t max_seg = 0;
  for (size_t i = 0; i + 1 < segs.size(); ++i) max_seg = std::max(max_seg, segs[i + 1] - segs[i]);
  std::vector<float> patches(static_cast<size_t>(n * P));
  for (size_t i = 0; i < images.size(); ++i)
    std::copy(images[i].patches, images[i].patches + (segs[i + 1] - segs[i]) * P,
              patches.begin() + segs[i] * P);
  std::vector<int32_t> rows, cols;
  model::vision_patch_coords(images, &rows, &cols);
  // Pageable host sources: each copy returns once its bytes are staged (CUDA's pageable semantics).
  auto up = [&](void* dst, const void* src, size_t bytes) {
    return cuda::cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                             "upload of the vision batch");
  };
  DS41_RETURN_IF_ERROR(up(patches_, patches.data(), patches.size() * sizeof(float)));
  DS41_RETURN_IF_ERROR(up(rows_, rows.data(), rows.size() * sizeof(int32_t)));
  DS41_RETURN_IF_ERROR(up(cols_, cols.data(), cols.size() * sizeof(int32_t)));
  DS41_RETURN_IF_ERROR(up(segs_, segs.data(), segs.size() * sizeof(int64_t)));
  const DeviceVisionWeights& w = *w_;
  // MODEL_SPEC 3.11: patch embedding (+bias), the blocks, the final RMSNorm.
  DS41_RETURN_IF_ERROR(linear(w.patch_embed, patches_, n, x_));
  DS41_RETURN_IF_ERROR(cuda::run_add_bias(x_, n, D, w.patch_bias.ptr, stream_));
  const int64_t n_segs = static_cast<int64_t>(images.size());
  for (size_t l = 0; l < w.blocks.size(); ++l)
    DS41_RETURN_IF_ERROR(block(w.blocks[l], n, n_segs, max_seg).with_context("block " + std::to_string(l)));
  DS41_RETURN_IF_ERROR(cuda::run_rms_norm(x_, n, D, w.norm.ptr, model::kVisionNormEps, x_, stream_));
  for (size_t i = 0; i < images.size(); ++i) {
    out[i].grid_h = images[i].grid_h;
    out[i].grid_w = images[i].grid_w;
    if (!keep) continue;
    out[i].vit_out.resize(static_cast<size_t>((segs[i + 1] - segs[i]) * D));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(out[i].vit_out.data(), x_ + segs[i] * D, out[i].vit_out.size() * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "download of vit_out"));
  }
  DS41_RETURN_IF_ERROR(align(images, segs, out));
  return cuda::cuda_status(cudaStreamSynchronize(stream_), "vision tower");
}

Status GpuVisionTower::block(const DeviceVisionBlock& bw, int64_t n, int64_t n_segs, int64_t max_seg) {
  const int64_t D = c_->vision_hidden_size, I = c_->vision_intermediate_size, heads = c_->vision_num_heads;
  const int64_t hd = D / heads;
  cudaStream_t s = stream_;
  // Attention half: RMSNorm -> qkv (+bias) -> 2D RoPE on q, k -> full attention -> wo (+bias).
  DS41_RETURN_IF_ERROR(cuda::run_rms_norm(x_, n, D, bw.norm1.ptr, model::kVisionNormEps, h_, s));
  DS41_RETURN_IF_ERROR(linear(bw.wqkv, h_, n, qkv_));
  DS41_RETURN_IF_ERROR(cuda::run_add_bias(qkv_, n, 3 * D, bw.bqkv.ptr, s));
  // q and k are the first 2 * heads head vectors of each [q | k | v] row.
  DS41_RETURN_IF_ERROR(cuda::run_rope_2d(qkv_, n, 2 * heads, hd, 3 * D, rows_, cols_, inv_freq_, s));
  cuda::DenseAttentionDeviceArgs a;
  a.n = n;
  a.n_heads = heads;
  a.head_dim = hd;
  a.q = qkv_;
  a.k = qkv_ + D;
  a.v = qkv_ + 2 * D;
  a.ld_in = 3 * D;
  a.seg_offsets = segs_;
  a.n_segs = n_segs;
  a.max_seg_rows = max_seg;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  a.out = o_;
  DS41_RETURN_IF_ERROR(cuda::run_dense_attention(a, s));
  DS41_RETURN_IF_ERROR(linear(bw.wo, o_, n, y_));
  DS41_RETURN_IF_ERROR(cuda::run_add_bias(y_, n, D, bw.bo.ptr, s));
  DS41_RETURN_IF_ERROR(cuda::run_add_inplace(x_, y_, n * D, s));
  // MLP half: RMSNorm -> silu(gate) * up (no clamp) -> w2.
  DS41_RETURN_IF_ERROR(cuda::run_rms_norm(x_, n, D, bw.norm2.ptr, model::kVisionNormEps, h_, s));
  DS41_RETURN_IF_ERROR(linear(row_slice(bw.w1, 0, I), h_, n, g_));
  DS41_RETURN_IF_ERROR(linear(row_slice(bw.w1, I, I), h_, n, u_));
  DS41_RETURN_IF_ERROR(
      cuda::run_swiglu(g_, u_, n, I, std::numeric_limits<float>::infinity(), nullptr, g_, s));
  DS41_RETURN_IF_ERROR(linear(bw.w2, g_, n, y_));
  return cuda::run_add_inplace(x_, y_, n * D, s);
}

}  // namespace ds41::gpu
