// ds41 server: OutputRouter (see output_router.h).
#include "server/output_router.h"

#include <algorithm>

#include "text/output_parser.h"

namespace ds41::server {
namespace {

const std::string kDsmlCalls = "<" + std::string(text::kDsmlToken) + " calls>";

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

OutputRouter::OutputRouter(bool raw, bool thinking)
    : state_(raw        ? State::kRaw
             : thinking ? State::kReasoning
                        : State::kContent) {}

OutputDelta OutputRouter::push(std::string_view text) {
  OutputDelta d;
  if (state_ == State::kRaw) {
    d.content.assign(text);
    return d;
  }
  if (state_ == State::kTools) {
    tools_.append(text);
    return d;
  }
  pending_.append(text);
  route(&d);
  return d;
}

void OutputRouter::route(OutputDelta* d) {
  if (state_ == State::kReasoning) {
    const size_t end = pending_.find(text::kThinkEnd);
    if (end == std::string::npos) {
      const size_t keep = partial_suffix(pending_, text::kThinkEnd);
      d->reasoning += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    d->reasoning += pending_.substr(0, end);
    pending_.erase(0, end + text::kThinkEnd.size());
    state_ = State::kContent;
  }
  if (state_ == State::kContent) {
    const size_t at = pending_.find(kDsmlCalls);
    if (at != std::string::npos) {
      size_t cut = at;
      while (cut > 0 && is_space(pending_[cut - 1])) --cut;  // the "\n\n" before the block
      d->content += pending_.substr(0, cut);
      tools_ = pending_.substr(cut);
      pending_.clear();
      state_ = State::kTools;
      return;
    }
    size_t keep = partial_suffix(pending_, kDsmlCalls);
    while (keep < pending_.size() && is_space(pending_[pending_.size() - keep - 1])) ++keep;
    d->content += pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
  }
}

OutputDelta OutputRouter::finish() {
  OutputDelta d;
  switch (state_) {
    case State::kRaw: break;
    case State::kReasoning: d.reasoning = std::exchange(pending_, {}); break;
    case State::kContent: d.content = std::exchange(pending_, {}); break;
    case State::kTools: {
      const size_t at = tools_.find(kDsmlCalls);
      std::vector<text::ToolCall> calls;
      if (at != std::string::npos &&
          text::parse_dsml_tool_calls(std::string_view(tools_).substr(at), &calls)) {
        d.tool_calls = std::move(calls);
      } else {
        malformed_ = true;
        d.content = tools_;
      }
      tools_.clear();
      break;
    }
  }
  state_ = State::kContent;
  return d;
}

}  // namespace ds41::server
