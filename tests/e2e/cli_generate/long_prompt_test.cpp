// `ds41 generate` with a 1 MB prompt (issue 15): through --prompt-file and through stdin the
// whole text is read and tokenized (no shell argument limit), the prefill shows progress in
// tokens on stderr (plain lines off a terminal), and Ctrl-C stops it between chunks (exit 130).
// A 1 MB prompt is ~200K tokens: the tiny model would prefill it for minutes, so the test stops
// it once the first chunk is reported.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


class LongPrompt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(fresh_dir("generate_long_prompt"));
    RunResult r =
        run_ds41("make-checkpoint --preset tiny --seed 1 --tokenizer " + kTok + " --out " + *root_ + "/m");
    ASSERT_EQ(r.exit_code, 0) << dump(r);
    // 1 MiB of words (not one repeated token: the BPE must really work through it).
    std::ofstream f(*root_ + "/p1m.txt", std::ios::binary);
    const char* words[] = {"alpha ", "window ", "expert ", "cache ", "token ", "layer ", "model "};
    uint64_t x = 12345;
    size_t n = 0;
    while (n < (size_t{1} << 20)) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const char* w = words[(x >> 33) % 7];
      f << w;
      n += std::strlen(w);
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  // Starts `generate <input>`, waits for the first prefill progress line, sends SIGINT.
  // `pipe_in` is a shell prefix ("cat FILE |" or ""), `prompt` the prompt flag.
  static RunResult interrupted_run(const std::string& pipe_in, const std::string& prompt,
                                   const std::string& tag) {
    const std::string base = *root_ + "/" + tag;
    const std::string cmd = "(" + pipe_in + " " + kDs41 + " generate --model " + *root_ + "/m --tokenizer " +
                            kTok + " " + prompt + " --max-tokens 1 --seed 1 > " + base + ".out 2> " + base +
                            ".err & pid=$!; for i in $(seq 1200); do grep -q 'prefill: 1024 / ' " + base +
                            ".err 2>/dev/null && break; sleep 0.1; done; kill -INT $pid; wait $pid)";
    const int st = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp(base + ".out");
    r.err = slurp(base + ".err");
    return r;
  }
  static long total_tokens(const std::string& err) {
    std::smatch m;
    static const std::regex re("prefill: 1024 / ([0-9]+) tokens");
    return std::regex_search(err, m, re) ? std::stol(m[1]) : -1;
  }
  static std::string* root_;
};
std::string* LongPrompt::root_ = nullptr;

TEST_F(LongPrompt, OneMegabyteThroughPromptFileAndStdinWithProgressAndCtrlC) {
  const std::string file = *root_ + "/p1m.txt";
  ASSERT_GE(std::filesystem::file_size(file), size_t{1} << 20);
  RunResult f = interrupted_run("", "--prompt-file " + file, "file");
  RunResult s = interrupted_run("cat " + file + " |", "--prompt -", "stdin");
  for (const RunResult* r : {&f, &s}) {
    EXPECT_EQ(r->exit_code, 130) << dump(*r);
    EXPECT_NE(r->err.find("interrupted"), std::string::npos) << dump(*r);
    EXPECT_EQ(r->err.find('\r'), std::string::npos) << "plain lines off a terminal";
  }
  // The whole megabyte was tokenized: ~1 token per word-with-space, 1 MiB / ~6 bytes per word.
  const long nf = total_tokens(f.err), ns = total_tokens(s.err);
  EXPECT_GT(nf, 150000) << dump(f);
  EXPECT_EQ(nf, ns) << "the file and stdin give the same prompt";
  // Short prompts show no progress line.
  RunResult shortp = run_ds41("generate --model " + *root_ + "/m --tokenizer " + kTok +
                              " --prompt 'Hello' --max-tokens 2 --seed 1");
  ASSERT_EQ(shortp.exit_code, 0) << dump(shortp);
  EXPECT_EQ(shortp.err.find("prefill: 0"), std::string::npos);
  EXPECT_EQ(shortp.err.find(" tokens ("), std::string::npos) << shortp.err;
}

}  // namespace
}  // namespace ds41::testing_cli
