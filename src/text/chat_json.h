// ds41 text: OpenAI-format JSON -> chat_encoding.h types. Owns the conversation file format of
// `ds41 chat-template` and the message parsing the server reuses:
//   {"messages": [...], "tools": [...], "response_format": {...},
//    "thinking_mode": "thinking" | "chat", "reasoning_effort": 1..100 | "low" | "high" | "max"}
// or a bare array of messages. Messages use OpenAI fields (role, content as string or parts,
// reasoning_content, tool_calls, tool_call_id) plus the official encoder's `task`, `wo_eos`
// and per-message `tools` / `response_format` (system messages only).
//
// Request-level tools / response_format go to message 0 when it is a system message. When it is
// not, an empty system message is inserted first. [deviation] The official encoder attaches
// them to message 0 whatever its role and then never renders them for a user message (the
// tools would be silently ignored); we prefer to render them.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "core/status.h"
#include "text/chat_encoding.h"

namespace ds41::text {

struct Conversation {
  std::vector<ChatMessage> messages;
  ChatOptions options;
};

Result<ChatMessage> chat_message_from_json(const nlohmann::ordered_json& m, size_t index);
Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages);
// Effort given as a JSON integer or string (see parse_reasoning_effort).
Result<int> reasoning_effort_from_json(const nlohmann::ordered_json& v);
Result<Conversation> conversation_from_json(const nlohmann::ordered_json& j);

}  // namespace ds41::text
