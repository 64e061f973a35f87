// `ds41 generate` output (issue 15): thinking and answer apart (headers, not with --raw), --json
// with separate fields from the output parser, --stop strings honoured. The tiny random model
// never closes its thinking, so in thinking mode all text is reasoning.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


class GenerateOutput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(fresh_dir("generate_output"));
    RunResult r =
        run_ds41("make-checkpoint --preset tiny --seed 1 --tokenizer " + kTok + " --out " + *root_ + "/m");
    ASSERT_EQ(r.exit_code, 0) << dump(r);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string gen(const std::string& args) {
    return "generate --model " + *root_ + "/m --tokenizer " + kTok + " --prompt 'Tell me a story' " + args;
  }
  static nlohmann::json json_of(const RunResult& r) {
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << dump(r);
    return j;
  }
  static std::string* root_;
};
std::string* GenerateOutput::root_ = nullptr;

TEST_F(GenerateOutput, ThinkingUnderItsHeaderAndJsonFieldsApart) {
  RunResult t = run_ds41(gen("--thinking --max-tokens 12"));
  ASSERT_EQ(t.exit_code, 0) << dump(t);
  EXPECT_EQ(t.out.rfind("--- thinking ---\n", 0), 0u) << t.out;
  EXPECT_EQ(t.out.find("\033["), std::string::npos) << "no ANSI when stdout is not a terminal";
  RunResult raw = run_ds41(gen("--thinking --max-tokens 12 --raw"));
  ASSERT_EQ(raw.exit_code, 0) << dump(raw);
  EXPECT_EQ(raw.out.find("--- thinking ---"), std::string::npos) << raw.out;
  EXPECT_EQ("--- thinking ---\n" + raw.out, t.out);

  RunResult j = run_ds41(gen("--thinking --max-tokens 12 --json"));
  ASSERT_EQ(j.exit_code, 0) << dump(j);
  const auto o = json_of(j);
  EXPECT_EQ(o["reasoning_content"].get<std::string>() + "\n", raw.out);
  EXPECT_EQ(o["content"], "");
  EXPECT_TRUE(o["tool_calls"].is_array());
  EXPECT_EQ(o["token_ids"].size(), 12u);
  EXPECT_EQ(o["completion_tokens"], 12);
  EXPECT_EQ(o["finish_reason"], "length");
  EXPECT_EQ(o["reasoning_complete"], false);
  EXPECT_GT(o["prompt_tokens"].get<int>(), 3);
  EXPECT_TRUE(o["timing"].contains("decode_tokens_per_s")) << o.dump();

  RunResult c = run_ds41(gen("--chat --max-tokens 12 --json"));
  ASSERT_EQ(c.exit_code, 0) << dump(c);
  const auto co = json_of(c);
  EXPECT_EQ(co["reasoning_content"], "");
  EXPECT_FALSE(co["content"].get<std::string>().empty()) << co.dump();
}

// --stop: the output ends before the first occurrence of a stop string taken from the middle of
// the unstopped output; other stop strings that never occur change nothing.
TEST_F(GenerateOutput, StopStringsEndTheOutput) {
  RunResult full = run_ds41(gen("--chat --max-tokens 24 --json"));
  ASSERT_EQ(full.exit_code, 0) << dump(full);
  const std::string text = json_of(full)["content"];
  ASSERT_GT(text.size(), 12u) << text;
  // Two whole UTF-8 characters from the middle, without shell quotes or newlines.
  auto lead = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80; };
  std::string stop;
  for (size_t b = text.size() / 2; b < text.size() && stop.empty(); ++b) {
    if (!lead(b)) continue;
    size_t e = b + 1, chars = 1;
    while (e < text.size() && (chars < 2 || !lead(e))) {
      if (lead(e)) ++chars;
      ++e;
    }
    const std::string cand = text.substr(b, e - b);
    if (chars == 2 && cand.find_first_of("'\n\r") == std::string::npos) stop = cand;
  }
  ASSERT_FALSE(stop.empty()) << text;
  const std::string expected = text.substr(0, text.find(stop));
  RunResult s = run_ds41(gen("--chat --max-tokens 24 --json --stop never-here --stop '" + stop + "'"));
  ASSERT_EQ(s.exit_code, 0) << dump(s);
  const auto o = json_of(s);
  EXPECT_EQ(o["content"], expected) << "stop '" << stop << "' in " << text;
  EXPECT_EQ(o["finish_reason"], "stop");
  EXPECT_EQ(o["stop"], stop);
  EXPECT_LT(o["completion_tokens"].get<int>(), 24);
  RunResult plain = run_ds41(gen("--chat --max-tokens 24 --stop '" + stop + "'"));
  ASSERT_EQ(plain.exit_code, 0) << dump(plain);
  EXPECT_EQ(plain.out, expected + "\n");
  RunResult empty = run_ds41(gen("--stop ''"));
  EXPECT_EQ(empty.exit_code, 2) << dump(empty);
  EXPECT_NE(empty.err.find("--stop"), std::string::npos) << dump(empty);
}

// Without --seed the seed is random and printed; giving it back reproduces the output.
TEST_F(GenerateOutput, RandomSeedIsPrintedAndReproduces) {
  const std::string args = "--max-tokens 16 --temperature 1.5";
  RunResult a = run_ds41(gen(args)), b = run_ds41(gen(args));
  ASSERT_EQ(a.exit_code, 0) << dump(a);
  ASSERT_EQ(b.exit_code, 0) << dump(b);
  const size_t p = a.err.find("seed: ");
  ASSERT_NE(p, std::string::npos) << a.err;
  EXPECT_NE(a.err.find("(random"), std::string::npos) << a.err;
  const std::string seed = a.err.substr(p + 6, a.err.find_first_not_of("0123456789", p + 6) - (p + 6));
  EXPECT_NE(a.err.substr(p, 26), b.err.substr(b.err.find("seed: "), 26)) << "two runs, one seed";
  RunResult c = run_ds41(gen(args + " --seed " + seed));
  ASSERT_EQ(c.exit_code, 0) << dump(c);
  EXPECT_EQ(c.out, a.out);
}

// Penalties change the processed logits; --logprobs N gives each token's log-probability and top N
// in --json (greedy: the chosen token is the most likely one); bad values are usage errors.
TEST_F(GenerateOutput, PenaltiesAndLogprobs) {
  RunResult plain = run_ds41(gen("--max-tokens 24 --json --logprobs 3"));
  ASSERT_EQ(plain.exit_code, 0) << dump(plain);
  const auto o = json_of(plain);
  ASSERT_EQ(o["logprobs"].size(), o["token_ids"].size()) << o.dump();
  for (const auto& t : o["logprobs"]) {
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["id"], t["id"]);
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
  }
  // The repetition penalty rescales the prompt tokens' logits, so the log-softmax normaliser
  // and the first token's log-probability move (the random model never repeats greedily).
  RunResult pen = run_ds41(gen("--max-tokens 24 --json --logprobs 3 --repetition-penalty 3"));
  ASSERT_EQ(pen.exit_code, 0) << dump(pen);
  EXPECT_NE(json_of(pen)["logprobs"][0]["logprob"], o["logprobs"][0]["logprob"]);
  for (const char* bad_c : {"--repetition-penalty 0", "--presence-penalty 3", "--frequency-penalty -2.5",
                            "--logprobs 21 --json", "--logprobs 2"}) {
    const std::string bad = bad_c;
    RunResult r = run_ds41(gen(bad));
    EXPECT_EQ(r.exit_code, 2) << bad << dump(r);
    EXPECT_NE(r.err.find(bad.substr(0, bad.find(' '))), std::string::npos) << dump(r);
  }
}

// Ctrl-C (SIGINT) during decoding (once text has been streamed) ends generation cleanly: exit 130, the text
// so far and the timing line, in human units (no 7.5e-05 s).
TEST_F(GenerateOutput, CtrlCStopsCleanlyWithTheTimingLine) {
  const std::string base = *root_ + "/sigint";
  const std::string cmd = "(" + kDs41 + " generate --model " + *root_ + "/m --tokenizer " + kTok +
                          " --prompt 'Tell me a story' --max-tokens 1000000 > " + base + ".out 2> " + base +
                          ".err & pid=$!; for i in $(seq 600); do [ -s " + base +
                          ".out ] && break; sleep 0.1; done; sleep 0.5; kill -INT $pid; wait $pid)";
  const int st = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  EXPECT_EQ(r.exit_code, 130) << dump(r);
  EXPECT_NE(r.err.find("interrupted"), std::string::npos) << dump(r);
  const size_t d = r.err.find("decode: ");
  ASSERT_NE(d, std::string::npos) << dump(r);
  EXPECT_GT(std::stol(r.err.substr(d + 8)), 0) << dump(r);
  EXPECT_FALSE(r.out.empty());
  const std::string timing = r.err.substr(r.err.find("prefill: "));
  EXPECT_EQ(timing.find("e-0"), std::string::npos) << timing;
  EXPECT_TRUE(timing.find(" ms (") != std::string::npos || timing.find(" µs (") != std::string::npos ||
              timing.find(" s (") != std::string::npos)
      << timing;
}

// On a terminal (a pseudo-terminal from util-linux `script`) the thinking text is dimmed and the
// style reset at the end; the header is the same.
TEST_F(GenerateOutput, ThinkingIsDimmedOnATerminal) {
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "no `script` to make a pty";
  const std::string base = *root_ + "/pty";
  const std::string cmd =
      "script -qec \"" + kDs41 + " generate --model " + *root_ + "/m --tokenizer " + kTok +
      " --prompt hi --thinking --max-tokens 4 --seed 1\" /dev/null < /dev/null > " + base + ".out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string out = slurp(base + ".out");
  const size_t h = out.find("--- thinking ---");
  ASSERT_NE(h, std::string::npos) << out;
  EXPECT_NE(out.find("\033[2m", h), std::string::npos) << out;
  EXPECT_NE(out.find("\033[0m", h), std::string::npos) << out;
}

}  // namespace
}  // namespace ds41::testing_cli
