// ds41 server: the consumer side of one generation — TokenEvents in, visible text out. Owns the
// incremental detokenization (text/incremental_decoder.h), consumer-side stop strings
// (stop_matcher.h), the reasoning/content/tool-call split (output_router.h), logprobs in text
// form and the usage counts. Runs on the client's thread, never on the step loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/output_router.h"
#include "server/stop_matcher.h"
#include "text/incremental_decoder.h"
#include "text/tokenizer.h"

namespace ds41::server {

struct ConsumerOptions {
  bool raw = false;       // /v1/completions: no reasoning/tool parsing
  bool thinking = false;  // chat: the prompt ends with <think>
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // not rendered when they end the stream
  int64_t prompt_tokens = 0;            // known before the final event (a stop string may end early)
  bool logprobs = false;                // collect per-token logprobs (top_logprobs >= 0)
};

struct TokenLogprobText {
  int32_t token = 0;
  std::string text;  // the token's bytes (may be a partial UTF-8 character)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

struct ConsumerUpdate {
  OutputDelta delta;
  std::vector<TokenLogprobText> logprobs;
  bool done = false;
  std::string finish_reason;  // when done: stop / length / tool_calls / abort / error
  std::string error;          // finish_reason == "error"
};

class CompletionConsumer {
 public:
  // `tok` must outlive the consumer.
  CompletionConsumer(const text::Tokenizer& tok, ConsumerOptions opts);
  // Feeds the events read from the stream. When a stop string matches the update is final and
  // the caller cancels the stream (events after it are ignored).
  ConsumerUpdate consume(const std::vector<engine::TokenEvent>& events);
  bool done() const { return done_; }
  bool stop_matched() const { return stops_.matched(); }

  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  const engine::CacheUsage& cache_usage() const { return cache_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t reasoning_tokens() const { return reasoning_tokens_; }

 private:
  void append(ConsumerUpdate* u, OutputDelta d);
  void finish(ConsumerUpdate* u, engine::FinishReason r, const std::string& error);

  const text::Tokenizer* tok_;
  ConsumerOptions opts_;
  text::IncrementalDecoder decoder_;
  StopMatcher stops_;
  OutputRouter router_;
  int32_t eos_id_ = -1;
  bool done_ = false;
  bool any_tool_calls_ = false;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, reasoning_tokens_ = 0;
  engine::CacheUsage cache_;
};

}  // namespace ds41::server
