// Chat encoding (MODEL_SPEC 6.2): golden fixtures (expected prompts written from the spec in
// fixtures/make_chat_fixtures.py, ids from the npm tokenizer) and error cases.
#include "text/chat_encoding.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "text/chat_json.h"
#include "text_test_util.h"

namespace ds41::text {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> fixture_files() {
  std::vector<fs::path> v;
  for (const auto& e :
       fs::directory_iterator(std::string(DS41_SOURCE_DIR) + "/tests/unit/text/fixtures/chat"))
    if (e.path().extension() == ".json") v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

TEST(ChatEncoding, GoldenFixtures) {
  const auto files = fixture_files();
  ASSERT_GE(files.size(), 30u);
  const Tokenizer& tok = testing::v41_tokenizer();
  for (const auto& f : files) {
    SCOPED_TRACE(f.filename().string());
    const auto fx = nlohmann::ordered_json::parse(testing::read_file(f.string()));
    auto conv = conversation_from_json(fx["conversation"]);
    ASSERT_TRUE(conv.ok()) << conv.status().to_string();
    auto prompt = encode_chat(conv->messages, conv->options);
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    EXPECT_EQ(prompt->text, fx["expected_prompt"].get<std::string>()) << fx["rule"].get<std::string>();
    EXPECT_EQ(prompt->images, fx["expected_images"].get<std::vector<std::string>>());
    EXPECT_EQ(tok.encode(prompt->text), fx["expected_ids"].get<std::vector<int32_t>>());
  }
}

Status encode_error(const std::string& conversation_json) {
  auto conv = conversation_from_json(nlohmann::ordered_json::parse(conversation_json));
  if (!conv.ok()) return conv.status();
  auto p = encode_chat(conv->messages, conv->options);
  return p.ok() ? ok_status() : p.status();
}

TEST(ChatEncoding, ReasoningEffortValidation) {
  for (const char* bad : {"0", "101", "-5", "medium", "HIGH", "", "50.5", "1e2", " 50", "0050"}) {
    auto r = parse_reasoning_effort(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("1..100"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(*parse_reasoning_effort("low"), 50);
  EXPECT_EQ(*parse_reasoning_effort("high"), 75);
  EXPECT_EQ(*parse_reasoning_effort("max"), 100);
  EXPECT_EQ(*parse_reasoning_effort("1"), 1);
  EXPECT_EQ(*parse_reasoning_effort("100"), 100);
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi"}])";
  for (const char* bad : {"0", "101", "50.5", "true", "\"medium\"", "[75]"}) {
    Status s = encode_error("{" + msgs + R"(, "reasoning_effort": )" + bad + "}");
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("reasoning effort"), std::string::npos) << s.message();
  }
  ChatOptions o;
  o.reasoning_effort = 0;
  ChatMessage m;
  m.content = "x";
  EXPECT_FALSE(encode_chat({m}, o).ok());
}

TEST(ChatEncoding, ClearErrors) {
  struct Case {
    const char* json;
    const char* expect;
  } cases[] = {
      {R"({"messages": []})", "no messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "wizard"},
      {R"({"messages": [{"content": "x"}]})", "role"},
      {R"({"messages": [{"role": "user", "content": "see <｜deepseek_image｜>"}]})", "image"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "<｜deepseek_image｜>"}]}]})",
       "image"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
       "without a source"},
      {R"({"messages": [{"role": "user", "content": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}]})",
       "system message"},
      {R"({"messages": [{"role": "user", "content": "x", "task": "dance"}]})", "unknown task"},
      {R"({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "no function name"},
      {R"({"messages": [{"role": "system", "content": "x", "tools": [{"type": "function"}]}]})", "function"},
      {R"({"messages": [{"role": "user", "content": "x"}], "thinking_mode": "fast"})", "thinking_mode"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "content"},
  };
  for (const auto& c : cases) {
    Status s = encode_error(c.json);
    ASSERT_FALSE(s.ok()) << c.json;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.json << " -> " << s.message();
  }
}

TEST(ChatEncoding, BareMessageArrayAndNoBos) {
  auto conv = conversation_from_json(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"));
  ASSERT_TRUE(conv.ok());
  ChatOptions o;
  o.thinking = false;
  o.add_bos = false;
  auto p = encode_chat(conv->messages, o);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->text, "<｜User｜>Hi<｜Assistant｜></think>");
}

}  // namespace
}  // namespace ds41::text
