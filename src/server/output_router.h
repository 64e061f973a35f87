// ds41 server: streaming split of a chat completion's text into reasoning_content, content and
// DSML tool calls (MODEL_SPEC 6.2; the whole-text parser is text/output_parser.h, whose rules
// this follows chunk by chunk): thinking mode starts in reasoning until `</think>`; in content, a
// `<｜DSML｜ calls>` block is buffered until the end and parsed with text::parse_dsml_tool_calls
// (a malformed block is returned as plain content, as parse_assistant_output does). Text that
// may be the start of a marker is held back so a marker is never split across deltas.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/chat_encoding.h"

namespace ds41::server {

struct OutputDelta {
  std::string reasoning;
  std::string content;
  std::vector<text::ToolCall> tool_calls;  // complete calls (ids assigned by the caller)
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class OutputRouter {
 public:
  // raw: no parsing at all (/v1/completions); otherwise chat parsing, starting in reasoning when
  // `thinking`.
  OutputRouter(bool raw, bool thinking);
  OutputDelta push(std::string_view text);
  OutputDelta finish();
  bool in_reasoning() const { return state_ == State::kReasoning; }
  bool tool_calls_malformed() const { return malformed_; }

 private:
  enum class State { kRaw, kReasoning, kContent, kTools };
  void route(OutputDelta* d);
  State state_;
  std::string pending_;  // held back (possible marker prefix, trailing whitespace)
  std::string tools_;    // the DSML block so far
  bool malformed_ = false;
};

}  // namespace ds41::server
