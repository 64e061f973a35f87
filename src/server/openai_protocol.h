// ds41 server: typed OpenAI request bodies for POST /v1/chat/completions and /v1/completions,
// parsed and validated from JSON. Every malformed body becomes an ApiError (400, with the field
// in `param`); nothing here throws, allocates without bound, or knows about HTTP or the engine's
// limits beyond the numbers passed in ParseLimits.
//
// Documented choices (README "Server"):
//   - unknown top-level fields are ignored (clients send vendor extensions);
//   - `n` must be 1; `best_of` is not supported;
//   - thinking defaults to the chat encoding's default (text::ChatOptions, thinking on) and is
//     switched by chat_template_kwargs.thinking / .enable_thinking (vLLM / SGLang spelling);
//   - reasoning_effort: "low" | "high" | "max" or an integer 1..100 (MODEL_SPEC 6.2);
//   - response_format json_object / json_schema is best effort: the schema (or the request for a
//     JSON object) is rendered into the system prompt, the output is not constrained;
//   - tool_choice "required" renders the tools like "auto" (not enforced); a named choice renders
//     only that tool; "none" renders no tools.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "server/api_error.h"
#include "text/chat_encoding.h"

namespace ds41::server {

inline constexpr int kMaxTopLogprobs = 20;
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr int kMaxJsonDepth = 64;

// Fields shared by both endpoints.
struct CommonParams {
  std::string model;
  engine::SamplingParams sampling;    // seed, penalties, top_logprobs (-1: none) included
  std::optional<int64_t> max_tokens;  // max_completion_tokens wins over max_tokens
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM extension
  bool ignore_eos = false;              // vLLM extension
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
};

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

struct ChatCompletionRequest {
  CommonParams common;
  std::vector<text::ChatMessage> messages;
  nlohmann::ordered_json tools;  // null when none; after tool_choice filtering
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_choice_name;         // kNamed
  std::optional<bool> thinking;         // unset: the encoding's default
  std::optional<int> reasoning_effort;  // 1..100
  bool logprobs = false;
  nlohmann::ordered_json response_format;  // null, or what the system prompt renders
};

struct CompletionPrompt {
  std::optional<std::string> text;  // a string prompt, or
  std::vector<int32_t> ids;         // a token-id prompt
};

struct CompletionRequest {
  CommonParams common;
  std::vector<CompletionPrompt> prompts;  // one choice per prompt (a batch)
  bool echo = false;
};

struct ParseLimits {
  size_t max_batch_prompts = 64;  // /v1/completions prompt batch size
};

// Parses JSON text with a nesting bound; a syntax error or a non-object is a 400.
ApiResult<nlohmann::ordered_json> parse_json_object(std::string_view body);

ApiResult<ChatCompletionRequest> parse_chat_request(std::string_view body, const ParseLimits& lim = {});
ApiResult<CompletionRequest> parse_completion_request(std::string_view body, const ParseLimits& lim = {});

}  // namespace ds41::server
