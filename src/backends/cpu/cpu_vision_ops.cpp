// ds41 backends/cpu: the reference of the vision ops (MODEL_SPEC 3.11; signatures in
// src/ops/backend.h): bias and residual adds, exact GELU, split-half 2D RoPE, full attention
// within an image, and the aligner's zero-padded 3x3 unshuffle.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"

namespace ds41::backends::cpu {

void CpuBackend::add_bias(float* y, int64_t n, int64_t dim, const float* bias) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += bias[i];
}

void CpuBackend::add_inplace(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void CpuBackend::gelu_erf(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const double v = x[i];
    x[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
  }
}

void CpuBackend::rope_2d(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row,
                         const int32_t* col, const float* inv_freq) {
  const int64_t half = head_dim / 2, q = head_dim / 4;
  std::vector<float> cs(half), sn(half);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < half; ++j) {
      const float p = static_cast<float>(j < q ? row[r] : col[r]);
      const float ang = p * inv_freq[j % q];  // float32 product, as the reference's outer product
      cs[j] = static_cast<float>(std::cos(static_cast<double>(ang)));
      sn[j] = static_cast<float>(std::sin(static_cast<double>(ang)));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const float x1 = v[j], x2 = v[j + half];
        v[j] = x1 * cs[j] - x2 * sn[j];
        v[j + half] = x2 * cs[j] + x1 * sn[j];
      }
    }
  }
}

void CpuBackend::dense_attention(const ops::DenseAttentionArgs& a) {
  const int64_t H = a.n_heads, D = a.head_dim;
  std::vector<int64_t> seg_of(a.n);
  for (int64_t s = 0; s < a.n_segs; ++s)
    for (int64_t r = a.seg_offsets[s]; r < a.seg_offsets[s + 1]; ++r) seg_of[r] = s;
  for_rows(a.n * H, 4, [&](int64_t b, int64_t e) {
    std::vector<double> sc, acc(D);
    for (int64_t rh = b; rh < e; ++rh) {
      const int64_t r = rh / H, h = rh % H;
      const int64_t k0 = a.seg_offsets[seg_of[r]], k1 = a.seg_offsets[seg_of[r] + 1];
      const float* q = a.q + rh * D;
      sc.resize(k1 - k0);
      double mx = -INFINITY;
      for (int64_t j = k0; j < k1; ++j) {
        sc[j - k0] = static_cast<double>(static_cast<float>(dot_f32(q, a.k + (j * H + h) * D, D)) * a.scale);
        mx = std::max(mx, sc[j - k0]);
      }
      double den = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = k0; j < k1; ++j) {
        const double p = std::exp(sc[j - k0] - mx);
        den += p;
        const float* v = a.v + (j * H + h) * D;
        for (int64_t i = 0; i < D; ++i) acc[i] += p * v[i];
      }
      float* o = a.out + rh * D;
      for (int64_t i = 0; i < D; ++i) o[i] = den > 0 ? static_cast<float>(acc[i] / den) : 0.0f;
    }
  });
}

void CpuBackend::space_to_depth(const float* x, int64_t gh, int64_t gw, int64_t c, int64_t k, float* out) {
  const int64_t oh = (gh + k - 1) / k, ow = (gw + k - 1) / k, dim = c * k * k;
  for (int64_t i = 0; i < oh; ++i)
    for (int64_t j = 0; j < ow; ++j) {
      float* o = out + (i * ow + j) * dim;
      for (int64_t dy = 0; dy < k; ++dy)
        for (int64_t dx = 0; dx < k; ++dx) {
          const int64_t y = i * k + dy, xx = j * k + dx;
          const bool inside = y < gh && xx < gw;
          const float* src = inside ? x + (y * gw + xx) * c : nullptr;
          for (int64_t ch = 0; ch < c; ++ch) o[(ch * k + dy) * k + dx] = inside ? src[ch] : 0.0f;
        }
    }
}

}  // namespace ds41::backends::cpu
