// Test support: the case table of every ops::Backend op (src/ops/backend.h) — shapes, a seeded
// input generator and a tolerance with its one-line reason per case (ARCHITECTURE "Numerics").
// Shared by the CPU reference's op test (tests/unit/ops/, expected values from independent
// double-precision arithmetic) and, later, the GPU parity table (tests/parity/cuda, CUDA vs the
// CPU reference on the same inputs). Shapes go past the limits that hide bugs (MODEL_SPEC 7):
// > 128 window rows and > 512 compressed entries per attention row, > 2048 candidate blocks,
// top-k of 512 among thousands with ties and infinities, released widths where cheap (hidden
// 5120, head_dim 512, index head_dim 128, 384 experts, mHC 4 x 5120).
//
// A tolerance of 0 means bit-for-bit equality (exact ops: gathers, selections, masks).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/weight_format.h"

namespace ds41::testing::op_cases {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Seeded generator of test inputs (std::mt19937_64: the same stream on every platform).
class OpRng {
 public:
  explicit OpRng(uint64_t seed) : g_(seed) {}
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(unit()); }
  double unit() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return static_cast<int64_t>(g_() % static_cast<uint64_t>(n)); }
  std::vector<float> floats(int64_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  std::vector<uint8_t> bytes(int64_t n) {
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = static_cast<uint8_t>(g_());
    return v;
  }

 private:
  std::mt19937_64 g_;
};

// ---- linear / grouped_linear -------------------------------------------------------------------
struct LinearCase {
  const char* name;
  quant::WeightFormat format;
  int64_t n, out, in;
  int64_t groups;  // 0: linear; > 0: grouped_linear with W = [groups * out/groups, in], x [n, groups * in]
  double tol;
  const char* why;
};
inline const std::vector<LinearCase>& linear_cases() {
  static const std::vector<LinearCase> c = {
      {"f32_n1", quant::WeightFormat::kF32, 1, 33, 70, 0, 1e-6, "fp32 8-lane sums vs fp64 over 70 terms"},
      {"f32_ragged", quant::WeightFormat::kF32, 7, 45, 131, 0, 1e-6,
       "fp32 8-lane sums vs fp64; n past the x4 unroll"},
      {"bf16_hidden", quant::WeightFormat::kBF16, 5, 40, 5120, 0, 1e-5,
       "fp32 lane sums over 5120 terms vs fp64"},
      {"fp8_ragged_tiles", quant::WeightFormat::kFp8Tiles, 6, 70, 100, 0, 2e-6,
       "exact dequant; fp32 lane sums vs fp64 (tiles cut at 70 / 100)"},
      {"fp8_hidden", quant::WeightFormat::kFp8Tiles, 4, 64, 5120, 0, 1e-5, "fp32 lane sums over 5120 terms"},
      {"fp4_expert", quant::WeightFormat::kFp4Rows, 9, 48, 5120, 0, 1e-5, "exact dequant; fp32 lane sums"},
      {"grouped_bf16", quant::WeightFormat::kBF16, 3, 4 * 20, 48, 4, 1e-6,
       "per-group fp32 lane sums over 48"},
      {"grouped_f32_wo_a", quant::WeightFormat::kF32, 5, 8 * 64, 512, 8, 3e-6,
       "released o-projection grouping (8 groups); fp32 sums over 512"},
  };
  return c;
}

// A weight in `format` with random payload (finite codes only) and E8M0 scales near 2^0.
struct WeightData {
  std::vector<uint8_t> data, scale;
};
inline WeightData make_weight(quant::WeightFormat f, int64_t out, int64_t in, OpRng& rng) {
  WeightData w;
  w.data.resize(quant::weight_payload_bytes(f, out, in));
  w.scale.resize(quant::weight_scale_bytes(f, out, in));
  switch (f) {
    case quant::WeightFormat::kF32:
      for (int64_t i = 0; i < out * in; ++i) {
        float v = rng.uniform(-1, 1);
        std::memcpy(&w.data[4 * i], &v, 4);
      }
      break;
    case quant::WeightFormat::kBF16:
      for (int64_t i = 0; i < out * in; ++i) {
        uint16_t b = f32_to_bf16(rng.uniform(-1, 1));
        std::memcpy(&w.data[2 * i], &b, 2);
      }
      break;
    case quant::WeightFormat::kFp8Tiles:
    case quant::WeightFormat::kEngramRows:
      w.data = rng.bytes(static_cast<int64_t>(w.data.size()));
      for (auto& b : w.data)
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
      break;
    case quant::WeightFormat::kFp4Rows: w.data = rng.bytes(static_cast<int64_t>(w.data.size())); break;
    case quant::WeightFormat::kNone: break;
  }
  for (auto& s : w.scale) s = static_cast<uint8_t>(120 + rng.below(10));  // 2^-7 .. 2^2
  return w;
}

// ---- row-wise elementwise ops ------------------------------------------------------------------
struct RmsNormCase {
  const char* name;
  int64_t n, dim;
  bool weighted;
  float eps;
  double tol;
  const char* why;
};
inline const std::vector<RmsNormCase>& rms_norm_cases() {
  static const std::vector<RmsNormCase> c = {
      {"hidden", 3, 5120, true, 1e-6f, 1e-5,
       "fp32 rounding of the 1e4 outlier (~70 x the rms of the output) dominates the metric"},
      {"ragged_unweighted", 5, 131, false, 1e-6f, 2e-6, "as above (outlier ~11 x rms)"},
      {"kv_head", 4, 512, true, 1e-6f, 5e-6, "as above (outlier ~22 x rms)"},
  };
  return c;
}

struct RopeCase {
  const char* name;
  int64_t n, heads, head_dim, n_freq;
  int64_t max_pos;
  bool inverse;
  double tol;
  const char* why;
};
inline const std::vector<RopeCase>& rope_cases() {
  static const std::vector<RopeCase> c = {
      {"released_q", 5, 4, 512, 32, 1 << 20, false, 1e-6,
       "fp32 angle as specified, fp64 cos/sin, fp32 products"},
      {"inverse_long_ctx", 3, 2, 512, 32, 1 << 20, true, 1e-6, "as above, rotation by -angle"},
      {"index_head", 4, 8, 128, 32, 65536, false, 1e-6, "as above"},
  };
  return c;
}

struct SwigluCase {
  const char* name;
  int64_t n, dim;
  float limit;
  bool row_scale;
  double tol;
  const char* why;
};
inline const std::vector<SwigluCase>& swiglu_cases() {
  static const std::vector<SwigluCase> c = {
      {"clamped", 4, 2048, 10.0f, false, 1e-6, "fp64 exp in silu, fp32 products"},
      {"row_scaled", 6, 256, 7.0f, true, 1e-6, "as above plus one fp32 product"},
  };
  return c;
}

// ---- gathers (exact) ---------------------------------------------------------------------------
struct GatherCase {
  const char* name;
  int64_t table_rows, dim, n, cols;
};
inline const std::vector<GatherCase>& embed_cases() {
  static const std::vector<GatherCase> c = {{"hidden", 300, 5120, 7, 1}, {"small", 9, 24, 12, 1}};
  return c;
}
inline const std::vector<GatherCase>& engram_gather_cases() {
  static const std::vector<GatherCase> c = {{"engram_head", 500, 128, 6, 4}, {"wide", 40, 1024, 3, 2}};
  return c;
}

struct ScatterCase {
  const char* name;
  int64_t m, dim, dst_rows;
  double tol;
  const char* why;
};
inline const std::vector<ScatterCase>& scatter_add_cases() {
  static const std::vector<ScatterCase> c = {
      {"repeated_rows", 40, 5120, 7, 1e-6, "fp32 sums in source order vs fp64 (rows repeat)"},
  };
  return c;
}

// ---- mHC ---------------------------------------------------------------------------------------
struct HcCase {
  const char* name;
  int64_t n, c, h, sinkhorn_iters;
  double tol;
  const char* why;
};
inline const std::vector<HcCase>& hc_map_cases() {
  static const std::vector<HcCase> c = {
      {"released", 3, 4, 5120, 20, 1e-5, "fp32 projections and Sinkhorn sums vs fp64"},
      {"one_iter", 4, 4, 64, 1, 1e-6, "as above, the column normalisation alone"},
      {"c2", 2, 2, 48, 5, 1e-6, "as above"},
  };
  return c;
}
inline const std::vector<HcCase>& hc_mix_cases() {  // hc_collapse and hc_expand
  static const std::vector<HcCase> c = {
      {"released", 3, 4, 5120, 0, 1e-6, "fp32 sums of c = 4 terms vs fp64"},
      {"c2", 5, 2, 33, 0, 1e-6, "as above"},
  };
  return c;
}

struct EngramUpdateCase {
  const char* name;
  int64_t n, c, h;
  float eps;
  double tol;
  const char* why;
};
inline const std::vector<EngramUpdateCase>& engram_update_cases() {
  static const std::vector<EngramUpdateCase> c = {
      {"released", 5, 4, 5120, 1e-20f, 1e-6, "fp64 norms and dot, fp32 gate and update"},
      {"small", 3, 2, 64, 1e-20f, 1e-6, "as above"},
  };
  return c;
}

// ---- attention and indexer ---------------------------------------------------------------------
// Row lengths go past the window (128 rows) and the compressed top-k (512 entries); a row with no
// entries yields 0.
struct AttentionCase {
  const char* name;
  int64_t n_heads, head_dim;
  std::vector<int64_t> row_entries;
  float scale;
  double tol;
  const char* why;
};
inline const std::vector<AttentionCase>& attention_cases() {
  static const std::vector<AttentionCase> c = {
      {"window_plus_topk",
       4,
       512,
       {0, 1, 128 + 512, 129, 700},
       0.044194f,
       2e-6,
       "fp32 8-lane dots, fp64 softmax and sums vs fp64 throughout"},
      {"many_heads_short", 16, 64, {3, 7, 2}, 0.125f, 2e-6, "as above"},
  };
  return c;
}

struct IndexerCase {
  const char* name;
  int64_t n_heads, head_dim, n_keys;
  std::vector<int64_t> visible;  // one per row (may exceed n_keys: clamped)
  float scale;
  double tol;
  const char* why;
};
inline const std::vector<IndexerCase>& indexer_cases() {
  static const std::vector<IndexerCase> c = {
      {"past_topk", 16, 128, 700, {700, 1, 513, 0, 900}, 0.088f, 4e-6, "fp32 dots and relu, fp64 head sum"},
      {"released_heads", 64, 128, 130, {130, 64}, 0.088f, 4e-6, "as above"},
  };
  return c;
}

// ---- selections (exact) ------------------------------------------------------------------------
struct TopkCase {
  const char* name;
  int64_t n, t, k;
  int64_t distinct;  // scores drawn from this many values (ties); 0: continuous
  double neg_inf_fraction, pos_inf_fraction;
};
inline const std::vector<TopkCase>& topk_cases() {
  static const std::vector<TopkCase> c = {
      {"k512_of_3000_ties", 3, 3000, 512, 40, 0.1, 0.001},
      {"k512_more_than_finite", 2, 600, 512, 0, 0.3, 0.0},
      {"k8_continuous", 4, 1000, 8, 0, 0.0, 0.0},
      {"all_neg_inf_row", 1, 50, 8, 0, 1.0, 0.0},
  };
  return c;
}

struct CandidateCase {
  const char* name;
  int64_t t, block, keep_blocks;
  std::vector<int64_t> visible;
  int64_t distinct;
};
inline const std::vector<CandidateCase>& candidate_cases() {
  static const std::vector<CandidateCase> c = {
      {"blocks_past_2048", 2 * 2100, 2, 64, {4200, 4199, 1, 3000}, 16},
      {"wide_blocks", 5000, 64, 16, {5000, 129, 64}, 0},
  };
  return c;
}

struct SoftmaxPoolCase {
  const char* name;
  int64_t r, dim;
  double tol;
  const char* why;
};
inline const std::vector<SoftmaxPoolCase>& softmax_pool_cases() {
  static const std::vector<SoftmaxPoolCase> c = {
      {"ratio2", 2, 512, 1e-6, "fp64 softmax rounded to fp32 weights, fp64 sum"},
      {"ratio4", 4, 512, 1e-6, "as above"},
      {"ratio128", 128, 64, 1e-6, "as above"},
  };
  return c;
}

struct RouterCase {
  const char* name;
  int64_t n, n_experts, k;
  float temp, route_scale;
  bool bias_vl;
  double tol;  // on the weights; the expert ids are exact
  const char* why;
};
inline const std::vector<RouterCase>& router_cases() {
  static const std::vector<RouterCase> c = {
      {"released", 6, 384, 6, 1.0f, 1.5f, true, 1e-6, "fp64 softplus, fp32 sqrt and normalisation"},
      {"temp", 3, 64, 8, 0.7f, 2.5f, false, 1e-6, "as above"},
  };
  return c;
}

}  // namespace ds41::testing::op_cases
