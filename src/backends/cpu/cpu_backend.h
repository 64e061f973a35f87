// ds41 backends/cpu: CpuBackend — the reference implementation of the op catalogue
// (src/ops/backend.h). Plain loops, obvious over fast: float32 values, float32 lane sums reduced
// in float64 for dot products, float64 for norms and softmax denominators. Work is split over
// rows (or output features) with the ThreadPool it is given; the backend never creates threads.
//
// Weights: with cache_dequantized (default) each weight is dequantized once, on first use, into
// a float32 copy owned by the backend (the tiny/small presets); without it rows are dequantized
// on the fly in blocks (quantized-resident path, slower, no extra memory).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/thread_pool.h"
#include "ops/backend.h"
#include "quant/act_quant.h"

namespace ds41::backends::cpu {

struct CpuBackendOptions {
  bool cache_dequantized = true;
  // The activation numerics of the FP8 / FP4 linears (quant/act_quant.h): kExact keeps x in float32
  // (the goldens' numerics), kFp8Block32 quantizes x per 32 along K to E4M3 first (the official path).
  quant::ActNumerics act = quant::ActNumerics::kExact;
};

class CpuBackend final : public ops::Backend {
 public:
  // pool may be null (single-threaded); it must outlive the backend.
  explicit CpuBackend(ThreadPool* pool, CpuBackendOptions opt = {});
  ~CpuBackend() override;

  const char* name() const override { return "cpu-reference"; }
  // Bytes held by the dequantized-weight cache.
  int64_t cached_weight_bytes() const;

  void prepare(const ops::WeightRef& w) override;
  void linear(const ops::WeightRef& w, const float* x, int64_t n, float* y) override;
  void grouped_linear(const ops::WeightRef& w, int64_t groups, const float* x, int64_t n, float* y) override;
  void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) override;
  void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int64_t* pos, const float* inv_freq,
            int64_t n_freq, bool inverse) override;
  void embed_bf16(const uint8_t* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                  float* out) override;
  void engram_gather(const uint8_t* table, const uint8_t* scale, int64_t dim, const int64_t* row_ids,
                     int64_t n, int64_t cols, float* out) override;
  void engram_update(float* streams, const float* keys, const float* value, const float* omega,
                     const uint8_t* dead, int64_t n, int64_t c, int64_t h, float eps, float* gates) override;
  void hc_map(const ops::HcMapArgs& a) override;
  void hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                   float* out) override;
  void hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n, int64_t c,
                 int64_t h) override;
  void attention(const ops::AttentionArgs& a) override;
  void indexer_scores(const ops::IndexerArgs& a) override;
  void topk_rows(const float* scores, int64_t n, int64_t t, int64_t k, int32_t* out) override;
  void candidate_pool(const float* scores, const int64_t* visible, int64_t n, int64_t t, int64_t block,
                      int64_t keep_blocks, uint8_t* mask) override;
  void softmax_pool(const float* a, const float* b, int64_t r, int64_t dim, float* out) override;
  void router(const float* logits, int64_t n, int64_t n_experts, const float* bias, const float* bias_vl,
              const uint8_t* vl, int64_t k, float temp, float route_scale, int32_t* experts,
              float* weights) override;
  void swiglu(const float* g, const float* u, int64_t n, int64_t dim, float limit, const float* row_scale,
              float* out) override;
  void scatter_add_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) override;
  // Vision ops (cpu_vision_ops.cpp).
  void add_bias(float* y, int64_t n, int64_t dim, const float* bias) override;
  void add_inplace(float* y, const float* x, int64_t count) override;
  void gelu_erf(float* x, int64_t count) override;
  void rope_2d(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row, const int32_t* col,
               const float* inv_freq) override;
  void dense_attention(const ops::DenseAttentionArgs& a) override;
  void space_to_depth(const float* x, int64_t grid_h, int64_t grid_w, int64_t c, int64_t k,
                      float* out) override;

 private:
  // Float32 copy of w (cached mode), created on first use.
  const float* dequantized(const ops::WeightRef& w);
  // Rows [b, e) of w into out (any mode).
  static void dequant_rows(const ops::WeightRef& w, int64_t b, int64_t e, float* out);
  void for_rows(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

  ThreadPool* pool_;
  CpuBackendOptions opt_;
  mutable std::mutex cache_mu_;  // guards cache_
  std::unordered_map<const uint8_t*, std::unique_ptr<std::vector<float>>> cache_;
};

// Dot product of two float vectors: 8 float32 lane sums, reduced in float64 (a fixed order,
// so results do not depend on threading).
double dot_f32(const float* a, const float* b, int64_t n);

}  // namespace ds41::backends::cpu
