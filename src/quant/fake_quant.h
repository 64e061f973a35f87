// ds41 quant: the three fake-quant operators that are part of the model semantics
// (MODEL_SPEC 3.9) and the packed row layouts that store their results losslessly (MODEL_SPEC 5.2,
// 4.1). Every operator is split into encode (float -> packed bytes) and decode (packed -> float),
// so the fake-quantized value is decode(encode(x)) and the KV cache stores exactly what the
// model computes with.
//
//   Q_win (window KV, blocks of 32): A = max(max|x|, 1e-4); s = pow2ceil(A * f32(1/448));
//          x^ = e4m3_rne(clamp(x/s, -448, 448)) * s.
//          Row: n E4M3 bytes, then n/32 E8M0 bytes (s = 2^(b-127)).      n=512 -> 528 B.
//   Q_kv  (main compressed KV, blocks of 16): A = max(max|x|, 6*2^-9); s = e4m3_rne(A / 6);
//          x^ = e2m1_rne(clamp(x/s, -6, 6)) * s.
//          Row: n/2 packed E2M1 bytes (low nibble = even element), then n/16 E4M3 scale bytes.
//                                                                     n=512 -> 288 B.
//   Q_idx (indexer keys and queries, blocks of 32): A = max(max|x|, 6*2^-126);
//          s = pow2ceil(A * f32(1/6)); x^ = e2m1_rne(clamp(x/s, -6, 6)) * s.
//          Row: n/2 packed E2M1 bytes, then n/32 E8M0 bytes.           n=128 -> 68 B.
//
// Non-finite input (documented behaviour; the model never produces it from finite weights):
// +-inf counts as the largest finite float when computing A and saturates to the grid's
// extreme; NaN is ignored by the block maximum and encodes as NaN (E4M3 0x7f) in Q_win and as
// +0 in the E2M1 formats (which have no NaN).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace ds41::quant {

inline constexpr int kQwinBlock = 32;
inline constexpr int kQkvBlock = 16;
inline constexpr int kQidxBlock = 32;

// Row sizes in bytes for n channels (n a multiple of the block).
constexpr int64_t window_row_bytes(int64_t n) { return n + n / kQwinBlock; }
constexpr int64_t kv_row_bytes(int64_t n) { return n / 2 + n / kQkvBlock; }
constexpr int64_t idx_row_bytes(int64_t n) { return n / 2 + n / kQidxBlock; }

// Released layouts (head_dim 512, index_head_dim 128), as block structs.
struct WindowRow512 { uint8_t values[512]; uint8_t exps[16]; };
struct KvRow512 { uint8_t codes[256]; uint8_t scales[32]; };
struct IdxRow128 { uint8_t codes[64]; uint8_t exps[4]; };
static_assert(sizeof(WindowRow512) == 528 && window_row_bytes(512) == 528);
static_assert(sizeof(KvRow512) == 288 && kv_row_bytes(512) == 288);
static_assert(sizeof(IdxRow128) == 68 && idx_row_bytes(128) == 68);

// Encoders: x has n values; row receives the packed bytes of the layouts above.
void q_win_encode(const float* x, int64_t n, uint8_t* row);
void q_kv_encode(const float* x, int64_t n, uint8_t* row);
void q_idx_encode(const float* x, int64_t n, uint8_t* row);
// Decoders: row -> n floats.
void q_win_decode(const uint8_t* row, int64_t n, float* out);
void q_kv_decode(const uint8_t* row, int64_t n, float* out);
void q_idx_decode(const uint8_t* row, int64_t n, float* out);
// In-place fake quantization (encode + decode), for paths that keep floats.
void q_win_inplace(float* x, int64_t n);
void q_kv_inplace(float* x, int64_t n);
void q_idx_inplace(float* x, int64_t n);

// Packing of values that already lie on an operator's grid (e.g. read back from another
// implementation): finds a scale per block under which every value is exactly representable
// and returns the row; decode(row) reproduces the values bit for bit. Errors name the first
// block that lies on no grid point.
Status q_win_pack_on_grid(const float* xq, int64_t n, uint8_t* row);
Status q_kv_pack_on_grid(const float* xq, int64_t n, uint8_t* row);
Status q_idx_pack_on_grid(const float* xq, int64_t n, uint8_t* row);

}  // namespace ds41::quant
