// ds41 text: parsing of a DeepSeek-V4.1 completion into an OpenAI-style assistant message
// (MODEL_SPEC 6.2): `reasoning_content` / `content` split at `</think>`, and DSML tool calls
//   \n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="NAME">\n
//   <｜DSML｜ parameter name="KEY" string="true|false">VALUE</｜DSML｜ parameter>\n ...
//   </｜DSML｜ invoke>\n ... </｜DSML｜ calls>
// into `tool_calls` whose `arguments` is a JSON object text (string="true" values JSON-quoted,
// string="false" values copied as JSON).
//
// Robustness contract: any input (truncated, interleaved, malformed DSML, invalid UTF-8) is
// handled without crashing (invalid UTF-8 is first repaired with U+FFFD, text/utf8.h); when the DSML block
// cannot be parsed completely the whole post-reasoning text is returned as plain `content` with no tool calls
// and `tool_calls_malformed` set. [deviation] The official parser raises on such input; it also accepts a
// string="false" value that is not valid JSON, which we treat as malformed so that `arguments` is always
// valid JSON.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/chat_encoding.h"

namespace ds41::text {

struct ParsedOutput {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCall> tool_calls;   // id left empty (the server assigns ids)
  bool reasoning_complete = false;    // thinking mode: `</think>` was seen
  bool saw_eos = false;               // the EOS token text was seen (text after it is ignored)
  bool tool_calls_malformed = false;  // a DSML block was present but returned as plain text
};

// `text` is the decoded completion with special tokens kept (decode without skip_special),
// starting right after the generation header: in thinking mode the header ends with `<think>`
// so the text starts with reasoning; in chat mode it ends with `</think>`.
ParsedOutput parse_assistant_output(std::string_view text, bool thinking);

// Parses a DSML block that starts exactly at "<｜DSML｜ calls>". Returns false (and leaves
// *calls untouched) when it is not one complete well-formed block followed only by whitespace.
bool parse_dsml_tool_calls(std::string_view block, std::vector<ToolCall>* calls);

}  // namespace ds41::text
