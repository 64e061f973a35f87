// ds41 quant: weight format (de)quantizers — MODEL_SPEC 2.1.
#include "quant/weight_formats.h"

#include <algorithm>
#include <cmath>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/e8m0.h"

namespace ds41::quant {

int ceil_log2_clamped(double a) {
  int e;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int k = (m == 0.5) ? e - 1 : e;
  return std::clamp(k, -127, 127);
}

void fp8_tiles_dequant_rows(const uint8_t* w, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                            int64_t row_begin, int64_t row_end, float* out) {
  const float* t = e4m3_table();
  const int64_t tiles_in = ceil_div(in_dim, kFp8Tile);
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint8_t* wr = w + o * in_dim;
    const uint8_t* sr = scale + (o / kFp8Tile) * tiles_in;
    float* dst = out + (o - row_begin) * in_dim;
    for (int64_t ti = 0; ti < tiles_in; ++ti) {
      float s = e8m0_to_float(sr[ti]);
      int64_t b = ti * kFp8Tile, e = std::min<int64_t>(in_dim, b + kFp8Tile);
      for (int64_t i = b; i < e; ++i) dst[i] = t[wr[i]] * s;
    }
  }
}

void fp8_tiles_quantize(const float* w, int64_t out_dim, int64_t in_dim, uint8_t* w_q, uint8_t* scale) {
  const int64_t to = ceil_div(out_dim, kFp8Tile), ti = ceil_div(in_dim, kFp8Tile);
  for (int64_t a = 0; a < to; ++a) {
    for (int64_t b = 0; b < ti; ++b) {
      int64_t r0 = a * kFp8Tile, r1 = std::min(out_dim, r0 + kFp8Tile);
      int64_t c0 = b * kFp8Tile, c1 = std::min(in_dim, c0 + kFp8Tile);
      double amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(w[r * in_dim + c])));
      int k = amax > 0 ? ceil_log2_clamped(amax / 448.0) : -127;
      scale[a * ti + b] = e8m0_from_exponent(k);
      double inv = std::ldexp(1.0, -k);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          w_q[r * in_dim + c] = e4m3_from_float(static_cast<float>(w[r * in_dim + c] * inv));
    }
  }
}

void fp4_rows_dequant_rows(const uint8_t* packed, const uint8_t* scale, int64_t out_dim, int64_t in_dim,
                           int64_t row_begin, int64_t row_end, float* out) {
  const int64_t nb = in_dim / kFp4Block;
  for (int64_t o = row_begin; o < row_end; ++o) {
    const uint8_t* pr = packed + o * (in_dim / 2);
    const uint8_t* sr = scale + o * nb;
    float* dst = out + (o - row_begin) * in_dim;
    for (int64_t b = 0; b < nb; ++b) {
      float s = e8m0_to_float(sr[b]);
      for (int64_t j = b * kFp4Block / 2; j < (b + 1) * kFp4Block / 2; ++j) {
        dst[2 * j] = e2m1_to_float(pr[j] & 15) * s;
        dst[2 * j + 1] = e2m1_to_float(pr[j] >> 4) * s;
      }
    }
  }
}

void fp4_rows_quantize(const float* w, int64_t out_dim, int64_t in_dim, uint8_t* packed, uint8_t* scale) {
  const int64_t nb = in_dim / kFp4Block;
  uint8_t codes[kFp4Block];
  for (int64_t o = 0; o < out_dim; ++o) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* src = w + o * in_dim + b * kFp4Block;
      double amax = 0;
      for (int i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(static_cast<double>(src[i])));
      int k = amax > 0 ? ceil_log2_clamped(amax / 6.0) : -127;
      scale[o * nb + b] = e8m0_from_exponent(k);
      double inv = std::ldexp(1.0, -k);
      for (int i = 0; i < kFp4Block; ++i) codes[i] = e2m1_from_float(static_cast<float>(src[i] * inv));
      e2m1_pack(codes, kFp4Block, packed + o * (in_dim / 2) + b * kFp4Block / 2);
    }
  }
}

void engram_row_dequant(const uint8_t* row, const uint8_t* row_scale, int64_t dim, float* out) {
  const float* t = e4m3_table();
  for (int64_t b = 0; b < dim / kEngramBlock; ++b) {
    float s = e8m0_to_float(row_scale[b]);
    for (int64_t i = b * kEngramBlock; i < (b + 1) * kEngramBlock; ++i) out[i] = t[row[i]] * s;
  }
}

void engram_rows_quantize(const float* w, int64_t rows, int64_t dim, uint8_t* q, uint8_t* scale) {
  const int64_t nb = dim / kEngramBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* src = w + r * dim + b * kEngramBlock;
      double amax = 0;
      for (int i = 0; i < kEngramBlock; ++i) amax = std::max(amax, std::fabs(static_cast<double>(src[i])));
      int k = amax > 0 ? ceil_log2_clamped(amax / 448.0) : -127;
      scale[r * nb + b] = e8m0_from_exponent(k);
      double inv = std::ldexp(1.0, -k);
      for (int i = 0; i < kEngramBlock; ++i)
        q[r * dim + b * kEngramBlock + i] = e4m3_from_float(static_cast<float>(src[i] * inv));
    }
  }
}

}  // namespace ds41::quant
