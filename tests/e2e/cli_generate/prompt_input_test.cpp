// Prompt and conversation inputs of the ds41 binary (issue 15): `--prompt-file`, `--prompt -`
// (stdin), `tokenize` from stdin with a 1 MB text (over the ~128 KiB a shell argument may hold),
// `generate --messages FILE` and `chat-template --messages FILE` with the same format, the
// template mode flags with one meaning in both commands, and `--tokenizer` as file or folder.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

const std::string kTokFile = kTok + "/tokenizer.json";

void write_file(const std::string& path, const std::string& text) {
  std::ofstream o(path, std::ios::binary);
  o << text;
}

// "prefill: N tokens" from generate's timing line; -1 when absent.
long prefill_tokens(const std::string& err) {
  const size_t p = err.find("prefill: ");
  if (p == std::string::npos) return -1;
  return std::stol(err.substr(p + 9));
}

size_t ids_of_json(const std::string& out) {
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("ids")) return 0;
  return j["ids"].size();
}

class PromptInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(fresh_dir("prompt_input"));
    RunResult r =
        run_ds41("make-checkpoint --preset tiny --seed 1 --tokenizer " + kTok + " --out " + *root_ + "/m");
    ASSERT_EQ(r.exit_code, 0) << dump(r);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string path(const std::string& name) { return *root_ + "/" + name; }
  static std::string gen(const std::string& args) {
    return "generate --model " + *root_ + "/m --tokenizer " + kTok + " --max-tokens 1 " + args;
  }
  static std::string* root_;
};
std::string* PromptInput::root_ = nullptr;

// A 1 MB text: tokenized from stdin (no argument, and "-") gives the same ids as the same text
// through --batch, and far more than a shell argument could carry.
TEST_F(PromptInput, TokenizeReadsOneMegabyteFromStdin) {
  std::string text;
  for (int i = 0; text.size() < (1u << 20); ++i)
    text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog. ";
  write_file(path("big.txt"), text);
  write_file(path("big.jsonl"), nlohmann::json{{"text", text}}.dump() + "\n");
  RunResult piped = run_ds41("tokenize --tokenizer " + kTokFile + " --json < " + path("big.txt"));
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  RunResult dash = run_ds41("tokenize --tokenizer " + kTokFile + " --json - < " + path("big.txt"));
  ASSERT_EQ(dash.exit_code, 0) << dash.err;
  RunResult batch = run_ds41("tokenize --tokenizer " + kTokFile + " --batch " + path("big.jsonl") + " " +
                             path("big.out.jsonl"));
  ASSERT_EQ(batch.exit_code, 0) << dump(batch);
  const auto ids = nlohmann::json::parse(piped.out)["ids"];
  EXPECT_GT(ids.size(), 100000u);
  EXPECT_EQ(ids, nlohmann::json::parse(slurp(path("big.out.jsonl")))["ids"]);
  EXPECT_EQ(ids, nlohmann::json::parse(dash.out)["ids"]);
}

// generate --prompt-file and --prompt - read the whole text: the prefill counts BOS + the ids
// tokenize gives for the same text (an 8 KB file: generating from 1 MB would be slow).
TEST_F(PromptInput, GenerateReadsPromptFileAndStdin) {
  std::string text;
  while (text.size() < 8000) text += "Hello world, this is a long prompt. ";
  write_file(path("p.txt"), text);
  RunResult t = run_ds41("tokenize --tokenizer " + kTok + " --json < " + path("p.txt"));
  ASSERT_EQ(t.exit_code, 0) << dump(t);
  const long n = static_cast<long>(ids_of_json(t.out)) + 1;
  ASSERT_GT(n, 1000);
  RunResult f = run_ds41(gen("--prompt-file " + path("p.txt")));
  EXPECT_EQ(f.exit_code, 0) << dump(f);
  EXPECT_EQ(prefill_tokens(f.err), n) << f.err;
  RunResult s = run_ds41(gen("--prompt - < " + path("p.txt")));
  EXPECT_EQ(s.exit_code, 0) << dump(s);
  EXPECT_EQ(prefill_tokens(s.err), n) << s.err;
  EXPECT_EQ(f.out, s.out);
  // Usage errors before the model loads (exit 2): a missing file, an empty one, two sources.
  write_file(path("empty.txt"), "");
  RunResult missing = run_ds41(gen("--prompt-file " + path("nope.txt")));
  EXPECT_EQ(missing.exit_code, 2) << dump(missing);
  EXPECT_NE(missing.err.find("nope.txt"), std::string::npos) << dump(missing);
  RunResult empty = run_ds41(gen("--prompt-file " + path("empty.txt")));
  EXPECT_EQ(empty.exit_code, 2) << dump(empty);
  EXPECT_NE(empty.err.find("empty"), std::string::npos) << dump(empty);
  RunResult both = run_ds41(gen("--prompt hi --prompt-file " + path("p.txt")));
  EXPECT_EQ(both.exit_code, 2) << dump(both);
  EXPECT_NE(both.err.find("exactly one"), std::string::npos) << dump(both);
}

const char* kConversation = R"({
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
      {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "content": "sunny, 21 C"},
    {"role": "user", "content": "And tomorrow?"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
})";

// generate --messages FILE prefills exactly the ids chat-template renders for the same file,
// read from --messages FILE or from stdin, in each mode.
TEST_F(PromptInput, GenerateMessagesMatchesChatTemplate) {
  write_file(path("conv.json"), kConversation);
  for (const std::string mode : {"", "--chat", "--thinking", "--effort max", "--chat --effort low"}) {
    RunResult ct = run_ds41("chat-template --tokenizer " + kTok + " --json " + mode + " --messages " +
                            path("conv.json"));
    ASSERT_EQ(ct.exit_code, 0) << mode << dump(ct);
    RunResult ct_stdin =
        run_ds41("chat-template --tokenizer " + kTok + " --json " + mode + " < " + path("conv.json"));
    ASSERT_EQ(ct_stdin.exit_code, 0) << mode << dump(ct_stdin);
    EXPECT_EQ(ct.out, ct_stdin.out) << mode;
    const size_t n = ids_of_json(ct.out);
    ASSERT_GT(n, 40u) << ct.out;
    EXPECT_NE(ct.out.find("get_weather"), std::string::npos);
    RunResult g = run_ds41(gen(mode + " --messages " + path("conv.json")));
    ASSERT_EQ(g.exit_code, 0) << mode << dump(g);
    EXPECT_EQ(prefill_tokens(g.err), static_cast<long>(n)) << mode << g.err;
  }
  RunResult bad = run_ds41(gen("--messages " + path("p_missing.json")));
  EXPECT_EQ(bad.exit_code, 2) << dump(bad);
  EXPECT_NE(bad.err.find("--messages"), std::string::npos) << dump(bad);
}

// The mode flags mean the same in both commands: --effort is thinking mode even with --chat
// (chat-template used to render chat mode there, generate thinking mode); --chat alone is chat
// mode; a one-turn --prompt with --chat equals the same turn through chat-template --chat.
TEST_F(PromptInput, ModeFlagsMeanTheSameInGenerateAndChatTemplate) {
  const std::string turn = R"([{"role": "user", "content": "Hi there"}])";
  write_file(path("turn.json"), turn);
  auto ct = [&](const std::string& mode) {
    return run_ds41("chat-template --tokenizer " + kTok + " --json " + mode + " --messages " +
                    path("turn.json"));
  };
  EXPECT_EQ(ct("--chat --effort low").out, ct("--effort low").out);
  EXPECT_NE(ct("--chat").out, ct("--effort low").out);
  for (const std::string mode : {"--chat", "--thinking", "--thinking --effort max", "--chat --effort low"}) {
    RunResult g = run_ds41(gen(mode + " --prompt 'Hi there'"));
    ASSERT_EQ(g.exit_code, 0) << mode << dump(g);
    EXPECT_EQ(prefill_tokens(g.err), static_cast<long>(ids_of_json(ct(mode).out))) << mode << g.err;
  }
  RunResult both = run_ds41(gen("--chat --thinking --prompt hi"));
  EXPECT_EQ(both.exit_code, 2) << dump(both);
  // `medium` is named in the error with the accepted values, in both commands.
  for (const std::string& cmd :
       {gen("--chat --effort medium --prompt hi"),
        "chat-template --tokenizer " + kTok + " --effort medium --messages " + path("turn.json")}) {
    RunResult r = run_ds41(cmd);
    EXPECT_NE(r.exit_code, 0) << dump(r);
    EXPECT_NE(r.err.find("'medium'"), std::string::npos) << dump(r);
    EXPECT_NE(r.err.find("low (50), high (75), max (100)"), std::string::npos) << dump(r);
  }
}

// --tokenizer accepts the folder or the tokenizer.json file in generate, tokenize and
// chat-template, with the same result.
TEST_F(PromptInput, TokenizerFlagTakesFolderOrFile) {
  const std::string turn = R"([{"role": "user", "content": "Hi"}])";
  write_file(path("hi.json"), turn);
  for (const std::string& tail :
       {std::string("--json 'Hello there'"), " --json --messages " + path("hi.json")}) {
    const std::string cmd = tail.find("--messages") != std::string::npos ? "chat-template" : "tokenize";
    RunResult d = run_ds41(cmd + " --tokenizer " + kTok + " " + tail);
    RunResult f = run_ds41(cmd + " --tokenizer " + kTokFile + " " + tail);
    ASSERT_EQ(d.exit_code, 0) << dump(d);
    ASSERT_EQ(f.exit_code, 0) << dump(f);
    EXPECT_EQ(d.out, f.out);
  }
  const std::string g =
      "generate --model " + *root_ + "/m --max-tokens 2 --prompt 'Hello there' --tokenizer ";
  RunResult d = run_ds41(g + kTok), f = run_ds41(g + kTokFile);
  ASSERT_EQ(d.exit_code, 0) << dump(d);
  ASSERT_EQ(f.exit_code, 0) << dump(f);
  EXPECT_EQ(d.out, f.out);
}

}  // namespace
}  // namespace ds41::testing_cli
