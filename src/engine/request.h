// ds41 engine: what a client asks the engine loop for (token ids in, token events out). The
// server turns OpenAI requests into GenerationRequest (after the chat encoding) and reads
// TokenEvents back; detokenization, stop strings and DSML parsing happen on the consumer's side
// of the queue (never on the step loop). No JSON here (ARCHITECTURE.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "image/preprocess.h"

namespace ds41::engine {

struct SamplingParams {
  double temperature = 1.0;         // 0: greedy (lowest id among equal maxima)
  double top_p = 1.0;               // (0, 1]
  int64_t top_k = 0;                // 0: off
  double min_p = 0.0;               // [0, 1]
  std::optional<uint64_t> seed;     // unset: drawn from the loop's seed source
  double presence_penalty = 0.0;    // [-2, 2], OpenAI semantics, over generated tokens
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // > 0, vLLM/HF semantics, over prompt + generated tokens
  int top_logprobs = -1;            // -1: no logprobs; 0..20: sampled token's logprob + top N
};

// One image of a prompt (MODEL_SPEC 3.11): decoded and preprocessed by the submitter; the engine
// loop turns it into span embeddings (feature cache, else Engine::encode_images) before the
// request's first prefill step. The prompt holds image_token_id over [span_start, +span_length).
// content_hash names the image in the prefix cache's keys (docs/formats/kv_block.md "Prompts with
// images"): a request with an image that has none does not use the prefix cache.
struct ImageContentHash {
  uint64_t hi = 0, lo = 0;  // XXH3-128 of the encoded image bytes
  bool operator==(const ImageContentHash&) const = default;
};
struct RequestImage {
  std::string cache_key;  // image bytes' hash + vision config (vision_cache_key); empty: never cached
  std::shared_ptr<const image::PreparedImage> prepared;  // may be null when cache_key is cached
  int64_t span_start = 0, span_length = 0;
  std::optional<ImageContentHash> content_hash;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids (after the chat template)
  SamplingParams sampling;
  int64_t max_tokens = 16;              // generated tokens at most (>= 1)
  std::vector<int32_t> stop_token_ids;  // besides EOS (unless ignore_eos)
  bool ignore_eos = false;
  std::string request_id;            // for logs and metrics
  std::vector<RequestImage> images;  // in prompt order; spans disjoint
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};

// Where a request's cached prompt tokens came from (prefix cache, issue 13); on the final event.
struct CacheUsage {
  bool enabled = false;                                         // the server runs with a prefix cache
  int64_t engine_tokens = 0, dram_tokens = 0, disk_tokens = 0;  // full blocks by tier
  int64_t snapshot_tokens = 0;  // the partial last block, from the SWA snapshot
  std::string swa = "none";     // none | restored | replayed | recomputed
};

// One generated token, or the end of the stream (finish != kNone; token = -1 when the stream ends
// without a token, e.g. abort or error).
struct TokenEvent {
  int32_t token = -1;
  float logprob = 0;            // when requested
  std::vector<TopLogprob> top;  // when requested
  FinishReason finish = FinishReason::kNone;
  std::string error;          // finish == kError: what went wrong
  int64_t prompt_tokens = 0;  // on the final event
  int64_t cached_tokens = 0;  // on the final event: prompt tokens restored from the prefix cache
  CacheUsage cache;           // on the final event
};

}  // namespace ds41::engine
