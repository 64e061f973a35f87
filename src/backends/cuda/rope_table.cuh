// ds41 backends/cuda: the rotation table of a RoPE row (MODEL_SPEC 3.4.2, 7.9), shared by every kernel
// that rotates (rope_kernel, rows_norm_rope_quant, the decode attention's q load and combine): for
// frequency f, the angle fl(p * inv_freq[f]) in float32 (the reference's product), its cos and sin in
// fp64 rounded to float32, the sine negated for the inverse rotation; cos at cs[2 f], sin at cs[2 f + 1].
// The same operations wherever it is filled, so every kernel rotates with the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds41::cuda::dev {

// Frequencies f = first, first + step, ... < n_freq of the table at cs (the caller's threads split them;
// the caller synchronizes before reading).
__device__ __forceinline__ void rope_table_fill(float p, const float* __restrict__ inv_freq, int64_t n_freq,
                                                bool inverse, float* cs, int64_t first, int64_t step) {
  for (int64_t f = first; f < n_freq; f += step) {
    const float ang = __fmul_rn(p, inv_freq[f]);
    double sn, cn;
    sincos(static_cast<double>(ang), &sn, &cn);
    cs[2 * f] = static_cast<float>(cn);
    const float sf = static_cast<float>(sn);
    cs[2 * f + 1] = inverse ? -sf : sf;
  }
}

}  // namespace ds41::cuda::dev
