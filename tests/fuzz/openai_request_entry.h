// The fuzz entry point shared by the libFuzzer target (fuzz_openai_request.cpp) and the CI replay
// test (openai_replay/): one body through both OpenAI request parsers/validators
// (server::parse_chat_request, server::parse_completion_request), then the invariants every
// caller relies on. Returns an empty string when they hold, else what broke (the fuzzer aborts on
// it, the replay test fails with it). Must never crash, hang or throw on any input.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/openai_protocol.h"

namespace ds41::fuzz {

inline std::string check_error(const server::ApiError& e, const char* which) {
  if (e.http_status != 400)
    return std::string(which) + ": status " + std::to_string(e.http_status) + " for bad input";
  if (e.message.empty()) return std::string(which) + ": rejection without a message";
  // The error body must serialize (the message may quote the input: invalid UTF-8 included).
  if (server::json_text(server::error_body(e)).empty()) return std::string(which) + ": empty error body";
  return {};
}

inline std::string check_common(const server::CommonParams& c, const char* which) {
  const engine::SamplingParams& s = c.sampling;
  const std::string w = which;
  if (!(s.temperature >= 0 && s.temperature <= 2)) return w + ": temperature out of range accepted";
  if (!(s.top_p > 0 && s.top_p <= 1)) return w + ": top_p out of range accepted";
  if (s.top_k < 0) return w + ": negative top_k accepted";
  if (!(s.min_p >= 0 && s.min_p <= 1)) return w + ": min_p out of range accepted";
  if (!(std::fabs(s.presence_penalty) <= 2 && std::fabs(s.frequency_penalty) <= 2))
    return w + ": penalty out of range accepted";
  if (!(s.repetition_penalty > 0 && std::isfinite(s.repetition_penalty)))
    return w + ": repetition_penalty <= 0";
  if (s.top_logprobs > server::kMaxTopLogprobs || s.top_logprobs < -1)
    return w + ": top_logprobs out of range";
  if (c.max_tokens && *c.max_tokens < 1) return w + ": max_tokens < 1 accepted";
  if (c.stop.size() > server::kMaxStopStrings) return w + ": too many stop strings accepted";
  for (const std::string& st : c.stop)
    if (st.empty()) return w + ": empty stop string accepted";
  for (int32_t t : c.stop_token_ids)
    if (t < 0) return w + ": negative stop token id accepted";
  return {};
}

inline std::string fuzz_openai_request(std::string_view body) {
  auto chat = server::parse_chat_request(body);
  if (!chat.ok()) {
    if (std::string e = check_error(chat.error(), "chat"); !e.empty()) return e;
  } else {
    const server::ChatCompletionRequest& r = chat.value();
    if (std::string e = check_common(r.common, "chat"); !e.empty()) return e;
    if (r.messages.empty()) return "chat: no messages accepted";
    if (r.reasoning_effort && (*r.reasoning_effort < 1 || *r.reasoning_effort > 100))
      return "chat: reasoning_effort out of range";
    if (!r.tools.is_null() && !r.tools.is_array()) return "chat: tools not an array";
  }
  server::ParseLimits lim;
  lim.max_batch_prompts = 8;
  auto cmpl = server::parse_completion_request(body, lim);
  if (!cmpl.ok()) {
    if (std::string e = check_error(cmpl.error(), "completion"); !e.empty()) return e;
  } else {
    const server::CompletionRequest& r = cmpl.value();
    if (std::string e = check_common(r.common, "completion"); !e.empty()) return e;
    if (r.prompts.empty()) return "completion: no prompt accepted";
    if (r.prompts.size() > lim.max_batch_prompts) return "completion: batch over the limit accepted";
    for (const server::CompletionPrompt& p : r.prompts)
      for (int32_t t : p.ids)
        if (t < 0) return "completion: negative token id accepted";
    if (r.common.stream && r.prompts.size() > 1) return "completion: streamed batch accepted";
  }
  return {};
}

}  // namespace ds41::fuzz
