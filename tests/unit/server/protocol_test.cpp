// ds41 server tests: OpenAI request parsing and validation (every error path is a 400 naming the
// field; valid bodies fill the typed structs).
#include <gtest/gtest.h>

#include "server/openai_protocol.h"

namespace ds41::server {
namespace {

struct BadCase {
  const char* name;
  const char* body;
  const char* param;    // expected ApiError.param ("" = none)
  const char* message;  // substring of the message
};

const char* kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";

std::string with(const std::string& extra) {
  return std::string("{") + kMsgs + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(ServerProtocol, ChatBadBodiesAre400WithTheField) {
  const std::vector<std::pair<std::string, BadCase>> cases = {
      {"{", {"malformed", "", "", "not valid JSON"}},
      {"[1]", {"not object", "", "", "must be a JSON object"}},
      {"{}", {"no messages", "", "messages", "required"}},
      {R"({"messages": {}})", {"messages object", "", "messages", "must be an array"}},
      {R"({"messages": []})", {"empty", "", "messages", "must not be empty"}},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", {"role", "", "messages[0].role", "wizard"}},
      {R"({"messages": [{"content": "x"}]})", {"no role", "", "messages[0]", "role"}},
      {R"({"messages": [{"role": "user", "content": 5}]})",
       {"content int", "", "messages[0].content", "string"}},
      // Issue 16: image parts are accepted (resolved by the service); their shape is checked here.
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x", "detail": "max"}}]}]})",
       {"image detail", "", "messages[0].content[0].image_url.detail", "\"auto\", \"low\" or \"high\""}},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]})",
       {"image url", "", "messages[0].content[0].image_url.url", "non-empty"}},
      {with(R"("temperature": "hot")"), {"temp type", "", "temperature", "must be a number"}},
      {with(R"("temperature": 3)"), {"temp range", "", "temperature", "[0, 2]"}},
      {with(R"("top_p": 0)"), {"top_p zero", "", "top_p", "(0, 1]"}},
      {with(R"("top_k": 1.5)"), {"top_k float", "", "top_k", "integer"}},
      {with(R"("min_p": 2)"), {"min_p", "", "min_p", "[0, 1]"}},
      {with(R"("presence_penalty": 3)"), {"presence", "", "presence_penalty", "[-2, 2]"}},
      {with(R"("frequency_penalty": -3)"), {"frequency", "", "frequency_penalty", "[-2, 2]"}},
      {with(R"("repetition_penalty": 0)"), {"repetition", "", "repetition_penalty", "> 0"}},
      {with(R"("seed": "x")"), {"seed", "", "seed", "integer"}},
      {with(R"("max_tokens": 0)"), {"max_tokens 0", "", "max_tokens", "[1,"}},
      {with(R"("max_completion_tokens": -1)"), {"mct", "", "max_completion_tokens", "[1,"}},
      {with(R"("n": 2)"), {"n", "", "n", "must be 1"}},
      {with(R"("stop": 5)"), {"stop type", "", "stop", "string or an array"}},
      {with(R"("stop": [""])"), {"stop empty", "", "stop", "must not be empty"}},
      {with(R"("stop": ["a", 1])"), {"stop item", "", "stop", "string or an array"}},
      {with(R"("stream": "yes")"), {"stream", "", "stream", "boolean"}},
      {with(R"("stream_options": {"include_usage": 1})"),
       {"include_usage", "", "stream_options.include_usage", "boolean"}},
      {with(R"("logprobs": true, "top_logprobs": 21)"), {"top_logprobs", "", "top_logprobs", "[0, 20]"}},
      {with(R"("top_logprobs": 3)"), {"top_logprobs alone", "", "top_logprobs", "needs 'logprobs'"}},
      {with(R"("tools": {})"), {"tools type", "", "tools", "an array"}},
      {with(R"("tools": [{"type": "function"}])"), {"tool no fn", "", "tools[0].function", "no 'function'"}},
      {with(R"("tools": [{"type": "function", "function": {"name": ""}}])"),
       {"tool name", "", "tools[0].function.name", "non-empty"}},
      {with(R"("tool_choice": "sometimes")"), {"tool_choice str", "", "tool_choice", "sometimes"}},
      {with(R"("tool_choice": "required")"), {"required no tools", "", "tool_choice", "needs 'tools'"}},
      {with(
           R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}})"),
       {"named missing", "", "tool_choice", "'g'"}},
      {with(R"("chat_template_kwargs": {"thinking": "on"})"),
       {"thinking", "", "chat_template_kwargs.thinking", "boolean"}},
      {with(R"("chat_template_kwargs": [])"), {"kwargs", "", "chat_template_kwargs", "object"}},
      {with(R"("reasoning_effort": "medium")"), {"effort", "", "reasoning_effort", "\"low\""}},
      {with(R"("reasoning_effort": 0)"), {"effort 0", "", "reasoning_effort", "1..100"}},
      {with(R"("reasoning_effort": 101)"), {"effort 101", "", "reasoning_effort", "1..100"}},
      {with(R"("response_format": {"type": "xml"})"), {"rf", "", "response_format.type", "json_object"}},
      {with(R"("model": 3)"), {"model", "", "model", "string"}},
  };
  for (const auto& [body, c] : cases) {
    SCOPED_TRACE(body);
    auto r = parse_chat_request(body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().type, "invalid_request_error");
    EXPECT_EQ(r.error().param, c.param);
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
    // The body is OpenAI-shaped.
    auto j = error_body(r.error());
    EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") &&
                j["error"].contains("param") && j["error"].contains("code"));
  }
}

TEST(ServerProtocol, ChatFullBodyFillsTheStruct) {
  const std::string body = R"({
    "model": "m", "user": "u1",
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                 {"role": "assistant", "content": null,
                  "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "stream": true, "stream_options": {"include_usage": true},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"type": "function", "function": {"name": "g"}}],
    "tool_choice": {"type": "function", "function": {"name": "g"}},
    "chat_template_kwargs": {"enable_thinking": false},
    "reasoning_effort": "max", "max_tokens": 10, "max_completion_tokens": 20,
    "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1, "seed": 7,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "stop": "END", "logprobs": true, "top_logprobs": 5, "n": 1,
    "response_format": {"type": "json_object"}, "unknown_vendor_field": {"x": 1}})";
  auto r = parse_chat_request(body);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ChatCompletionRequest& c = r.value();
  EXPECT_EQ(c.common.model, "m");
  EXPECT_EQ(c.common.user, "u1");
  ASSERT_EQ(c.messages.size(), 4u);
  EXPECT_EQ(c.messages[3].role, text::ChatRole::kTool);
  EXPECT_TRUE(c.common.stream);
  EXPECT_TRUE(c.common.include_usage);
  EXPECT_EQ(c.tool_choice, ToolChoice::kNamed);
  ASSERT_EQ(c.tools.size(), 1u);  // only the named tool is rendered
  EXPECT_EQ(c.tools[0]["function"]["name"], "g");
  EXPECT_EQ(c.thinking, std::optional<bool>(false));
  EXPECT_EQ(c.reasoning_effort, std::optional<int>(100));
  EXPECT_EQ(c.common.max_tokens, std::optional<int64_t>(20));  // max_completion_tokens wins
  EXPECT_DOUBLE_EQ(c.common.sampling.temperature, 0.5);
  EXPECT_DOUBLE_EQ(c.common.sampling.top_p, 0.9);
  EXPECT_EQ(c.common.sampling.top_k, 0);
  EXPECT_DOUBLE_EQ(c.common.sampling.min_p, 0.1);
  EXPECT_EQ(c.common.sampling.seed, std::optional<uint64_t>(7));
  EXPECT_DOUBLE_EQ(c.common.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(c.common.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(c.common.sampling.top_logprobs, 5);
  EXPECT_EQ(c.response_format["type"], "json_object");
}

TEST(ServerProtocol, ToolChoiceNoneDropsTools) {
  auto r = parse_chat_request(
      with(R"("tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none")"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.value().tools.is_null());
  auto e = parse_chat_request(with(R"("reasoning_effort": 33)"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.value().reasoning_effort, std::optional<int>(33));
}

TEST(ServerProtocol, CompletionPrompts) {
  auto s = parse_completion_request(R"({"prompt": "hi", "echo": true, "logprobs": 2})");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s.value().prompts.size(), 1u);
  EXPECT_EQ(*s.value().prompts[0].text, "hi");
  EXPECT_TRUE(s.value().echo);
  EXPECT_EQ(s.value().common.sampling.top_logprobs, 2);
  auto ids = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value().prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto batch = parse_completion_request(R"({"prompt": ["a", [4, 5]]})");
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch.value().prompts.size(), 2u);
  EXPECT_EQ(batch.value().prompts[1].ids, (std::vector<int32_t>{4, 5}));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, -2]})", "prompt"},
      {R"({"prompt": [1, 3000000000]})", "prompt"},
      {R"({"prompt": ["a", 5]})", "prompt"},
      {R"({"prompt": ["a", []]})", "prompt"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "echo": 1})", "echo"},
      {R"({"prompt": ["a", "b"], "stream": true})", "stream"},
  };
  for (const auto& [body, param] : bad) {
    SCOPED_TRACE(body);
    auto r = parse_completion_request(body);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().param, param);
  }
}

TEST(ServerProtocol, DeepNestingIsRejectedBeforeParsing) {
  std::string deep(100000, '[');
  auto r = parse_chat_request(deep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_NE(r.error().message.find("nests deeper"), std::string::npos);
}

TEST(ServerProtocol, StatusMapping) {
  EXPECT_EQ(api_error_from_status(invalid_argument("x")).http_status, 400);
  ApiError full = api_error_from_status(resource_exhausted("queue full"));
  EXPECT_EQ(full.http_status, 429);
  EXPECT_GT(full.retry_after_s, 0);
  EXPECT_EQ(api_error_from_status(unavailable("x")).http_status, 503);
  EXPECT_EQ(api_error_from_status(internal_error("x")).http_status, 500);
}

}  // namespace
}  // namespace ds41::server
