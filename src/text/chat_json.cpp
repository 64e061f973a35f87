// ds41 text: OpenAI JSON -> chat messages (see chat_json.h).
#include "text/chat_json.h"

namespace ds41::text {
namespace {

std::string at(size_t i) { return "messages[" + std::to_string(i) + "]"; }

Result<std::string> optional_string(const nlohmann::ordered_json& m, const char* key, size_t i) {
  if (!m.contains(key) || m[key].is_null()) return std::string();
  if (!m[key].is_string()) return invalid_argument(at(i) + "." + key + " must be a string");
  return m[key].get<std::string>();
}

Result<std::vector<ContentPart>> parts_from_json(const nlohmann::ordered_json& arr, size_t i, int depth);

Result<ContentPart> part_from_json(const nlohmann::ordered_json& b, size_t i, int depth) {
  if (b.is_string())
    return ContentPart{ContentPart::Type::kText, b.get<std::string>(), "", "", std::nullopt, ""};
  if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
    return invalid_argument(at(i) + ".content: every part needs a string 'type'");
  const std::string type = b["type"].get<std::string>();
  ContentPart p;
  if (type == "text") {
    p.type = ContentPart::Type::kText;
    if (!b.contains("text") || !b["text"].is_string())
      return invalid_argument(at(i) + ".content: text part without 'text'");
    p.text = b["text"].get<std::string>();
  } else if (type == "image_url" || type == "image") {
    p.type = ContentPart::Type::kImage;
    if (type == "image_url" && b.contains("image_url")) {
      const auto& u = b["image_url"];
      if (u.is_string())
        p.image_source = u.get<std::string>();
      else if (u.is_object() && u.contains("url") && u["url"].is_string())
        p.image_source = u["url"].get<std::string>();
    } else {
      for (const char* k : {"source", "url", "data"}) {
        if (!b.contains(k) || b[k].is_null()) continue;
        p.image_source = b[k].is_string() ? b[k].get<std::string>() : b[k].dump();
        if (!p.image_source.empty()) break;
      }
    }
    // An empty source is reported by encode_chat with the message index.
  } else if (type == "tool_result") {
    p.type = ContentPart::Type::kToolResult;
    if (b.contains("tool_use_id") && b["tool_use_id"].is_string())
      p.tool_call_id = b["tool_use_id"].get<std::string>();
    if (b.contains("content") && b["content"].is_array()) {
      if (depth > 0) return invalid_argument(at(i) + ".content: nested tool_result");
      DS41_ASSIGN_OR_RETURN(auto inner, parts_from_json(b["content"], i, depth + 1));
      p.tool_content = std::move(inner);
    } else if (b.contains("content") && b["content"].is_string()) {
      p.text = b["content"].get<std::string>();
    }
  } else {
    p.type = ContentPart::Type::kOther;
    p.other_type = type;
  }
  return p;
}

Result<std::vector<ContentPart>> parts_from_json(const nlohmann::ordered_json& arr, size_t i, int depth) {
  std::vector<ContentPart> out;
  for (const auto& b : arr) {
    DS41_ASSIGN_OR_RETURN(ContentPart p, part_from_json(b, i, depth));
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

Result<int> reasoning_effort_from_json(const nlohmann::ordered_json& v) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    const int64_t x = v.is_number_unsigned()
                          ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), 1000))
                          : v.get<int64_t>();
    if (x < 1 || x > 100)
      return invalid_argument("invalid reasoning effort " + std::to_string(x) +
                              ": expected an integer 1..100 or one of low (50), high (75), max (100)");
    return static_cast<int>(x);
  }
  if (v.is_string()) return parse_reasoning_effort(v.get<std::string>());
  return invalid_argument("invalid reasoning effort " + v.dump() +
                          ": expected an integer 1..100 or one of low (50), high (75), max (100)");
}

Result<ChatMessage> chat_message_from_json(const nlohmann::ordered_json& m, size_t i) {
  if (!m.is_object()) return invalid_argument(at(i) + " is not an object");
  if (!m.contains("role") || !m["role"].is_string()) return invalid_argument(at(i) + " has no string 'role'");
  const std::string role = m["role"].get<std::string>();
  ChatMessage msg;
  if (role == "system")
    msg.role = ChatRole::kSystem;
  else if (role == "user")
    msg.role = ChatRole::kUser;
  else if (role == "assistant")
    msg.role = ChatRole::kAssistant;
  else if (role == "tool")
    msg.role = ChatRole::kTool;
  else if (role == "latest_reminder")
    msg.role = ChatRole::kLatestReminder;
  else
    return invalid_argument(at(i) + ".role '" + role +
                            "' is not one of system, user, assistant, tool, latest_reminder");

  if (m.contains("content") && m["content"].is_array()) {
    DS41_ASSIGN_OR_RETURN(auto parts, parts_from_json(m["content"], i, 0));
    msg.parts = std::move(parts);
  } else {
    DS41_ASSIGN_OR_RETURN(msg.content, optional_string(m, "content", i));
  }
  if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
    if (!m["reasoning_content"].is_string())
      return invalid_argument(at(i) + ".reasoning_content must be a string");
    msg.reasoning_content = m["reasoning_content"].get<std::string>();
  }
  DS41_ASSIGN_OR_RETURN(msg.tool_call_id, optional_string(m, "tool_call_id", i));
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (!m["tool_calls"].is_array()) return invalid_argument(at(i) + ".tool_calls must be an array");
    size_t k = 0;
    for (const auto& tc : m["tool_calls"]) {
      const std::string w = at(i) + ".tool_calls[" + std::to_string(k++) + "]";
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
        return invalid_argument(w + " has no 'function' object");
      ToolCall call;
      if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"].get<std::string>();
      const auto& f = tc["function"];
      if (f.contains("name") && f["name"].is_string()) call.name = f["name"].get<std::string>();
      if (f.contains("arguments")) {
        call.arguments =
            f["arguments"].is_string() ? f["arguments"].get<std::string>() : f["arguments"].dump();
      }
      msg.tool_calls.push_back(std::move(call));
    }
  }
  if (m.contains("tools")) msg.tools = m["tools"];
  if (m.contains("response_format")) msg.response_format = m["response_format"];
  if (m.contains("task") && !m["task"].is_null()) {
    if (!m["task"].is_string()) return invalid_argument(at(i) + ".task must be a string");
    msg.task = m["task"].get<std::string>();
  }
  if (m.contains("wo_eos")) {
    if (!m["wo_eos"].is_boolean()) return invalid_argument(at(i) + ".wo_eos must be a boolean");
    msg.wo_eos = m["wo_eos"].get<bool>();
  }
  return msg;
}

Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return invalid_argument("'messages' must be an array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    DS41_ASSIGN_OR_RETURN(ChatMessage m, chat_message_from_json(messages[i], i));
    out.push_back(std::move(m));
  }
  return out;
}

Result<Conversation> conversation_from_json(const nlohmann::ordered_json& j) {
  Conversation c;
  const nlohmann::ordered_json* msgs = &j;
  if (j.is_object()) {
    if (!j.contains("messages")) return invalid_argument("conversation object has no 'messages'");
    msgs = &j["messages"];
  }
  DS41_ASSIGN_OR_RETURN(c.messages, chat_messages_from_json(*msgs));
  if (!j.is_object()) return c;
  if (j.contains("thinking_mode") && !j["thinking_mode"].is_null()) {
    const auto& t = j["thinking_mode"];
    if (t == "thinking")
      c.options.thinking = true;
    else if (t == "chat")
      c.options.thinking = false;
    else
      return invalid_argument("thinking_mode must be \"thinking\" or \"chat\", got " + t.dump());
  }
  if (j.contains("reasoning_effort") && !j["reasoning_effort"].is_null()) {
    DS41_ASSIGN_OR_RETURN(c.options.reasoning_effort, reasoning_effort_from_json(j["reasoning_effort"]));
  }
  const bool has_tools = j.contains("tools") && !j["tools"].is_null() && !j["tools"].empty();
  const bool has_rf =
      j.contains("response_format") && !j["response_format"].is_null() && !j["response_format"].empty();
  if (has_tools || has_rf) {
    if (c.messages.empty() || c.messages[0].role != ChatRole::kSystem) {
      ChatMessage sys;
      sys.role = ChatRole::kSystem;
      c.messages.insert(c.messages.begin(), std::move(sys));
    }
    if (has_tools) c.messages[0].tools = j["tools"];
    if (has_rf) c.messages[0].response_format = j["response_format"];
  }
  return c;
}

}  // namespace ds41::text
