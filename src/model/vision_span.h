// ds41 model: an image's span in the text stream (MODEL_SPEC 3.11): image_start, then per aligner
// row n_llm_w aligner outputs followed by image_newline, then image_end — n_llm_h * (n_llm_w + 1)
// + 2 positions, every one carrying image_token_id in the id stream and flagged as a span position
// (router bias_vl, Engram DEAD). The embeddings replace the token embeddings of those positions
// (SequenceInput::span_embeds).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/vision_weights.h"

namespace ds41::model {

int64_t image_span_length(int64_t n_llm_h, int64_t n_llm_w);

// The three delimiter rows of a span ([hidden] each; MODEL_SPEC 2.2).
struct ImageSpanMarkers {
  std::span<const float> start, end, newline;
};
ImageSpanMarkers image_span_markers(const VisionWeights& w);

// [image_span_length, hidden] rows for one image from its aligner rows [n_llm_h * n_llm_w, hidden].
std::vector<float> image_span_embeddings(const ImageSpanMarkers& m, std::span<const float> aligner_out,
                                         int64_t n_llm_h, int64_t n_llm_w, int64_t hidden);
std::vector<float> image_span_embeddings(const VisionWeights& w, std::span<const float> aligner_out,
                                         int64_t n_llm_h, int64_t n_llm_w, int64_t hidden);

// A prompt with images, ready for SequenceInput: token ids, span flags and the span rows in order.
struct ImagePromptInput {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> image_span;  // 1 on span positions
  std::vector<float> span_embeds;   // [sum of span lengths, hidden]
  std::vector<int64_t> span_starts;
};

// Fills the runs of image_token_id in `tokens` with the images' spans in order (the k-th image the
// k-th span; a run may hold several adjacent spans, which must fill it exactly). Errors name the
// position and the expected length.
Result<ImagePromptInput> place_image_spans(std::span<const int32_t> tokens, int32_t image_token_id,
                                           std::span<const std::vector<float>> spans, int64_t hidden);

}  // namespace ds41::model
