// ds41 backends/cpu: reference implementation of every op (see cpu_backend.h).
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"
#include "quant/weight_format.h"
#include "quant/weight_formats.h"

namespace ds41::backends::cpu {

using ops::WeightFormat;
using ops::WeightRef;

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float sigmoidf(float x) { return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x)))); }
inline float siluf(float x) { return static_cast<float>(x / (1.0 + std::exp(-static_cast<double>(x)))); }
inline float softplusf(float x) {
  double d = x;
  return static_cast<float>(std::max(d, 0.0) + std::log1p(std::exp(-std::fabs(d))));
}
}  // namespace

double dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  double s = 0;
  for (int l = 0; l < 8; ++l) s += acc[l];
  for (; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Four dot products against one weight row; each result equals dot_f32(x_j, w, n) bit for bit
// (same lanes, same reduction order) — the weight row is just loaded once for four tokens.
static void dot_f32_x4(const float* x0, const float* x1, const float* x2, const float* x3, const float* w,
                       int64_t n, double* out) {
  float a0[8] = {}, a1[8] = {}, a2[8] = {}, a3[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) {
      const float wv = w[i + l];
      a0[l] += x0[i + l] * wv;
      a1[l] += x1[i + l] * wv;
      a2[l] += x2[i + l] * wv;
      a3[l] += x3[i + l] * wv;
    }
  double s[4] = {0, 0, 0, 0};
  for (int l = 0; l < 8; ++l) {
    s[0] += a0[l];
    s[1] += a1[l];
    s[2] += a2[l];
    s[3] += a3[l];
  }
  for (; i < n; ++i) {
    s[0] += static_cast<double>(x0[i]) * w[i];
    s[1] += static_cast<double>(x1[i]) * w[i];
    s[2] += static_cast<double>(x2[i]) * w[i];
    s[3] += static_cast<double>(x3[i]) * w[i];
  }
  for (int j = 0; j < 4; ++j) out[j] = s[j];
}

// y[t, o] for t < n and o in [ob, oe) with rows of W at wf (row o at wf + (o - w0) * in).
static void linear_rows(const float* wf, int64_t w0, int64_t ob, int64_t oe, const float* x, int64_t n,
                        int64_t in, int64_t out, float* y) {
  double r4[4];
  for (int64_t o = ob; o < oe; ++o) {
    const float* wr = wf + (o - w0) * in;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
      dot_f32_x4(x + t * in, x + (t + 1) * in, x + (t + 2) * in, x + (t + 3) * in, wr, in, r4);
      for (int j = 0; j < 4; ++j) y[(t + j) * out + o] = static_cast<float>(r4[j]);
    }
    for (; t < n; ++t) y[t * out + o] = static_cast<float>(dot_f32(x + t * in, wr, in));
  }
}

CpuBackend::CpuBackend(ThreadPool* pool, CpuBackendOptions opt) : pool_(pool), opt_(opt) {}
CpuBackend::~CpuBackend() = default;

int64_t CpuBackend::cached_weight_bytes() const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  int64_t b = 0;
  for (auto& [k, v] : cache_) b += static_cast<int64_t>(v->size() * sizeof(float));
  return b;
}

void CpuBackend::for_rows(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (!pool_ || pool_->size() <= 1 || n < 2 * min_chunk) {
    fn(0, n);
    return;
  }
  // Split into ~4 chunks per thread for balance, each at least min_chunk rows.
  int64_t parts = std::min<int64_t>(n / min_chunk, 4 * pool_->size());
  pool_->parallel_for(parts, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) fn(n * p / parts, n * (p + 1) / parts);
  });
}

void CpuBackend::dequant_rows(const WeightRef& w, int64_t b, int64_t e, float* out) {
  // The host reference dequantizer of the format (quant/weight_format.h traits table).
  const quant::WeightFormatTraits& t = quant::weight_format_traits(w.format);
  DS41_CHECK(t.dequant_rows != nullptr, "dequant_rows on an absent weight '%s'", w.name);
  t.dequant_rows(w.data, w.scale, w.out_dim, w.in_dim, b, e, out);
}

const float* CpuBackend::dequantized(const WeightRef& w) {
  if (w.format == WeightFormat::kF32) return reinterpret_cast<const float*>(w.data);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(w.data);
    if (it != cache_.end()) return it->second->data();
  }
  auto buf = std::make_unique<std::vector<float>>(static_cast<size_t>(w.out_dim * w.in_dim));
  dequant_rows(w, 0, w.out_dim, buf->data());
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto [it, inserted] = cache_.emplace(w.data, std::move(buf));
  return it->second->data();
}

void CpuBackend::prepare(const WeightRef& w) {
  if (w.present() && opt_.cache_dequantized) dequantized(w);
}

void CpuBackend::linear(const WeightRef& w, const float* x, int64_t n, float* y) {
  DS41_CHECK(w.present(), "linear on an absent weight '%s'", w.name);
  const int64_t in = w.in_dim, out = w.out_dim;
  if (n == 0) return;
  std::vector<float> xq;  // the official path's quantized activations (MODEL_SPEC 3.0, Q3)
  if (quant::act_quant_applies(opt_.act, w.format)) {
    xq.resize(static_cast<size_t>(n * in));
    quant::act_quant_fp8_rows(x, n, in, xq.data());
    x = xq.data();
  }
  if (opt_.cache_dequantized || w.format == WeightFormat::kF32) {
    const float* wf = dequantized(w);
    for_rows(out, 16, [&](int64_t ob, int64_t oe) { linear_rows(wf, 0, ob, oe, x, n, in, out, y); });
    return;
  }
  // Quantized-resident: dequantize 32 output rows at a time into a local buffer.
  const int64_t blocks = (out + 31) / 32;
  for_rows(blocks, 1, [&](int64_t bb, int64_t be) {
    std::vector<float> tmp(32 * in);
    for (int64_t blk = bb; blk < be; ++blk) {
      int64_t r0 = blk * 32, r1 = std::min(out, r0 + 32);
      dequant_rows(w, r0, r1, tmp.data());
      linear_rows(tmp.data(), r0, r0, r1, x, n, in, out, y);
    }
  });
}

void CpuBackend::grouped_linear(const WeightRef& w, int64_t groups, const float* x, int64_t n, float* y) {
  DS41_CHECK(w.present(), "grouped_linear on an absent weight '%s'", w.name);
  DS41_CHECK_GT(groups, 0, "grouped_linear '%s'", w.name);
  DS41_CHECK_EQ(w.out_dim % groups, 0, "grouped_linear '%s': out_dim %lld not divisible by %lld groups",
                w.name, static_cast<long long>(w.out_dim), static_cast<long long>(groups));
  const int64_t in_g = w.in_dim, out_g = w.out_dim / groups, out = w.out_dim;
  std::vector<float> xq;  // each group's K = in_g is quantized on its own (one GEMM per group)
  if (quant::act_quant_applies(opt_.act, w.format) && n > 0) {
    xq.resize(static_cast<size_t>(n * groups * in_g));
    quant::act_quant_fp8_rows(x, n * groups, in_g, xq.data());
    x = xq.data();
  }
  const float* wf = dequantized(w);  // always cached: the reference path (small)
  for_rows(out, 16, [&](int64_t ob, int64_t oe) {
    for (int64_t o = ob; o < oe; ++o) {
      const int64_t g = o / out_g;
      for (int64_t t = 0; t < n; ++t)
        y[t * out + o] = static_cast<float>(dot_f32(x + t * groups * in_g + g * in_g, wf + o * in_g, in_g));
    }
  });
}

void CpuBackend::rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float mean = static_cast<float>(ss / dim);
    const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(mean + eps)));
    float* yr = y + r * dim;
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * (weight ? weight[i] : 1.0f);
  }
}

void CpuBackend::rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int64_t* pos,
                      const float* inv_freq, int64_t n_freq, bool inverse) {
  const int64_t off = head_dim - 2 * n_freq;
  std::vector<float> cs(2 * n_freq);
  for (int64_t r = 0; r < n; ++r) {
    const float p = static_cast<float>(pos[r]);
    for (int64_t i = 0; i < n_freq; ++i) {
      const float ang = p * inv_freq[i];  // float32 product, as the spec's reference computes it
      cs[2 * i] = static_cast<float>(std::cos(static_cast<double>(ang)));
      float s = static_cast<float>(std::sin(static_cast<double>(ang)));
      cs[2 * i + 1] = inverse ? -s : s;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim + off;
      for (int64_t i = 0; i < n_freq; ++i) {
        const float e = v[2 * i], o = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        v[2 * i] = e * c - o * s;
        v[2 * i + 1] = e * s + o * c;
      }
    }
  }
}

void CpuBackend::embed_bf16(const uint8_t* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                            float* out) {
  const uint16_t* t = reinterpret_cast<const uint16_t*>(table);
  for (int64_t r = 0; r < n; ++r) {
    DS41_CHECK(ids[r] >= 0 && ids[r] < rows, "embedding id %d at row %lld outside [0, %lld)", ids[r],
               static_cast<long long>(r), static_cast<long long>(rows));
    const uint16_t* src = t + static_cast<int64_t>(ids[r]) * dim;
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = bf16_to_f32(src[i]);
  }
}

void CpuBackend::engram_gather(const uint8_t* table, const uint8_t* scale, int64_t dim,
                               const int64_t* row_ids, int64_t n, int64_t cols, float* out) {
  const int64_t nb = dim / quant::kEngramBlock;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t id = row_ids[r * cols + c];
      quant::engram_row_dequant(table + id * dim, scale + id * nb, dim, out + (r * cols + c) * dim);
    }
}

void CpuBackend::engram_update(float* streams, const float* keys, const float* value, const float* omega,
                               const uint8_t* dead, int64_t n, int64_t c, int64_t h, float eps,
                               float* gates) {
  const double inv_sqrt_h = 1.0 / std::sqrt(static_cast<double>(h));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t s = 0; s < c; ++s) {
      float* S = streams + (r * c + s) * h;
      const float* k = keys + (r * c + s) * h;
      const float* om = omega + s * h;
      float g = 0.0f;
      if (!(dead && dead[r])) {
        double ss = 0, kk = 0, d = 0;
        for (int64_t i = 0; i < h; ++i) {
          ss += static_cast<double>(S[i]) * S[i];
          kk += static_cast<double>(k[i]) * k[i];
          d += static_cast<double>(S[i] * om[i]) * k[i];
        }
        const double rstd = 1.0 / std::sqrt(ss / h + eps) / std::sqrt(kk / h + eps);
        const double a = d * rstd * inv_sqrt_h;
        const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
        g = static_cast<float>(1.0 / (1.0 + std::exp(-sg * std::sqrt(std::max(std::fabs(a), 1e-6)))));
        const float* v = value + r * h;
        for (int64_t i = 0; i < h; ++i) S[i] += g * v[i];
      }
      if (gates) gates[r * c + s] = g;
    }
  }
}

void CpuBackend::hc_map(const ops::HcMapArgs& a) {
  const int64_t C = a.c, F = a.c * a.h, M = (2 + C) * C;
  for_rows(a.n, 4, [&](int64_t rb, int64_t re) {
    std::vector<float> flat(F), m(M), L(C * C);
    for (int64_t r = rb; r < re; ++r) {
      const float* f = a.streams + r * F;
      double ss = 0;
      for (int64_t i = 0; i < F; ++i) ss += static_cast<double>(f[i]) * f[i];
      const float inv =
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(static_cast<float>(ss / F) + a.norm_eps)));
      for (int64_t i = 0; i < F; ++i) flat[i] = f[i] * inv;
      for (int64_t j = 0; j < M; ++j) m[j] = static_cast<float>(dot_f32(flat.data(), a.fn + j * F, F));
      float* pre = a.pre + r * C;
      float* post = a.post + r * C;
      float* comb = a.comb + r * C * C;
      for (int64_t c = 0; c < C; ++c) {
        pre[c] = sigmoidf(m[c] * a.scale[0] + a.base[c]) + a.hc_eps;
        post[c] = 2.0f * sigmoidf(m[C + c] * a.scale[1] + a.base[C + c]);
      }
      for (int64_t j = 0; j < C * C; ++j) L[j] = m[2 * C + j] * a.scale[2] + a.base[2 * C + j];
      for (int64_t j = 0; j < C; ++j) {  // row-wise softmax (over k) + eps
        float mx = L[j * C];
        for (int64_t k = 1; k < C; ++k) mx = std::max(mx, L[j * C + k]);
        double s = 0;
        for (int64_t k = 0; k < C; ++k) s += std::exp(static_cast<double>(L[j * C + k] - mx));
        for (int64_t k = 0; k < C; ++k)
          comb[j * C + k] =
              static_cast<float>(std::exp(static_cast<double>(L[j * C + k] - mx)) / s) + a.hc_eps;
      }
      auto col_norm = [&] {
        for (int64_t k = 0; k < C; ++k) {
          float s = 0;
          for (int64_t j = 0; j < C; ++j) s += comb[j * C + k];
          for (int64_t j = 0; j < C; ++j) comb[j * C + k] /= (s + a.hc_eps);
        }
      };
      auto row_norm = [&] {
        for (int64_t j = 0; j < C; ++j) {
          float s = 0;
          for (int64_t k = 0; k < C; ++k) s += comb[j * C + k];
          for (int64_t k = 0; k < C; ++k) comb[j * C + k] /= (s + a.hc_eps);
        }
      };
      col_norm();
      for (int64_t it = 0; it + 1 < a.sinkhorn_iters; ++it) {
        row_norm();
        col_norm();
      }
    }
  });
}

void CpuBackend::hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                             float* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < h; ++i) {
      float s = 0;
      for (int64_t j = 0; j < c; ++j) s += weights[r * c + j] * streams[(r * c + j) * h + i];
      out[r * h + i] = s;
    }
}

void CpuBackend::hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n,
                           int64_t c, int64_t h) {
  std::vector<float> old(c * h);
  for (int64_t r = 0; r < n; ++r) {
    float* S = streams + r * c * h;
    std::memcpy(old.data(), S, c * h * sizeof(float));
    const float* cb = comb + r * c * c;
    for (int64_t k = 0; k < c; ++k)
      for (int64_t i = 0; i < h; ++i) {
        float s = post[r * c + k] * y[r * h + i];
        for (int64_t j = 0; j < c; ++j) s += cb[j * c + k] * old[j * h + i];
        S[k * h + i] = s;
      }
  }
}

void CpuBackend::attention(const ops::AttentionArgs& a) {
  const int64_t H = a.n_heads, D = a.head_dim;
  for_rows(a.n * H, 4, [&](int64_t b, int64_t e) {
    std::vector<double> s, acc(D);
    for (int64_t rh = b; rh < e; ++rh) {
      const int64_t r = rh / H, h = rh % H;
      const float* q = a.q + rh * D;
      float* o = a.out + rh * D;
      const int64_t k0 = a.kv_offsets[r], k1 = a.kv_offsets[r + 1];
      if (k1 <= k0) {
        std::fill(o, o + D, 0.0f);
        continue;
      }
      s.resize(k1 - k0);
      double mx = a.sink[h];
      for (int64_t j = k0; j < k1; ++j) {
        s[j - k0] = static_cast<float>(dot_f32(q, a.kv[j], D)) * a.scale;
        mx = std::max(mx, s[j - k0]);
      }
      double den = std::exp(static_cast<double>(a.sink[h]) - mx);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = k0; j < k1; ++j) {
        const double p = std::exp(s[j - k0] - mx);
        den += p;
        const float* v = a.kv[j];
        for (int64_t i = 0; i < D; ++i) acc[i] += p * v[i];
      }
      for (int64_t i = 0; i < D; ++i) o[i] = static_cast<float>(acc[i] / den);
    }
  });
}

void CpuBackend::indexer_scores(const ops::IndexerArgs& a) {
  const int64_t H = a.n_heads, D = a.head_dim, T = a.n_keys;
  for_rows(a.n, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t vis = std::min(a.visible[r], T);
      float* out = a.out + r * T;
      for (int64_t t = 0; t < vis; ++t) {
        double sc = 0;
        for (int64_t h = 0; h < H; ++h) {
          float d = static_cast<float>(dot_f32(a.q + (r * H + h) * D, a.keys + t * D, D));
          d = std::max(d, 0.0f) * a.scale;
          sc += static_cast<double>(d) * a.w[r * H + h];
        }
        out[t] = static_cast<float>(sc);
      }
      for (int64_t t = vis; t < T; ++t) out[t] = kNegInf;
    }
  });
}

namespace {
// Indices of the k best finite-or-+inf scores in tie order (score desc, index asc).
void best_k(const float* sc, int64_t t, int64_t k, std::vector<int32_t>& idx) {
  idx.clear();
  for (int64_t i = 0; i < t; ++i)
    if (!(std::isinf(sc[i]) && sc[i] < 0)) idx.push_back(static_cast<int32_t>(i));
  auto better = [&](int32_t x, int32_t y) { return sc[x] > sc[y] || (sc[x] == sc[y] && x < y); };
  const int64_t take = std::min<int64_t>(k, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + take, idx.end(), better);
  idx.resize(take);
}
}  // namespace

void CpuBackend::topk_rows(const float* scores, int64_t n, int64_t t, int64_t k, int32_t* out) {
  std::vector<int32_t> idx;
  for (int64_t r = 0; r < n; ++r) {
    best_k(scores + r * t, t, k, idx);
    std::sort(idx.begin(), idx.end());
    for (int64_t j = 0; j < k; ++j) out[r * k + j] = j < static_cast<int64_t>(idx.size()) ? idx[j] : -1;
  }
}

void CpuBackend::candidate_pool(const float* scores, const int64_t* visible, int64_t n, int64_t t,
                                int64_t block, int64_t keep_blocks, uint8_t* mask) {
  const int64_t nb = (t + block - 1) / block;
  std::vector<float> bs(nb);
  std::vector<int32_t> idx;
  for (int64_t r = 0; r < n; ++r) {
    const float* sc = scores + r * t;
    for (int64_t b = 0; b < nb; ++b) {
      float m = kNegInf;
      for (int64_t i = b * block; i < std::min(t, (b + 1) * block); ++i) m = std::max(m, sc[i]);
      bs[b] = m;
    }
    if (visible[r] > 0) bs[(visible[r] - 1) / block] = std::numeric_limits<float>::infinity();
    best_k(bs.data(), nb, keep_blocks, idx);
    uint8_t* mr = mask + r * t;
    std::fill(mr, mr + t, 0);
    for (int32_t b : idx)
      for (int64_t i = b * block; i < std::min(t, (b + 1) * block); ++i) mr[i] = 1;
  }
}

void CpuBackend::softmax_pool(const float* a, const float* b, int64_t r, int64_t dim, float* out) {
  for (int64_t d = 0; d < dim; ++d) {
    float mx = b[d];
    for (int64_t i = 1; i < r; ++i) mx = std::max(mx, b[i * dim + d]);
    double den = 0;
    for (int64_t i = 0; i < r; ++i) den += std::exp(static_cast<double>(b[i * dim + d] - mx));
    double z = 0;
    for (int64_t i = 0; i < r; ++i)
      z += static_cast<double>(a[i * dim + d]) *
           static_cast<float>(std::exp(static_cast<double>(b[i * dim + d] - mx)) / den);
    out[d] = static_cast<float>(z);
  }
}

void CpuBackend::router(const float* logits, int64_t n, int64_t n_experts, const float* bias,
                        const float* bias_vl, const uint8_t* vl, int64_t k, float temp, float route_scale,
                        int32_t* experts, float* weights) {
  std::vector<float> sc(n_experts), biased(n_experts);
  std::vector<int32_t> idx;
  for (int64_t r = 0; r < n; ++r) {
    const float* bvec = (vl && vl[r] && bias_vl) ? bias_vl : bias;
    for (int64_t e = 0; e < n_experts; ++e) {
      sc[e] = std::sqrt(softplusf(logits[r * n_experts + e] / temp));
      biased[e] = sc[e] + (bvec ? bvec[e] : 0.0f);
    }
    best_k(biased.data(), n_experts, k, idx);
    DS41_CHECK_EQ(static_cast<int64_t>(idx.size()), k,
                  "router row %lld: fewer finite scores than experts per token", static_cast<long long>(r));
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += sc[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      experts[r * k + j] = idx[j];
      weights[r * k + j] = sc[idx[j]] / (sum + 1e-20f) * route_scale;
    }
  }
}

void CpuBackend::swiglu(const float* g, const float* u, int64_t n, int64_t dim, float limit,
                        const float* row_scale, float* out) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      const float gg = std::min(g[r * dim + i], limit);
      const float uu = std::clamp(u[r * dim + i], -limit, limit);
      const float a = siluf(gg) * uu;
      out[r * dim + i] = row_scale ? row_scale[r] * a : a;
    }
}

void CpuBackend::scatter_add_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim, float* dst) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t d = 0; d < dim; ++d) dst[rows[i] * dim + d] += src[i * dim + d];
}

}  // namespace ds41::backends::cpu
