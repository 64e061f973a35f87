// ds41 ops: the op catalogue of the V4.1 forward pass and the Backend interface that
// implements it (ARCHITECTURE "Layers": ops own signatures and shape rules, never math).
// The model (src/model/) is a composition of these ops over explicit per-sequence state; a
// backend (src/backends/cpu, later cuda) supplies the arithmetic.
//
// Conventions for every op: row-major float32 buffers, `n` rows; buffers never alias unless
// stated; accumulation is at least float32 (the CPU reference uses float64 for long sums).
#pragma once

#include <cstdint>

#include "ops/weight_ref.h"

namespace ds41::ops {

// One attention call over n query rows (MODEL_SPEC 3.4.7). Row r attends to the
// kv_offsets[r]..kv_offsets[r+1]-1 entries of kv, each a head_dim vector used as key and value
// (single shared latent). s_j = scale * q_h . v_j; the sink enlarges the denominator only;
// a row without entries yields 0.
struct AttentionArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0;
  const float* q = nullptr;             // [n, n_heads, head_dim]
  const int64_t* kv_offsets = nullptr;  // [n + 1]
  const float* const* kv = nullptr;     // [kv_offsets[n]] pointers to head_dim vectors
  const float* sink = nullptr;          // [n_heads]
  float scale = 1.0f;
  float* out = nullptr;  // [n, n_heads, head_dim]
};

// Indexer scores (MODEL_SPEC 3.4.6): out[r, t] = sum_h w[r, h] * relu(q[r, h] . key[t]) * scale
// for t < visible[r], -inf for visible[r] <= t < n_keys.
struct IndexerArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0, n_keys = 0;
  const float* q = nullptr;          // [n, n_heads, head_dim]
  const float* w = nullptr;          // [n, n_heads]
  const float* keys = nullptr;       // [n_keys, head_dim]
  const int64_t* visible = nullptr;  // [n]
  float scale = 1.0f;
  float* out = nullptr;  // [n, n_keys]
};

// mHC site map (MODEL_SPEC 3.3) for n rows of C streams of width h.
struct HcMapArgs {
  int64_t n = 0, c = 0, h = 0, sinkhorn_iters = 0;
  const float* streams = nullptr;  // [n, c, h]
  const float* fn = nullptr;       // [(2 + c) * c, c * h]
  const float* scale = nullptr;    // [3]
  const float* base = nullptr;     // [(2 + c) * c]
  float hc_eps = 1e-6f, norm_eps = 1e-20f;
  float* pre = nullptr;   // [n, c]
  float* post = nullptr;  // [n, c]
  float* comb = nullptr;  // [n, c, c]
};

// Full (bidirectional) multi-head attention within segments (the vision tower, MODEL_SPEC 3.11):
// row r of segment s attends to every row of s with separate keys and values; softmax over the
// segment, no sink, no mask.
struct DenseAttentionArgs {
  int64_t n = 0, n_heads = 0, head_dim = 0;
  const float* q = nullptr;              // [n, n_heads, head_dim]
  const float* k = nullptr;              // [n, n_heads, head_dim]
  const float* v = nullptr;              // [n, n_heads, head_dim]
  const int64_t* seg_offsets = nullptr;  // [n_segs + 1], seg_offsets[0] = 0, seg_offsets[n_segs] = n
  int64_t n_segs = 0;
  float scale = 1.0f;
  float* out = nullptr;  // [n, n_heads, head_dim]
};

// Top-k tie order used by every selection in ds41 (index top-k, candidate blocks, router):
// larger score first; equal scores -> lower index first (NumPy's stable argsort of -score).
// -inf entries are never selected; +inf entries are.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Called once per weight at model load: a backend may convert or upload it here (the CPU
  // reference fills its dequantized cache). Optional.
  virtual void prepare(const WeightRef& w) {}
  // y[n, out] = x[n, in] . W^T.
  virtual void linear(const WeightRef& w, const float* x, int64_t n, float* y) = 0;
  // W = [groups * out_g, in_g]; x[n, groups * in_g]; y[n, groups * out_g]: group g multiplies
  // columns [g*in_g, (g+1)*in_g) of x with rows [g*out_g, (g+1)*out_g) of W (MODEL_SPEC 3.4.8).
  virtual void grouped_linear(const WeightRef& w, int64_t groups, const float* x, int64_t n, float* y) = 0;
  // y = weight * x / sqrt(mean(x^2) + eps) per row (y may alias x).
  virtual void rms_norm(const float* x, int64_t n, int64_t dim, const float* weight, float eps, float* y) = 0;
  // Interleaved-pair rotation of the last 2*n_freq channels of each head_dim vector
  // (n rows x heads); row r uses position pos[r]; inverse rotates by -angle (MODEL_SPEC 3.4.1, 3.8).
  virtual void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int64_t* pos,
                    const float* inv_freq, int64_t n_freq, bool inverse) = 0;
  // out[r] = bf16 table row ids[r] (dim wide) as float.
  virtual void embed_bf16(const uint8_t* table, int64_t rows, int64_t dim, const int32_t* ids, int64_t n,
                          float* out) = 0;
  // out[r] = concat over cols of the dequantized Engram rows row_ids[r, col] (E4M3 + E8M0 per 32).
  virtual void engram_gather(const uint8_t* table, const uint8_t* scale, int64_t dim, const int64_t* row_ids,
                             int64_t n, int64_t cols, float* out) = 0;
  // Engram per-stream gate and update (MODEL_SPEC 3.2.4): streams[n, c, h] += g[n, c] * value[n, h]
  // with g from keys[n, c, h] and omega[c, h]; rows with dead[r] != 0 are left unchanged (g = 0).
  virtual void engram_update(float* streams, const float* keys, const float* value, const float* omega,
                             const uint8_t* dead, int64_t n, int64_t c, int64_t h, float eps,
                             float* gates) = 0;
  virtual void hc_map(const HcMapArgs& a) = 0;
  // out[n, h] = sum_c weights[n, c] * streams[n, c, h].
  virtual void hc_collapse(const float* streams, const float* weights, int64_t n, int64_t c, int64_t h,
                           float* out) = 0;
  // streams[n, k, h] = post[n, k] * y[n, h] + sum_j comb[n, j, k] * streams[n, j, h] (in place).
  virtual void hc_expand(float* streams, const float* y, const float* post, const float* comb, int64_t n,
                         int64_t c, int64_t h) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  virtual void indexer_scores(const IndexerArgs& a) = 0;
  // Per row: the indices of the min(k, #non--inf) largest scores (tie order above), written in
  // ascending index order into out[r, 0..k), padded with -1.
  virtual void topk_rows(const float* scores, int64_t n, int64_t t, int64_t k, int32_t* out) = 0;
  // Candidate pool (MODEL_SPEC 3.4.6): per row, blocks of `block` entries over scores[r, 0..t),
  // block score = max, block (visible[r]-1)/block forced to +inf, the best `keep_blocks` blocks
  // with a score > -inf kept; mask[r, 0..t) = 1 inside kept blocks.
  virtual void candidate_pool(const float* scores, const int64_t* visible, int64_t n, int64_t t,
                              int64_t block, int64_t keep_blocks, uint8_t* mask) = 0;
  // Ratio-r compressor pooling: out[d] = sum_i softmax_i(b[i, d]) * a[i, d] over r rows.
  virtual void softmax_pool(const float* a, const float* b, int64_t r, int64_t dim, float* out) = 0;
  // MoE router (MODEL_SPEC 3.5): score = sqrt(softplus(logit / temp)); select the k best
  // score + bias (bias = bias_vl where vl[r] != 0); weight = score / (sum + 1e-20) * route_scale.
  // experts/weights: [n, k] in order of descending biased score.
  virtual void router(const float* logits, int64_t n, int64_t n_experts, const float* bias,
                      const float* bias_vl, const uint8_t* vl, int64_t k, float temp, float route_scale,
                      int32_t* experts, float* weights) = 0;
  // SwiGLU with the V4.1 clamps: out = row_scale[r] * silu(min(g, limit)) * clamp(u, -limit, limit);
  // row_scale may be null (1).
  virtual void swiglu(const float* g, const float* u, int64_t n, int64_t dim, float limit,
                      const float* row_scale, float* out) = 0;
  // dst[rows[i], :] += src[i, :].
  virtual void scatter_add_rows(const float* src, const int64_t* rows, int64_t m, int64_t dim,
                                float* dst) = 0;

  // --- Vision tower and aligner (MODEL_SPEC 3.11) ---
  // y[r, :] += bias, n rows of dim.
  virtual void add_bias(float* y, int64_t n, int64_t dim, const float* bias) = 0;
  // y[i] += x[i] over count values (residual adds).
  virtual void add_inplace(float* y, const float* x, int64_t count) = 0;
  // Exact (erf) GELU in place: x * 0.5 * (1 + erf(x / sqrt(2))).
  virtual void gelu_erf(float* x, int64_t count) = 0;
  // 2D RoPE, split-half convention, on n rows x heads vectors of head_dim: with the angle vector
  // a = [row[r] * f (head_dim/4), col[r] * f (head_dim/4)] (float32 products),
  // out[j] = x[j] cos a_j - x[j + head_dim/2] sin a_j, out[j + head_dim/2] = x[j + head_dim/2] cos a_j
  // + x[j] sin a_j for j < head_dim/2. inv_freq has head_dim/4 entries.
  virtual void rope_2d(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* row,
                       const int32_t* col, const float* inv_freq) = 0;
  virtual void dense_attention(const DenseAttentionArgs& a) = 0;
  // The aligner's unshuffle: x is a grid_h x grid_w grid of c-wide rows, zero-padded to multiples
  // of k; out[(i * ceil(grid_w/k) + j), (ch * k + dy) * k + dx] = x[(i*k + dy) * grid_w + j*k + dx, ch]
  // (windows in reading order, each flattened channel-major).
  virtual void space_to_depth(const float* x, int64_t grid_h, int64_t grid_w, int64_t c, int64_t k,
                              float* out) = 0;
};

}  // namespace ds41::ops
