// ds41 text: DeepSeek-V4.1 prompt encoding (see chat_encoding.h). Rule-by-rule comments cite
// MODEL_SPEC 6.2; where the spec is silent, the behaviour follows the official encoding.py
// (read via a vendored copy in ztxz16/fastllm tools/fastllm_pytools/encoding_dsv41.py) and is
// marked "[encoding.py]".
#include "text/chat_encoding.h"

#include <algorithm>
#include <charconv>
#include <unordered_map>

#include "text/python_json.h"

namespace ds41::text {
namespace {

// [encoding.py] The system-prompt text that declares tools. The DSML tag names have a leading
// space ("<｜DSML｜ calls>") in V4.1.
constexpr std::string_view kToolsTemplateHead = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜ calls>" block like the following:

<｜DSML｜ calls>
<｜DSML｜ invoke name="$TOOL_NAME">
<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>
...
</｜DSML｜ invoke>
<｜DSML｜ invoke name="$TOOL_NAME2">
...
</｜DSML｜ invoke>
</｜DSML｜ calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)";
constexpr std::string_view kToolsTemplateTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
// [encoding.py] Response-format block appended to a system message.
constexpr std::string_view kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// [encoding.py] Task tokens (MODEL_SPEC 6.1 table).
const std::unordered_map<std::string, std::string_view>& task_tokens() {
  static const std::unordered_map<std::string, std::string_view> k = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return k;
}

// Prompt text under construction: what the template writes (markup, where added tokens may be
// matched) and what comes from the conversation (data, always plain text).
class PromptText {
 public:
  void markup(std::string_view s) {
    if (s.empty()) return;
    const size_t b = text_.size();
    text_ += s;
    if (!markup_.empty() && markup_.back().end == b)
      markup_.back().end = text_.size();
    else
      markup_.push_back({b, text_.size()});
  }
  void data(std::string_view s) { text_ += s; }
  void append(const PromptText& o) {
    const size_t shift = text_.size();
    text_ += o.text_;
    for (const TextRange& r : o.markup_) {
      if (!markup_.empty() && markup_.back().end == r.begin + shift)
        markup_.back().end = r.end + shift;
      else
        markup_.push_back({r.begin + shift, r.end + shift});
    }
  }
  const std::string& text() const { return text_; }
  const std::vector<TextRange>& markup_ranges() const { return markup_; }

 private:
  std::string text_;
  std::vector<TextRange> markup_;
};

PromptText data_text(std::string_view s) {
  PromptText t;
  t.data(s);
  return t;
}

bool json_truthy(const nlohmann::ordered_json& v) {
  if (v.is_null()) return false;
  if (v.is_array() || v.is_object() || v.is_string()) return !v.empty();
  if (v.is_boolean()) return v.get<bool>();
  return true;
}

struct Block {
  enum Kind { kText, kToolResult } kind = kText;
  PromptText text;  // text, or the tool result's content
  std::string tool_use_id;
};

// One message after pre-processing (tool messages already merged into user turns).
struct Turn {
  ChatRole role = ChatRole::kUser;
  PromptText content;
  std::vector<Block> blocks;  // user turns only
  std::optional<std::string> reasoning;
  std::vector<ToolCall> tool_calls;
  const nlohmann::ordered_json* tools = nullptr;
  const nlohmann::ordered_json* response_format = nullptr;
  std::optional<std::string> task;
  bool wo_eos = false;
};

std::string where(size_t i, const char* field) { return "message " + std::to_string(i) + " " + field; }

// Replaces image parts by placeholder text parts, collecting their sources (in order).
Status process_images(std::vector<ContentPart>* parts, size_t msg_index, std::vector<std::string>* images) {
  for (auto& p : *parts) {
    switch (p.type) {
      case ContentPart::Type::kImage:
        if (p.image_source.empty())
          return invalid_argument(where(msg_index, "content") + ": image block without a source");
        images->push_back(p.image_source);  // stays kImage: rendered as the placeholder token
        break;
      case ContentPart::Type::kText:
        if (p.text.find(kImageToken) != std::string::npos)
          return invalid_argument(where(msg_index, "content") + ": text block contains the image token " +
                                  std::string(kImageToken) + "; send images as image content blocks");
        break;
      case ContentPart::Type::kToolResult:
        if (p.tool_content) DS41_RETURN_IF_ERROR(process_images(&*p.tool_content, msg_index, images));
        break;
      case ContentPart::Type::kOther: break;
    }
  }
  return ok_status();
}

// Text of one part after process_images: an image placeholder is markup, text is data.
void append_part_text(const ContentPart& p, PromptText* out) {
  if (p.type == ContentPart::Type::kImage)
    out->markup(kImageToken);
  else
    out->data(p.text);
}

PromptText join_texts(const std::vector<ContentPart>& parts) {
  PromptText s;
  bool first = true;
  for (const auto& p : parts) {
    if (p.type != ContentPart::Type::kText && p.type != ContentPart::Type::kImage) continue;
    if (!first) s.markup("\n\n");
    first = false;
    append_part_text(p, &s);
  }
  return s;
}

// [encoding.py] Tool result content given as a list: text parts as is, others "[Unsupported T]".
PromptText render_tool_content_list(const std::vector<ContentPart>& parts) {
  PromptText s;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s.markup("\n\n");
    const auto& p = parts[i];
    if (p.type == ContentPart::Type::kText || p.type == ContentPart::Type::kImage)
      append_part_text(p, &s);
    else
      s.data("[Unsupported " +
             (p.type == ContentPart::Type::kOther ? p.other_type : std::string("tool_result")) + "]");
  }
  return s;
}

// [encoding.py] Arguments: a JSON object (possibly double-encoded as a JSON string); anything
// else is passed as one string parameter named "arguments".
void encode_arguments_dsml(const ToolCall& tc, PromptText* out) {
  nlohmann::ordered_json args;
  bool is_object = false;
  {
    nlohmann::ordered_json v = tc.arguments;  // at most two rounds of JSON decoding
    for (int round = 0; round < 2 && v.is_string(); ++round) {
      nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(v.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) break;
      v = std::move(parsed);
    }
    if (v.is_object()) {
      args = std::move(v);
      is_object = true;
    }
  }
  if (!is_object) {
    args = nlohmann::ordered_json::object();
    args["arguments"] = tc.arguments;
  }
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) out->markup("\n");
    first = false;
    const bool is_str = it.value().is_string();
    out->markup("<" + std::string(kDsmlToken) + " parameter name=\"");
    out->data(it.key());
    out->markup(std::string("\" string=\"") + (is_str ? "true" : "false") + "\">");
    out->data(is_str ? it.value().get<std::string>() : python_json_dumps(it.value()));
    out->markup("</" + std::string(kDsmlToken) + " parameter>");
  }
}

// "## Tools" block: the template's text around the schemas, which are data.
Status append_tools_block(const nlohmann::ordered_json& tools, PromptText* out) {
  if (!tools.is_array()) return invalid_argument("tools must be an array");
  PromptText schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
      return invalid_argument("tools[" + std::to_string(i) +
                              "] has no 'function' object (OpenAI tool format)");
    if (i) schemas.markup("\n");
    schemas.data(python_json_dumps(t["function"]));
  }
  out->markup(kToolsTemplateHead);
  out->append(schemas);
  out->markup(kToolsTemplateTail);
  return ok_status();
}

// MODEL_SPEC 6.2: blank line, "<｜DSML｜ calls>" NL, per call an invoke block, "</｜DSML｜ calls>".
void append_tool_calls(const std::vector<ToolCall>& calls, PromptText* out) {
  const std::string dsml(kDsmlToken);
  out->markup("\n\n<" + dsml + " calls>\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out->markup("\n");
    out->markup("<" + dsml + " invoke name=\"");
    out->data(calls[i].name);
    out->markup("\">\n");
    encode_arguments_dsml(calls[i], out);
    out->markup("\n</" + dsml + " invoke>");
  }
  out->markup("\n</" + dsml + " calls>");
}

}  // namespace

const char* chat_role_name(ChatRole r) {
  switch (r) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "assistant";
    case ChatRole::kTool: return "tool";
    case ChatRole::kLatestReminder: return "latest_reminder";
  }
  return "?";
}

Result<int> parse_reasoning_effort(std::string_view s) {
  if (s == "low") return 50;
  if (s == "high") return 75;
  if (s == "max") return 100;
  int v = 0;
  const bool digits = !s.empty() && s.size() <= 3 &&
                      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) std::from_chars(s.data(), s.data() + s.size(), v);
  if (!digits || v < 1 || v > 100)
    return invalid_argument("invalid reasoning effort '" + std::string(s) +
                            "': expected an integer 1..100 or one of low (50), high (75), max (100)");
  return v;
}

Result<std::string> render_tools_block(const nlohmann::ordered_json& tools) {
  PromptText out;
  DS41_RETURN_IF_ERROR(append_tools_block(tools, &out));
  return out.text();
}

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  PromptText out;
  append_tool_calls(calls, &out);
  return out.text();
}

Result<ChatPrompt> encode_chat(const std::vector<ChatMessage>& messages, const ChatOptions& opt) {
  if (messages.empty()) return invalid_argument("conversation has no messages");
  if (opt.reasoning_effort < 1 || opt.reasoning_effort > 100)
    return invalid_argument("invalid reasoning effort " + std::to_string(opt.reasoning_effort) +
                            ": expected an integer 1..100 or one of low (50), high (75), max (100)");
  ChatPrompt result;

  // 1. Validation and image blocks -> placeholders (MODEL_SPEC 6.2 last bullet).
  std::vector<Turn> turns;
  bool any_tools = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.parts.has_value() == false && m.content.find(kImageToken) != std::string::npos)
      return invalid_argument(where(i, "content") + " contains the image token " + std::string(kImageToken) +
                              "; send images as image content blocks");
    if (m.reasoning_content && m.reasoning_content->find(kImageToken) != std::string::npos)
      return invalid_argument(where(i, "reasoning_content") + " contains the image token");
    if (json_truthy(m.tools)) {
      if (m.role != ChatRole::kSystem)
        return invalid_argument(where(i, "tools") +
                                ": tools can only be declared on a system message (role is " +
                                chat_role_name(m.role) + ")");
      any_tools = true;
    }
    if (json_truthy(m.response_format) && m.role != ChatRole::kSystem)
      return invalid_argument(where(i, "response_format") + ": only allowed on a system message");
    if (m.task && !task_tokens().count(*m.task))
      return invalid_argument(where(i, "task") + ": unknown task '" + *m.task +
                              "' (valid: action, query, authority, domain, title, read_url)");
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      if (m.role != ChatRole::kAssistant)
        return invalid_argument(where(i, "tool_calls") + ": only assistants make tool calls");
      if (m.tool_calls[k].name.empty())
        return invalid_argument(where(i, "tool_calls") + "[" + std::to_string(k) + "] has no function name");
    }

    Turn t;
    t.role = m.role;
    t.reasoning = m.reasoning_content;
    t.tool_calls = m.tool_calls;
    t.tools = json_truthy(m.tools) ? &m.tools : nullptr;
    t.response_format = json_truthy(m.response_format) ? &m.response_format : nullptr;
    t.task = m.task;
    t.wo_eos = m.wo_eos;
    std::optional<std::vector<ContentPart>> parts = m.parts;
    if (parts) DS41_RETURN_IF_ERROR(process_images(&*parts, i, &result.images));

    if (m.role == ChatRole::kUser) {
      if (parts) {
        for (const auto& p : *parts) {
          if (p.type == ContentPart::Type::kText || p.type == ContentPart::Type::kImage) {
            PromptText text;
            append_part_text(p, &text);
            t.blocks.push_back({Block::kText, std::move(text), ""});
          } else if (p.type == ContentPart::Type::kToolResult) {
            t.blocks.push_back(
                {Block::kToolResult,
                 p.tool_content ? render_tool_content_list(*p.tool_content) : data_text(p.text),
                 p.tool_call_id});
          } else {
            t.blocks.push_back({Block::kText, data_text("[Unsupported " + p.other_type + "]"), ""});
          }
        }
      } else {
        t.blocks.push_back({Block::kText, data_text(m.content), ""});
      }
    } else {
      t.content = parts ? join_texts(*parts) : data_text(m.content);
    }

    // 2. Tool results are merged into user turns; consecutive user turns merge too (MODEL_SPEC
    //    6.2 "tool results are merged into user turns"; [encoding.py] merge_tool_messages).
    if (m.role == ChatRole::kTool) {
      Block b{Block::kToolResult, t.content, m.tool_call_id};
      if (!turns.empty() && turns.back().role == ChatRole::kUser) {
        turns.back().blocks.push_back(std::move(b));
      } else {
        Turn u;
        u.role = ChatRole::kUser;
        u.blocks.push_back(std::move(b));
        turns.push_back(std::move(u));
      }
    } else if (m.role == ChatRole::kUser && !turns.empty() && turns.back().role == ChatRole::kUser &&
               !turns.back().task) {
      for (auto& b : t.blocks) turns.back().blocks.push_back(std::move(b));
    } else {
      turns.push_back(std::move(t));
    }
  }

  // 3. Tool results ordered like the preceding assistant's tool calls (stable; unknown ids
  //    sort as call 0, [encoding.py] sort_tool_results_by_call_order).
  std::unordered_map<std::string, size_t> call_order;
  for (auto& t : turns) {
    if (t.role == ChatRole::kAssistant && !t.tool_calls.empty()) {
      call_order.clear();
      for (size_t k = 0; k < t.tool_calls.size(); ++k)
        if (!t.tool_calls[k].id.empty()) call_order.emplace(t.tool_calls[k].id, k);
    } else if (t.role == ChatRole::kUser && !call_order.empty()) {
      std::vector<Block> tool_blocks;
      for (const auto& b : t.blocks)
        if (b.kind == Block::kToolResult) tool_blocks.push_back(b);
      if (tool_blocks.size() > 1) {
        auto rank = [&](const Block& b) {
          auto it = call_order.find(b.tool_use_id);
          return it == call_order.end() ? size_t{0} : it->second;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
        size_t k = 0;
        for (auto& b : t.blocks)
          if (b.kind == Block::kToolResult) b = tool_blocks[k++];
      }
    }
  }

  // 4. Reasoning of earlier turns is dropped in thinking mode unless any message declares
  //    tools (MODEL_SPEC 6.2). "Earlier" = before the last user turn, where a system message
  //    after position 0 counts as a user turn.
  const bool drop = opt.drop_thinking && !any_tools;
  const int n = static_cast<int>(turns.size());
  int last_user = -1;
  for (int i = n - 1; i >= 0; --i) {
    if (turns[i].role == ChatRole::kUser || (turns[i].role == ChatRole::kSystem && i > 0)) {
      last_user = i;
      break;
    }
  }
  if (opt.thinking && drop) {
    for (int i = 0; i < last_user; ++i)
      if (turns[i].role == ChatRole::kAssistant) turns[i].reasoning.reset();
  }

  // 5. Rendering.
  PromptText p;
  if (opt.add_bos) p.markup(kBosToken);
  for (int i = 0; i < n; ++i) {
    const Turn& t = turns[i];
    // Right after BOS: <｜System｜> when thinking or when message 0 is a system message; the
    // effort line only in thinking mode and only here (MODEL_SPEC 6.2).
    if (i == 0 && (opt.thinking || t.role == ChatRole::kSystem)) p.markup(kSystemToken);
    if (i == 0 && opt.thinking) {
      p.markup("Reasoning Effort: " + std::to_string(opt.reasoning_effort) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
    }
    switch (t.role) {
      case ChatRole::kSystem:
        if (i > 0) p.markup(kSystemToken);  // mid-conversation system message
        p.append(t.content);
        if (t.tools) {
          p.markup("\n\n");
          DS41_RETURN_IF_ERROR(append_tools_block(*t.tools, &p));
        }
        if (t.response_format) {
          p.markup("\n\n");
          p.markup(kResponseFormatHead);
          p.data(python_json_dumps(*t.response_format));
        }
        break;
      case ChatRole::kUser: {
        p.markup(kUserToken);
        for (size_t k = 0; k < t.blocks.size(); ++k) {
          if (k) p.markup("\n\n");  // blocks (and tool results) joined by a blank line
          const Block& b = t.blocks[k];
          if (b.kind == Block::kToolResult) p.markup("<tool_result>");
          p.append(b.text);
          if (b.kind == Block::kToolResult) p.markup("</tool_result>");
        }
        break;
      }
      case ChatRole::kLatestReminder:
        p.markup(kLatestReminderToken);
        p.append(t.content);
        break;
      case ChatRole::kAssistant: {
        // [reasoning + </think>] + content + [tool calls] + EOS. The reasoning part is written in
        // thinking mode for turns after the last user turn, or for all turns when not dropping;
        // never after a task message ([encoding.py]).
        const bool prev_task = i > 0 && turns[i - 1].task.has_value();
        if (opt.thinking && !prev_task && (!drop || i > last_user)) {
          p.data(t.reasoning.value_or(""));
          p.markup(kThinkEnd);
        }
        p.append(t.content);
        if (!t.tool_calls.empty()) append_tool_calls(t.tool_calls, &p);
        if (!t.wo_eos) p.markup(kEosToken);
        break;
      }
      case ChatRole::kTool: return internal_error("tool message survived merging");
    }

    // Generation header: only before an assistant / latest_reminder turn or at the end.
    if (i + 1 < n && turns[i + 1].role != ChatRole::kAssistant &&
        turns[i + 1].role != ChatRole::kLatestReminder)
      continue;
    if (t.task) {
      const std::string_view tok = task_tokens().at(*t.task);
      if (*t.task != "action") {
        p.markup(tok);
      } else {
        p.markup(kAssistantToken);
        p.markup(opt.thinking ? kThinkStart : kThinkEnd);
        p.markup(tok);
      }
    } else if (t.role == ChatRole::kUser || (t.role == ChatRole::kSystem && i > 0)) {
      p.markup(kAssistantToken);
      // <think> in thinking mode for the last user turn (or every turn when reasoning is kept);
      // </think> otherwise and always in chat mode.
      const bool think = opt.thinking && (!drop || i >= last_user);
      p.markup(think ? kThinkStart : kThinkEnd);
    }
  }
  result.text = p.text();
  if (opt.parse_special_in_content)
    result.special_ranges = {TextRange{0, result.text.size()}};
  else
    result.special_ranges = p.markup_ranges();
  return result;
}

std::vector<int32_t> chat_prompt_ids(const Tokenizer& tokenizer, const ChatPrompt& prompt) {
  EncodeOptions o;
  o.added_token_ranges = std::span<const TextRange>(prompt.special_ranges);
  return tokenizer.encode(prompt.text, o);
}

}  // namespace ds41::text
