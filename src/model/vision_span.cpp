// ds41 model: image span layout in the text stream (MODEL_SPEC 3.11; see vision_span.h).
#include "model/vision_span.h"

#include <string>

namespace ds41::model {

int64_t image_span_length(int64_t n_llm_h, int64_t n_llm_w) { return n_llm_h * (n_llm_w + 1) + 2; }

ImageSpanMarkers image_span_markers(const VisionWeights& w) {
  return {w.image_start, w.image_end, w.image_newline};
}

std::vector<float> image_span_embeddings(const ImageSpanMarkers& m, std::span<const float> aligner_out,
                                         int64_t n_llm_h, int64_t n_llm_w, int64_t H) {
  std::vector<float> out;
  out.reserve(image_span_length(n_llm_h, n_llm_w) * H);
  out.insert(out.end(), m.start.begin(), m.start.end());
  for (int64_t r = 0; r < n_llm_h; ++r) {
    out.insert(out.end(), aligner_out.begin() + r * n_llm_w * H, aligner_out.begin() + (r + 1) * n_llm_w * H);
    out.insert(out.end(), m.newline.begin(), m.newline.end());
  }
  out.insert(out.end(), m.end.begin(), m.end.end());
  return out;
}

std::vector<float> image_span_embeddings(const VisionWeights& w, std::span<const float> aligner_out,
                                         int64_t n_llm_h, int64_t n_llm_w, int64_t H) {
  return image_span_embeddings(image_span_markers(w), aligner_out, n_llm_h, n_llm_w, H);
}

Result<ImagePromptInput> place_image_spans(std::span<const int32_t> tokens, int32_t image_token_id,
                                           std::span<const std::vector<float>> spans, int64_t H) {
  ImagePromptInput p;
  p.tokens.assign(tokens.begin(), tokens.end());
  p.image_span.assign(tokens.size(), 0);
  size_t k = 0;
  for (size_t t = 0; t < tokens.size();) {
    if (tokens[t] != image_token_id) {
      ++t;
      continue;
    }
    size_t e = t;
    while (e < tokens.size() && tokens[e] == image_token_id) ++e;
    // One run may hold several adjacent images: consume spans while the run has room.
    size_t at = t;
    while (at < e) {
      if (k >= spans.size())
        return invalid_argument("image token " + std::to_string(image_token_id) + " at position " +
                                std::to_string(at) + " has no image (" + std::to_string(spans.size()) +
                                " given)");
      const size_t want = spans[k].size() / static_cast<size_t>(H);
      if (want == 0 || at + want > e)
        return invalid_argument("image " + std::to_string(k) + " needs " + std::to_string(want) +
                                " span positions, but the run of image token " +
                                std::to_string(image_token_id) + " at position " + std::to_string(at) +
                                " has " + std::to_string(e - at));
      p.span_starts.push_back(static_cast<int64_t>(at));
      p.span_embeds.insert(p.span_embeds.end(), spans[k].begin(), spans[k].end());
      for (size_t i = at; i < at + want; ++i) p.image_span[i] = 1;
      at += want;
      ++k;
    }
    t = e;
  }
  if (k != spans.size())
    return invalid_argument(std::to_string(spans.size()) + " images given, but the prompt has " +
                            std::to_string(k) + " runs of image token " + std::to_string(image_token_id));
  return p;
}

}  // namespace ds41::model
