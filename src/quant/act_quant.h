// ds41 quant: activation numerics of the FP8 / FP4 linears.
//
// MODEL_SPEC 3.0: "FP8 linears are FP8 GEMMs with block-32 dynamic FP8 activation quantization in the
// official path (see Q3); a dequantize-to-BF16 GEMM is a close approximation (HF does this)". ds41's
// default, ActNumerics::kExact, is the HF form the goldens were made with: x stays float32 and only the
// weights are quantized. ActNumerics::kFp8Block32 is the official form: before a linear whose weight is
// FP8 (32x32 tiles) or FP4 (expert rows), each row of x is quantized in blocks of 32 along K to E4M3
// with a power-of-two scale. The scale rule follows the checkpoint's `scale_fmt: ue8m0` (MODEL_SPEC 1,
// quantization_config), which in the official kernels rounds the block scale up to a power of two:
//
//   A = max(max|x_block|, 1e-4);  s = pow2ceil(A * f32(1/448));  x^ = e4m3_rne(clamp(x / s, -448, 448)) * s
//
// — the same operator as the window cache's Q_win (MODEL_SPEC 3.9, quant/fake_quant.h), so the CPU and
// CUDA encoders already agree bit for bit. Q3 (pow2 vs float scales) is open in the spec; the rule is
// the checkpoint's declared format. With pow2 scales x^ = q * 2^k with q an E4M3 value, exact in BF16,
// so a GPU linear needs one BF16 pass over x^ instead of the exact form's three (docs/
// numerics_decision_fp8_activations.md). BF16 and F32 linears (the router gate, the head, the compressor,
// the indexer's projections) take x as it is in both modes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "quant/weight_format.h"

namespace ds41::quant {

enum class ActNumerics : uint8_t {
  kExact,       // x in float32 (HF; the goldens' numerics)
  kFp8Block32,  // x quantized to E4M3 per 32 along K with pow2 scales before FP8 / FP4 linears (official)
};

inline constexpr int kActQuantBlock = 32;  // = quant::kQwinBlock

// "exact" / "fp8-act" (the names of the CLI flag and of the model identity).
const char* act_numerics_name(ActNumerics a);
// Parses those names; anything else is an invalid-argument error naming the accepted values.
Result<ActNumerics> parse_act_numerics(std::string_view s);

// Whether a linear over a weight of this format quantizes its input in mode a.
inline bool act_quant_applies(ActNumerics a, WeightFormat f) {
  return a == ActNumerics::kFp8Block32 && (f == WeightFormat::kFp8Tiles || f == WeightFormat::kFp4Rows);
}

// out[r, :] = the block-32 quantization above of x[r, :] for rows x k values (out may alias x). A last
// block shorter than 32 (k not a multiple of 32) takes its own scale over its values. NaN stays NaN
// (and is ignored by the block maximum); +-inf saturates to +-448 s.
void act_quant_fp8_rows(const float* x, int64_t rows, int64_t k, float* out);

}  // namespace ds41::quant
