// Completion parsing: reasoning / content split, DSML tool calls, and a fuzz of malformed DSML.
#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/chat_encoding.h"
#include "text/python_json.h"
#include "text/synthetic_text.h"

namespace ds41::text {
namespace {

const std::string kCalls =
    "\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris \"intra\"\nmuros</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"opts\" string=\"false\">{\"unit\": \"C\", \"x\": [1, 2.5]}</｜DSML｜ "
    "parameter>\n"
    "</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"now\">\n\n</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls>";

TEST(OutputParser, ThinkingSplitAndEos) {
  ParsedOutput o = parse_assistant_output("Let me think.</think>The answer is 4.<｜end▁of▁sentence｜>", true);
  EXPECT_EQ(o.reasoning_content, "Let me think.");
  EXPECT_EQ(o.content, "The answer is 4.");
  EXPECT_TRUE(o.reasoning_complete);
  EXPECT_TRUE(o.saw_eos);
  EXPECT_TRUE(o.tool_calls.empty());

  ParsedOutput trunc = parse_assistant_output("still thinking about", true);
  EXPECT_EQ(trunc.reasoning_content, "still thinking about");
  EXPECT_EQ(trunc.content, "");
  EXPECT_FALSE(trunc.reasoning_complete);

  ParsedOutput chat = parse_assistant_output("Hello</think> there", false);
  EXPECT_EQ(chat.reasoning_content, "");
  EXPECT_EQ(chat.content, "Hello</think> there");  // chat mode: no reasoning split
}

TEST(OutputParser, ToolCalls) {
  ParsedOutput o = parse_assistant_output("r</think>Checking." + kCalls + "<｜end▁of▁sentence｜>", true);
  EXPECT_FALSE(o.tool_calls_malformed);
  EXPECT_EQ(o.content, "Checking.");
  ASSERT_EQ(o.tool_calls.size(), 2u);
  EXPECT_EQ(o.tool_calls[0].name, "get_weather");
  EXPECT_EQ(o.tool_calls[0].arguments,
            "{\"city\": \"Paris \\\"intra\\\"\\nmuros\", \"days\": 3, \"opts\": {\"unit\": \"C\", \"x\": [1, "
            "2.5]}}");
  auto args = nlohmann::json::parse(o.tool_calls[0].arguments);
  EXPECT_EQ(args["city"], "Paris \"intra\"\nmuros");
  EXPECT_EQ(o.tool_calls[1].name, "now");
  EXPECT_EQ(o.tool_calls[1].arguments, "{}");
}

// What the encoder writes for history is what the parser reads back.
TEST(OutputParser, RoundTripWithEncoder) {
  std::vector<ToolCall> calls = {{"c1", "search", R"({"q": "多语言 \"x\"", "k": 5, "f": false, "n": null})"},
                                 {"c2", "noop", "{}"}};
  const std::string text = "ok" + render_tool_calls(calls) + "<｜end▁of▁sentence｜>";
  ParsedOutput o = parse_assistant_output(text, false);
  ASSERT_EQ(o.tool_calls.size(), 2u) << text;
  EXPECT_EQ(o.content, "ok");
  EXPECT_EQ(nlohmann::json::parse(o.tool_calls[0].arguments), nlohmann::json::parse(calls[0].arguments));
  EXPECT_EQ(o.tool_calls[1].arguments, "{}");
}

TEST(OutputParser, MalformedDsmlIsPlainText) {
  const std::vector<std::string> bad = {
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n",  // truncated
      "x\n\n<｜DSML｜ calls>\n</｜DSML｜ calls>",               // no invoke
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"maybe\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"false\">not json</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">1</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      // interleaved: an invoke opened inside a parameter value
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">1<｜DSML｜ invoke name=\"g\">\n</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>",
      "x" + kCalls + "trailing text",
  };
  for (const auto& s : bad) {
    ParsedOutput o = parse_assistant_output(s, false);
    EXPECT_TRUE(o.tool_calls.empty()) << s;
    EXPECT_TRUE(o.tool_calls_malformed) << s;
    EXPECT_EQ(o.content, s);
  }
}

// Fuzz: every truncation and random mutations of a valid completion; never crashes, and the
// result is either a complete parse or the plain text.
TEST(OutputParser, FuzzTruncationsAndMutations) {
  const std::string full = "reason</think>Checking." + kCalls + "<｜end▁of▁sentence｜>";
  for (size_t n = 0; n <= full.size(); ++n) {
    const std::string s = full.substr(0, n);
    ParsedOutput o = parse_assistant_output(s, true);
    if (!o.tool_calls.empty()) EXPECT_EQ(o.tool_calls.size(), 2u);
    for (const auto& c : o.tool_calls) EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
  }
  SyntheticText g(5);
  const std::vector<std::string> pieces = {"<｜DSML｜ invoke name=\"",
                                           "</｜DSML｜ invoke>",
                                           "<｜DSML｜ parameter name=\"",
                                           "</｜DSML｜ parameter>",
                                           "\" string=\"true\">",
                                           "\n",
                                           "</think>",
                                           "<｜end▁of▁sentence｜>",
                                           "\n\n<｜DSML｜ calls>\n",
                                           "</｜DSML｜ calls>",
                                           "\"",
                                           ">"};
  int parsed = 0;
  for (int it = 0; it < 20000; ++it) {
    std::string s = full;
    const int edits = 1 + static_cast<int>(g.below(4));
    for (int e = 0; e < edits; ++e) {
      const size_t pos = g.below(s.size() + 1);
      switch (g.below(4)) {
        case 0: s.insert(pos, pieces[g.below(pieces.size())]); break;
        case 1: s.erase(pos, g.below(12)); break;
        case 2:
          if (pos < s.size()) s[pos] = static_cast<char>(g.below(256));
          break;
        default: s = s.substr(0, pos); break;
      }
    }
    for (bool thinking : {true, false}) {
      ParsedOutput o = parse_assistant_output(s, thinking);
      for (const auto& c : o.tool_calls) {
        EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
        EXPECT_FALSE(c.name.empty());
      }
      parsed += !o.tool_calls.empty();
    }
  }
  EXPECT_GT(parsed, 0);  // some mutations keep the block valid
}

TEST(PythonJson, MatchesPythonDumps) {
  auto j = nlohmann::ordered_json::parse(
      R"({"b": 1, "a": [true, null, 1.0, 1e-5, 1e16, 123.456, -0.0, 12345678901234567890], "s": "é\u0001\n\"\\/", "e": {}})");
  EXPECT_EQ(python_json_dumps(j),
            "{\"b\": 1, \"a\": [true, null, 1.0, 1e-05, 1e+16, 123.456, -0.0, 12345678901234567890], "
            "\"s\": \"é\\u0001\\n\\\"\\\\/\", \"e\": {}}");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e22), "1e+22");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00012), "0.00012");
  EXPECT_EQ(python_float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(python_float_repr(123456789012345.6), "123456789012345.6");
  EXPECT_EQ(python_float_repr(2.5e300), "2.5e+300");
}

}  // namespace
}  // namespace ds41::text
