// `ds41 --version`, `ds41 help CMD`, "did you mean" for a mistyped sub-command or flag, and the
// global -v/-q flags accepted after the sub-command (issue 15, "small things users notice").
#include <gtest/gtest.h>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


TEST(CliUx, VersionPrintsVersionAndGitRevision) {
  RunResult r = run_ds41("--version");
  EXPECT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_EQ(r.out.rfind("ds41 ", 0), 0u) << dump(r);
  EXPECT_TRUE(has(r.out, "(git ")) << dump(r);
  EXPECT_FALSE(has(r.out, "git unknown")) << dump(r);  // the tests run from the checkout
  EXPECT_EQ(r.out.back(), '\n') << dump(r);            // one line (CLI11 adds no newline)
}

TEST(CliUx, HelpCmdIsCmdDashDashHelp) {
  RunResult a = run_ds41("help generate");
  RunResult b = run_ds41("generate --help");
  EXPECT_EQ(a.exit_code, 0) << dump(a);
  EXPECT_EQ(a.out, b.out);
  EXPECT_TRUE(has(a.out, "--max-tokens")) << dump(a);
  RunResult c = run_ds41("help bench load");
  EXPECT_EQ(c.exit_code, 0) << dump(c);
  EXPECT_EQ(c.out, run_ds41("bench load --help").out);
  RunResult d = run_ds41("help");
  EXPECT_EQ(d.exit_code, 0) << dump(d);
  EXPECT_TRUE(has(d.out, "generate")) << dump(d);
}

TEST(CliUx, DidYouMeanForSubCommandsAndFlags) {
  struct Case {
    std::string args, hint;
  } cases[] = {
      {"gneerate --prompt hi", "did you mean 'generate'?"},
      {"bench lod", "did you mean 'load'?"},
      {"generate --model /nonexistent --prompt hi --max-token 3", "did you mean '--max-tokens'?"},
      {"generate --model /nonexistent --prompt hi --temprature=0.5", "did you mean '--temperature'?"},
  };
  for (const auto& c : cases) {
    RunResult r = run_ds41(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << dump(r);
    EXPECT_TRUE(has(r.err, c.hint)) << c.args << "\n" << dump(r);
  }
  // Nothing close: no suggestion, still a usage error.
  RunResult r = run_ds41("xyzzyplugh");
  EXPECT_EQ(r.exit_code, 2) << dump(r);
  EXPECT_FALSE(has(r.err, "did you mean")) << dump(r);
}

TEST(CliUx, VerboseAndQuietAfterTheSubCommand) {
  // Before this, `-v` after the sub-command was "The following arguments were not expected".
  for (const std::string flag : {"-v", "-q", "--verbose", "--quiet"}) {
    RunResult r = run_ds41("generate --model /nonexistent/ds41-model --prompt-ids 0 " + flag);
    EXPECT_NE(r.exit_code, 2) << flag << "\n" << dump(r);
    EXPECT_FALSE(has(r.err, "not expected")) << flag << "\n" << dump(r);
  }
}

TEST(CliUx, ServeKeepAliveTimeoutOutOfRangeIsAUsageError) {
  // Checked before the model loads (the folder does not exist): exit 2 naming the flag.
  for (const std::string v : {"0", "3601"}) {
    RunResult r = run_ds41("serve --model /nonexistent/ds41-model --keep-alive-timeout " + v);
    EXPECT_EQ(r.exit_code, 2) << v << "\n" << dump(r);
    EXPECT_TRUE(has(r.err, "--keep-alive-timeout must be in 1..3600")) << v << "\n" << dump(r);
  }
}

}  // namespace
}  // namespace ds41::testing_cli
