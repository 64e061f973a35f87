// ds41 engine: the sampling seam the engine loop calls (issue 12). A small self-contained
// greedy / temperature / top-k / top-p / min-p sampler so the loop works on its own; the shared
// sampler (src/engine/sampler.h) replaces it at merge. Keep this file small and isolated.
//
// Determinism: the draw depends only on the logits row, the params and the request's own Rng
// (seeded from the request's seed), never on what else is batched.
#pragma once

#include <cstdint>
#include <random>

#include "engine/request.h"

namespace ds41::engine {

using Rng = std::mt19937_64;

// temperature 0 (or top_k 1): greedy, lowest id among equal maxima (no draw). Otherwise
// softmax(logits / T) restricted to p >= min_p * p_max, then to the top_k largest (ties by lower
// id), then to the smallest top_p nucleus in descending order; one uniform draw from rng.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng);

}  // namespace ds41::engine
