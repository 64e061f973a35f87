// ds41 server: the images of a chat request (OpenAI `image_url` content parts) -> engine
// RequestImages. Each source is resolved to bytes (a `data:` URL with base64; http(s) URLs only
// when the operator enabled them: a server must not fetch arbitrary URLs by default), decoded and
// preprocessed with the model's vision config (ds41_image), and its placeholder token in the
// prompt is expanded to the image's span of image_token_id positions (MODEL_SPEC 3.11, 6.2).
// The tower itself runs in the engine loop (the server never touches tensors). Errors are 400s
// that name the image and the problem (not base64, corrupt PNG, over the pixel limit, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "image/image_types.h"
#include "image/resize_plan.h"
#include "server/api_error.h"

namespace ds41::server {

// What the server needs of the served model's vision config; enabled only for a model with one.
struct VisionModelInfo {
  bool enabled = false;
  image::VisionPlanConfig plan;
  int32_t image_token_id = -1;  // the model's span id (config image_token_id)
  int32_t placeholder_id = -1;  // the tokenizer's id of <｜deepseek_image｜>
  std::string config_key;       // vision config digest, part of the feature-cache key
};

struct ImageInputOptions {
  bool allow_remote_urls = false;  // --allow-image-urls
  image::ImageLimits limits;       // --max-image-bytes / --max-image-pixels
  int fetch_timeout_s = 10;
};

// Decodes a data: URL's payload (";base64" required). Errors name the problem.
Result<std::vector<uint8_t>> decode_data_url(const std::string& url);

// XXH3-128 of an image's encoded bytes: the prefix cache's image key (RequestImage::content_hash).
engine::ImageContentHash image_content_hash(const std::vector<uint8_t>& bytes);
// The feature-cache key of an image: that hash in hex + "/" + the vision config digest.
std::string vision_cache_key(const std::vector<uint8_t>& bytes, const std::string& config_key);

// Resolves `sources` (ChatPrompt::images, in placeholder order) and expands the placeholders of
// `ids` in place. *image_tokens receives the span positions added.
ApiResult<std::vector<engine::RequestImage>> resolve_request_images(const std::vector<std::string>& sources,
                                                                    const VisionModelInfo& vm,
                                                                    const ImageInputOptions& opt,
                                                                    std::vector<int32_t>* ids,
                                                                    int64_t* image_tokens);

}  // namespace ds41::server
