// ds41 server: CompletionConsumer (see completion_consumer.h).
#include "server/completion_consumer.h"

#include <algorithm>

namespace ds41::server {

CompletionConsumer::CompletionConsumer(const text::Tokenizer& tok, ConsumerOptions opts)
    : tok_(&tok),
      opts_(std::move(opts)),
      decoder_(tok, /*skip_special=*/false),
      stops_(opts_.stop),
      router_(opts_.raw, opts_.thinking) {
  if (auto id = tok.token_to_id(text::kEosToken)) eos_id_ = *id;
  prompt_tokens_ = opts_.prompt_tokens;
}

void CompletionConsumer::append(ConsumerUpdate* u, OutputDelta d) {
  u->delta.reasoning += d.reasoning;
  u->delta.content += d.content;
  for (auto& c : d.tool_calls) u->delta.tool_calls.push_back(std::move(c));
}

void CompletionConsumer::finish(ConsumerUpdate* u, engine::FinishReason r, const std::string& error) {
  append(u, router_.push(stops_.push(decoder_.flush())));
  append(u, router_.push(stops_.flush()));
  OutputDelta last = router_.finish();
  any_tool_calls_ = any_tool_calls_ || !last.tool_calls.empty();
  append(u, std::move(last));
  done_ = true;
  u->done = true;
  if (stops_.matched()) {
    u->finish_reason = "stop";
    return;
  }
  switch (r) {
    case engine::FinishReason::kLength: u->finish_reason = "length"; break;
    case engine::FinishReason::kAbort: u->finish_reason = "abort"; break;
    case engine::FinishReason::kError:
      u->finish_reason = "error";
      u->error = error.empty() ? "generation failed" : error;
      break;
    default: u->finish_reason = any_tool_calls_ ? "tool_calls" : "stop"; break;
  }
}

ConsumerUpdate CompletionConsumer::consume(const std::vector<engine::TokenEvent>& events) {
  ConsumerUpdate u;
  if (done_) return u;
  for (const engine::TokenEvent& ev : events) {
    const bool final = ev.finish != engine::FinishReason::kNone;
    if (final) {
      if (ev.prompt_tokens > 0) prompt_tokens_ = ev.prompt_tokens;
      cached_tokens_ = ev.cached_tokens;
      cache_ = ev.cache;
    }
    if (ev.token >= 0) {
      ++completion_tokens_;
      if (router_.in_reasoning()) ++reasoning_tokens_;
      const bool terminator =
          final && ev.finish == engine::FinishReason::kStop &&
          (ev.token == eos_id_ || std::find(opts_.stop_token_ids.begin(), opts_.stop_token_ids.end(),
                                            ev.token) != opts_.stop_token_ids.end());
      if (!terminator) {
        Result<std::string> piece = decoder_.push(ev.token);
        if (piece.ok()) append(&u, router_.push(stops_.push(piece.value())));
      }
      if (opts_.logprobs) {
        TokenLogprobText lp;
        lp.token = ev.token;
        lp.text = std::string(tok_->token_bytes(ev.token));
        lp.logprob = ev.logprob;
        for (const auto& t : ev.top) lp.top.emplace_back(std::string(tok_->token_bytes(t.token)), t.logprob);
        u.logprobs.push_back(std::move(lp));
      }
      if (stops_.matched()) {
        finish(&u, engine::FinishReason::kStop, "");
        return u;
      }
    }
    if (final) {
      finish(&u, ev.finish, ev.error);
      return u;
    }
  }
  return u;
}

}  // namespace ds41::server
