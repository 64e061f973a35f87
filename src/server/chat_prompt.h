// ds41 server: a validated chat request -> prompt token ids (the chat encoding of MODEL_SPEC 6.2,
// then the tokenizer). One place, so the server, /tokenize and `ds41 chat` build the same prompt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "text/tokenizer.h"

namespace ds41::server {

// Request-level tools and response_format go to a system message first (inserted when message
// 0 is not one). *thinking (optional) receives the mode used: the request's, else
// `default_thinking`. Encoding errors (e.g. a tool call without a name) are 400s.
// *images (optional) receives the image sources in placeholder order (each placeholder is one
// <｜deepseek_image｜> token in the ids; image_inputs.h expands them).
ApiResult<std::vector<int32_t>> build_chat_prompt(const ChatCompletionRequest& req,
                                                  const text::Tokenizer& tok, bool default_thinking,
                                                  bool* thinking, std::vector<std::string>* images = nullptr);

}  // namespace ds41::server
