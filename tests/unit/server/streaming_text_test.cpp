// ds41 server tests: consumer-side stop strings across chunk boundaries, the streaming
// reasoning/content/DSML split, and SSE framing.
#include <gtest/gtest.h>

#include "server/output_router.h"
#include "server/sse.h"
#include "server/stop_matcher.h"

namespace ds41::server {
namespace {

// Feeds `chunks` and returns (emitted text, matched).
std::pair<std::string, bool> run_stops(std::vector<std::string> stops,
                                       const std::vector<std::string>& chunks) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const auto& c : chunks) out += m.push(c);
  out += m.flush();
  return {out, m.matched()};
}

TEST(ServerStopMatcher, MatchesAcrossChunkBoundaries) {
  EXPECT_EQ(run_stops({"STOP"}, {"hello S", "T", "OP world"}), std::make_pair(std::string("hello "), true));
  EXPECT_EQ(run_stops({"STOP"}, {"hello ST", "ART"}), std::make_pair(std::string("hello START"), false));
  // Earliest match wins among several stop strings.
  EXPECT_EQ(run_stops({"xyz", "b"}, {"a", "bxyz"}), std::make_pair(std::string("a"), true));
  // A held-back prefix is released as soon as it cannot match.
  StopMatcher m({"</end>"});
  EXPECT_EQ(m.push("abc</e"), "abc");
  EXPECT_EQ(m.push("x"), "</ex");
  EXPECT_EQ(m.push("</end>tail"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.matched_stop(), "</end>");
  EXPECT_EQ(m.push("more"), "");
  // Multi-byte stop string split inside a character.
  EXPECT_EQ(run_stops({"終"}, {"abc\xE7", "\xB5", "\x82"}), std::make_pair(std::string("abc"), true));
  // No stops: pass-through.
  EXPECT_EQ(run_stops({}, {"a", "b"}), std::make_pair(std::string("ab"), false));
}

OutputDelta run_router(bool thinking, const std::vector<std::string>& chunks) {
  OutputRouter r(false, thinking);
  OutputDelta all;
  auto add = [&](OutputDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
  };
  for (const auto& c : chunks) add(r.push(c));
  add(r.finish());
  return all;
}

TEST(ServerOutputRouter, SplitsReasoningAtThinkEndAcrossChunks) {
  OutputDelta d = run_router(true, {"let me ", "think</th", "ink>The answer", " is 4."});
  EXPECT_EQ(d.reasoning, "let me think");
  EXPECT_EQ(d.content, "The answer is 4.");
  // Chat mode: everything is content.
  d = run_router(false, {"a</think>b"});
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "a</think>b");
}

TEST(ServerOutputRouter, ParsesDsmlToolCallsStreamedInPieces) {
  const std::string block =
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  std::vector<std::string> chunks = {"Checking."};
  for (size_t i = 0; i < block.size(); i += 5) chunks.push_back(block.substr(i, 5));
  OutputDelta d = run_router(false, chunks);
  EXPECT_EQ(d.content, "Checking.");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city": "Paris"})");
}

TEST(ServerOutputRouter, MalformedDsmlIsReturnedAsContent) {
  OutputRouter r(false, false);
  OutputDelta a = r.push("x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">broken");
  OutputDelta b = r.finish();
  EXPECT_EQ(a.content + b.content, "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">broken");
  EXPECT_TRUE(b.tool_calls.empty());
  EXPECT_TRUE(r.tool_calls_malformed());
}

TEST(ServerSse, Framing) {
  nlohmann::ordered_json j = {{"a", "line1\nline2"}};
  EXPECT_EQ(sse_event(j), "data: {\"a\":\"line1\\nline2\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment("x\ny"), ": x y\n\n");
  // Invalid UTF-8 in model output never throws.
  nlohmann::ordered_json bad = {{"t", std::string("\xE7\xB5")}};
  EXPECT_EQ(sse_event(bad), "data: {\"t\":\"\xEF\xBF\xBD\"}\n\n");
}

}  // namespace
}  // namespace ds41::server
