// ds41 quant: Q_win / Q_kv / Q_idx (MODEL_SPEC 3.9) and their packed rows (MODEL_SPEC 5.2).
#include "quant/fake_quant.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <string>

#include "quant/e2m1.h"
#include "quant/e4m3.h"
#include "quant/e8m0.h"

namespace ds41::quant {
namespace {

// max |x| over a block, NaN ignored, inf counted as FLT_MAX.
float block_amax(const float* x, int n) {
  float a = 0.0f;
  for (int i = 0; i < n; ++i) {
    float v = std::fabs(x[i]);
    if (v > a) a = v;  // false for NaN
  }
  return std::min(a, FLT_MAX);
}

inline float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

}  // namespace

void q_win_encode(const float* x, int64_t n, uint8_t* row) {
  uint8_t* exps = row + n;
  for (int64_t b = 0; b < n / kQwinBlock; ++b) {
    const float* xb = x + b * kQwinBlock;
    float a = std::max(block_amax(xb, kQwinBlock), 1e-4f);
    int k = pow2ceil_exponent(a * (1.0f / 448.0f));
    float s = std::ldexp(1.0f, k);
    exps[b] = e8m0_from_exponent(k);
    for (int i = 0; i < kQwinBlock; ++i) {
      float v = xb[i];
      row[b * kQwinBlock + i] = std::isnan(v) ? 0x7f : e4m3_from_float(clampf(v / s, -448.0f, 448.0f));
    }
  }
}

void q_win_decode(const uint8_t* row, int64_t n, float* out) {
  const float* t = e4m3_table();
  const uint8_t* exps = row + n;
  for (int64_t b = 0; b < n / kQwinBlock; ++b) {
    float s = e8m0_to_float(exps[b]);
    for (int i = 0; i < kQwinBlock; ++i) out[b * kQwinBlock + i] = t[row[b * kQwinBlock + i]] * s;
  }
}

void q_kv_encode(const float* x, int64_t n, uint8_t* row) {
  uint8_t* scales = row + n / 2;
  uint8_t codes[kQkvBlock];
  for (int64_t b = 0; b < n / kQkvBlock; ++b) {
    const float* xb = x + b * kQkvBlock;
    float a = std::max(block_amax(xb, kQkvBlock), 6.0f * 0x1p-9f);
    uint8_t sc = e4m3_from_float(a / 6.0f);
    float s = e4m3_to_float(sc);
    scales[b] = sc;
    for (int i = 0; i < kQkvBlock; ++i) codes[i] = e2m1_from_float(clampf(xb[i] / s, -6.0f, 6.0f));
    e2m1_pack(codes, kQkvBlock, row + b * kQkvBlock / 2);
  }
}

void q_kv_decode(const uint8_t* row, int64_t n, float* out) {
  const uint8_t* scales = row + n / 2;
  for (int64_t b = 0; b < n / kQkvBlock; ++b) {
    float s = e4m3_to_float(scales[b]);
    for (int i = 0; i < kQkvBlock; ++i) {
      int64_t j = b * kQkvBlock + i;
      out[j] = e2m1_to_float(e2m1_unpack_at(row, j)) * s;
    }
  }
}

void q_idx_encode(const float* x, int64_t n, uint8_t* row) {
  uint8_t* exps = row + n / 2;
  uint8_t codes[kQidxBlock];
  for (int64_t b = 0; b < n / kQidxBlock; ++b) {
    const float* xb = x + b * kQidxBlock;
    float a = std::max(block_amax(xb, kQidxBlock), 6.0f * 0x1p-126f);
    int k = pow2ceil_exponent(a * (1.0f / 6.0f));
    float s = std::ldexp(1.0f, k);
    exps[b] = e8m0_from_exponent(k);
    for (int i = 0; i < kQidxBlock; ++i) codes[i] = e2m1_from_float(clampf(xb[i] / s, -6.0f, 6.0f));
    e2m1_pack(codes, kQidxBlock, row + b * kQidxBlock / 2);
  }
}

void q_idx_decode(const uint8_t* row, int64_t n, float* out) {
  const uint8_t* exps = row + n / 2;
  for (int64_t b = 0; b < n / kQidxBlock; ++b) {
    float s = e8m0_to_float(exps[b]);
    for (int i = 0; i < kQidxBlock; ++i) {
      int64_t j = b * kQidxBlock + i;
      out[j] = e2m1_to_float(e2m1_unpack_at(row, j)) * s;
    }
  }
}

void q_win_inplace(float* x, int64_t n) {
  uint8_t row[window_row_bytes(kQwinBlock)];
  for (int64_t b = 0; b < n / kQwinBlock; ++b) {
    q_win_encode(x + b * kQwinBlock, kQwinBlock, row);
    q_win_decode(row, kQwinBlock, x + b * kQwinBlock);
  }
}
void q_kv_inplace(float* x, int64_t n) {
  uint8_t row[kv_row_bytes(kQkvBlock)];
  for (int64_t b = 0; b < n / kQkvBlock; ++b) {
    q_kv_encode(x + b * kQkvBlock, kQkvBlock, row);
    q_kv_decode(row, kQkvBlock, x + b * kQkvBlock);
  }
}
void q_idx_inplace(float* x, int64_t n) {
  uint8_t row[idx_row_bytes(kQidxBlock)];
  for (int64_t b = 0; b < n / kQidxBlock; ++b) {
    q_idx_encode(x + b * kQidxBlock, kQidxBlock, row);
    q_idx_decode(row, kQidxBlock, x + b * kQidxBlock);
  }
}

namespace {

// Tries candidate scales (most likely first) until every value of the block is exactly
// code * s for some code; writes the codes. Returns false when no candidate works.
template <typename EncodeFn, typename DecodeFn>
bool find_block_scale(const float* xq, int n, const float* cands, int n_cands, EncodeFn enc, DecodeFn dec,
                      uint8_t* codes, int* which) {
  for (int c = 0; c < n_cands; ++c) {
    float s = cands[c];
    if (!(s > 0) || !std::isfinite(s)) continue;
    bool ok = true;
    for (int i = 0; i < n && ok; ++i) {
      uint8_t code = enc(xq[i] / s);
      codes[i] = code;
      float back = dec(code) * s;
      ok = (back == xq[i]) && (std::signbit(back) == std::signbit(xq[i]));
    }
    if (ok) {
      *which = c;
      return true;
    }
  }
  return false;
}

Status off_grid(const char* op, int64_t block) {
  return invalid_argument(std::string(op) + ": block " + std::to_string(block) +
                          " holds values that lie on no grid point of the format");
}

}  // namespace

Status q_win_pack_on_grid(const float* xq, int64_t n, uint8_t* row) {
  for (int64_t b = 0; b < n / kQwinBlock; ++b) {
    const float* xb = xq + b * kQwinBlock;
    float a = std::max(block_amax(xb, kQwinBlock), 1e-4f);
    int k0 = pow2ceil_exponent(a * (1.0f / 448.0f));
    float cands[8];
    int ks[8];
    for (int d = 0; d < 8; ++d) {
      ks[d] = k0 + (d % 2 ? -(d + 1) / 2 : d / 2);  // k0, k0-1, k0+1, k0-2, ...
      cands[d] = std::ldexp(1.0f, ks[d]);
    }
    int which;
    if (!find_block_scale(xb, kQwinBlock, cands, 8, e4m3_from_float, e4m3_to_float, row + b * kQwinBlock, &which))
      return off_grid("Q_win", b);
    row[n + b] = e8m0_from_exponent(ks[which]);
  }
  return ok_status();
}

Status q_idx_pack_on_grid(const float* xq, int64_t n, uint8_t* row) {
  uint8_t codes[kQidxBlock];
  for (int64_t b = 0; b < n / kQidxBlock; ++b) {
    const float* xb = xq + b * kQidxBlock;
    float a = std::max(block_amax(xb, kQidxBlock), 6.0f * 0x1p-126f);
    int k0 = pow2ceil_exponent(a * (1.0f / 6.0f));
    float cands[8];
    int ks[8];
    for (int d = 0; d < 8; ++d) {
      ks[d] = std::clamp(k0 + (d % 2 ? -(d + 1) / 2 : d / 2), -127, 127);
      cands[d] = std::ldexp(1.0f, ks[d]);
    }
    int which;
    if (!find_block_scale(xb, kQidxBlock, cands, 8, e2m1_from_float, e2m1_to_float, codes, &which))
      return off_grid("Q_idx", b);
    e2m1_pack(codes, kQidxBlock, row + b * kQidxBlock / 2);
    row[n / 2 + b] = e8m0_from_exponent(ks[which]);
  }
  return ok_status();
}

Status q_kv_pack_on_grid(const float* xq, int64_t n, uint8_t* row) {
  // Candidates: the scale Q_kv itself would pick for this block first, then every positive
  // finite E4M3 value from the largest down (any of them that fits is lossless).
  static const auto all = [] {
    std::array<uint8_t, 126> v{};
    for (int c = 0; c < 126; ++c) v[c] = static_cast<uint8_t>(126 - c);  // codes 126..1
    return v;
  }();
  uint8_t codes[kQkvBlock];
  for (int64_t b = 0; b < n / kQkvBlock; ++b) {
    const float* xb = xq + b * kQkvBlock;
    float a = std::max(block_amax(xb, kQkvBlock), 6.0f * 0x1p-9f);
    uint8_t first = e4m3_from_float(a / 6.0f);
    float cands[127];
    uint8_t cc[127];
    cands[0] = e4m3_to_float(first);
    cc[0] = first;
    for (int c = 0; c < 126; ++c) {
      cc[c + 1] = all[c];
      cands[c + 1] = e4m3_to_float(all[c]);
    }
    int which;
    if (!find_block_scale(xb, kQkvBlock, cands, 127, e2m1_from_float, e2m1_to_float, codes, &which))
      return off_grid("Q_kv", b);
    e2m1_pack(codes, kQkvBlock, row + b * kQkvBlock / 2);
    row[n / 2 + b] = cc[which];
  }
  return ok_status();
}

}  // namespace ds41::quant
