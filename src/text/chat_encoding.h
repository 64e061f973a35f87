// ds41 text: DeepSeek-V4.1 prompt encoding (MODEL_SPEC 6.2; the official `encoding.py` is the
// reference where the spec is silent). Owns the message model (system / user / assistant /
// tool / latest_reminder), the pre-processing rules (image blocks -> placeholders, tool results
// merged into user turns in call order, reasoning of earlier turns dropped unless tools are
// declared) and the rendering into one prompt string plus the byte ranges that are template
// markup. Tokenize with chat_prompt_ids(): added/special token strings are tokens only inside
// the markup, so text inside message content cannot inject control tokens (the reference
// encoding and HF tokenizers parse them everywhere; ChatOptions::parse_special_in_content
// restores that).
//
// JSON conversion (OpenAI chat format) lives in chat_json.h.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace ds41::text {

// Token strings of MODEL_SPEC 6.1 used by the template.
inline constexpr std::string_view kBosToken = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEosToken = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kSystemToken = "<｜System｜>";
inline constexpr std::string_view kUserToken = "<｜User｜>";
inline constexpr std::string_view kAssistantToken = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsmlToken = "｜DSML｜";
inline constexpr std::string_view kLatestReminderToken = "<｜latest_reminder｜>";
inline constexpr std::string_view kImageToken = "<｜deepseek_image｜>";

enum class ChatRole { kSystem, kUser, kAssistant, kTool, kLatestReminder };
const char* chat_role_name(ChatRole r);

struct ContentPart {
  enum class Type { kText, kImage, kToolResult, kOther };
  Type type = Type::kText;
  std::string text;          // kText
  std::string image_source;  // kImage: URL, data URI or source reference (for the vision pipeline)
  std::string tool_call_id;  // kToolResult
  // kToolResult: the result's content, either a string (in `text`) or a list of parts.
  std::optional<std::vector<ContentPart>> tool_content;
  std::string other_type;  // kOther: the block's type name, rendered "[Unsupported TYPE]"
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text (OpenAI `function.arguments`)
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;                            // string content
  std::optional<std::vector<ContentPart>> parts;  // array content (takes precedence)
  std::optional<std::string> reasoning_content;   // assistant
  std::vector<ToolCall> tool_calls;               // assistant
  std::string tool_call_id;                       // tool
  nlohmann::ordered_json tools;                   // system: OpenAI `tools` array (null = none)
  nlohmann::ordered_json response_format;         // system: JSON schema object (null = none)
  std::optional<std::string> task;                // action/query/authority/domain/title/read_url
  bool wo_eos = false;                            // assistant: no EOS (continue a prefix)
};

// Reasoning effort budget (MODEL_SPEC 6.2): integer 1..100 or tier low=50, high=75, max=100.
inline constexpr int kDefaultReasoningEffort = 75;
// Accepts "low", "high", "max" or a decimal integer 1..100; anything else is InvalidArgument.
Result<int> parse_reasoning_effort(std::string_view s);

struct ChatOptions {
  bool thinking = true;                            // thinking mode (else chat mode)
  int reasoning_effort = kDefaultReasoningEffort;  // 1..100; used only in thinking mode
  bool add_bos = true;                             // false when continuing a context
  bool drop_thinking = true;                       // drop reasoning of turns before the last user turn
  // false (default): added/special token strings inside anything that is data rather than
  // template — every role's content, reasoning, tool results, tool call names and arguments,
  // tool schemas, response formats — are tokenized as plain text. true: they become tokens, as
  // in the reference encoding.py + HF tokenizer (trusted input only: a user could end a turn
  // with a typed "<｜end▁of▁sentence｜>" or open an assistant turn).
  bool parse_special_in_content = false;
};

struct ChatPrompt {
  std::string text;                 // the prompt string (special tokens as text)
  std::vector<std::string> images;  // image sources, in placeholder order
  // Sorted, disjoint byte ranges of `text` in which added tokens are matched: the template's
  // own markup, or all of `text` with parse_special_in_content. Tokenizer::encode(text) alone
  // ignores them and parses special strings everywhere (the reference behaviour).
  std::vector<TextRange> special_ranges;
};

// Renders `messages` (MODEL_SPEC 6.2). Errors (InvalidArgument) name the message index and
// field: unknown task, effort out of range, tools outside a system message, image placeholder
// typed into text, image block without a source, tool call without a name, empty conversation.
Result<ChatPrompt> encode_chat(const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The prompt's token ids: `prompt.text` with added tokens matched only inside
// `prompt.special_ranges`.
std::vector<int32_t> chat_prompt_ids(const Tokenizer& tokenizer, const ChatPrompt& prompt);

// The "## Tools" system-prompt block for OpenAI-format `tools` (exposed for tests).
Result<std::string> render_tools_block(const nlohmann::ordered_json& tools);
// DSML text of assistant tool calls as written in history: "\n\n<｜DSML｜ calls>\n...".
std::string render_tool_calls(const std::vector<ToolCall>& calls);

}  // namespace ds41::text
