// ds41 engine: CacheKeyInput (cache_key_input.h).
#include "engine/cache_key_input.h"

namespace ds41::engine {

bool CacheKeyInput::has_image_in(int64_t begin, int64_t end) const {
  for (const kvcache::ImageSpanKey& im : images)
    if (im.start < end && im.start + im.length > begin) return true;
  return false;
}

std::optional<std::vector<kvcache::ImageSpanKey>> image_span_keys(const std::vector<RequestImage>& images) {
  std::vector<kvcache::ImageSpanKey> out;
  out.reserve(images.size());
  for (const RequestImage& im : images) {
    if (!im.content_hash) return std::nullopt;
    out.push_back(
        kvcache::ImageSpanKey{im.span_start, im.span_length, im.content_hash->hi, im.content_hash->lo});
  }
  return out;
}

}  // namespace ds41::engine
