// ds41 backends/cuda: device code of the fake-quant operators Q_win / Q_kv / Q_idx (MODEL_SPEC 3.9)
// and of their packed rows (MODEL_SPEC 5.2), shared by fake_quant_kernels.cu (contiguous rows) and
// kv_rows_kernels.cu (rows gathered from / scattered into pools). Bit-identical to src/quant.
//
// Thread model: one thread ("lane") per channel, consecutive channels of a row in consecutive lanes.
// A quantization block (32 channels for Q_win / Q_idx, 16 for Q_kv) is a warp or a half warp, so
// its maximum is a shuffle reduction and E2M1 nibble pairs are joined with one shuffle. Every lane
// of the warp must call encode_lane / pack_byte (shuffles), active or not; a block is either wholly
// active or wholly inactive because rows are a multiple of the block wide and CTAs a multiple of 32.
#pragma once

#include <cfloat>
#include <cstdint>

#include "backends/cuda/quant_device.cuh"

namespace ds41::cuda::fq {

constexpr unsigned kFullMask = 0xffffffffu;
// Op numbers as in FakeQuantOp: 0 = Q_win, 1 = Q_kv, 2 = Q_idx.
constexpr int kWin = 0, kKv = 1, kIdx = 2;

// Channels per quantization block.
__host__ __device__ constexpr int64_t block_of(int op) { return op == kKv ? 16 : 32; }
// Bytes of one packed row of n channels (the layouts of quant/fake_quant.h).
__host__ __device__ constexpr int64_t row_bytes(int op, int64_t n) {
  return op == kWin ? n + n / 32 : op == kKv ? n / 2 + n / 16 : n / 2 + n / 32;
}

// max |x| over groups of `width` lanes (width 32 or 16); NaN ignored (fmaxf returns the other
// operand), inf counted as FLT_MAX: the rules of quant::block_amax.
template <int kWidth>
__device__ __forceinline__ float group_amax(float v) {
  float a = fabsf(v);
  a = isnan(a) ? 0.0f : a;
#pragma unroll
  for (int off = kWidth / 2; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(kFullMask, a, off));
  return fminf(a, FLT_MAX);
}

// One lane's encoding: its code (E4M3 byte for Q_win, E2M1 nibble otherwise) and its block's
// scale byte (E8M0 for Q_win / Q_idx, E4M3 for Q_kv).
struct LaneCode {
  uint32_t code;
  uint32_t scale;
};

template <int kOp>
__device__ __forceinline__ LaneCode encode_lane(float v) {
  LaneCode c;
  if constexpr (kOp == kWin) {
    const float a = fmaxf(group_amax<32>(v), 1e-4f);
    const int k = dev::pow2ceil_exponent(a * (1.0f / 448.0f));
    const float s = dev::exp2_int(k);
    c.code = isnan(v) ? 0x7fu : dev::e4m3_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -448.0f, 448.0f));
    c.scale = static_cast<uint32_t>(k + 127);
  } else if constexpr (kOp == kKv) {
    const float a = fmaxf(group_amax<16>(v), 6.0f * 0x1p-9f);
    c.scale = dev::e4m3_encode(__fdiv_rn(a, 6.0f));
    const float s = dev::e4m3_decode(c.scale);
    c.code = dev::e2m1_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -6.0f, 6.0f));
  } else {
    const float a = fmaxf(group_amax<32>(v), 6.0f * 0x1p-126f);
    const int k = dev::pow2ceil_exponent(a * (1.0f / 6.0f));
    const float s = dev::exp2_int(k);
    c.code = dev::e2m1_encode(dev::clamp_keep_nan(__fdiv_rn(v, s), -6.0f, 6.0f));
    c.scale = static_cast<uint32_t>(k + 127);
  }
  return c;
}

// The byte an even lane stores for E2M1 ops (its nibble low, the odd neighbour's high); all lanes
// call it. Q_win: the lane's own E4M3 byte.
template <int kOp>
__device__ __forceinline__ uint32_t pack_byte(const LaneCode& c) {
  if constexpr (kOp == kWin) {
    return c.code;
  } else {
    const uint32_t odd = __shfl_down_sync(kFullMask, c.code, 1);
    return c.code | (odd << 4);
  }
}

// Writes lane i's share of the packed row (n channels): its code byte (Q_win) or the pair byte
// (even lanes), and the block's scale byte (first lane of the block).
template <int kOp>
__device__ __forceinline__ void store_lane(uint8_t* row, int64_t n, int64_t i, const LaneCode& c,
                                           uint32_t packed) {
  if constexpr (kOp == kWin) {
    row[i] = static_cast<uint8_t>(packed);
    if ((i & 31) == 0) row[n + i / 32] = static_cast<uint8_t>(c.scale);
  } else {
    constexpr int64_t kBlock = kOp == kKv ? 16 : 32;
    if ((i & 1) == 0) row[i / 2] = static_cast<uint8_t>(packed);  // low nibble = even element
    if ((i & (kBlock - 1)) == 0) row[n / 2 + i / kBlock] = static_cast<uint8_t>(c.scale);
  }
}

// The float a code and its block's scale byte decode to (what decode(row) yields for the lane).
template <int kOp>
__device__ __forceinline__ float decode_code(uint32_t code, uint32_t scale) {
  if constexpr (kOp == kWin) return dev::e4m3_decode(code) * dev::e8m0_decode(scale);
  if constexpr (kOp == kKv) return dev::e2m1_decode(code) * dev::e4m3_decode(scale);
  return dev::e2m1_decode(code) * dev::e8m0_decode(scale);
}

// Channel i of a packed row of n channels, as float32.
template <int kOp>
__device__ __forceinline__ float decode_elem(const uint8_t* row, int64_t n, int64_t i) {
  if constexpr (kOp == kWin) {
    return decode_code<kWin>(row[i], row[n + i / 32]);
  } else {
    constexpr int64_t kBlock = kOp == kKv ? 16 : 32;
    const uint32_t b = row[i / 2];
    const uint32_t code = (i & 1) ? (b >> 4) : (b & 15u);
    return decode_code<kOp>(code, row[n / 2 + i / kBlock]);
  }
}

// Runtime op -> a call of f.template operator()<kOp>() (kernels are instantiated per op).
template <typename F>
__host__ __forceinline__ void dispatch_op(int op, F&& f) {
  if (op == kWin)
    f.template operator()<kWin>();
  else if (op == kKv)
    f.template operator()<kKv>();
  else
    f.template operator()<kIdx>();
}

}  // namespace ds41::cuda::fq
