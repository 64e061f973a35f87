// `ds41 make-checkpoint` (issue 15): progress of the bytes written — redrawn in place on a
// terminal (a pseudo-terminal from `script`, Debian bsdutils), plain lines otherwise, nothing with
// -q — and a note when the model it wrote has no tokenizer to generate from text.
#include <gtest/gtest.h>

#include <filesystem>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {



TEST(MakeCheckpointUx, PlainProgressLinesAndTheTokenizerNote) {
  const std::string dir = fresh_dir("mk_plain");
  RunResult r = run_ds41("make-checkpoint --preset tiny --seed 1 --out " + dir + "/m");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_TRUE(has(r.err, "ds41 make-checkpoint: writing: ")) << dump(r);
  EXPECT_TRUE(has(r.err, "(100%)")) << dump(r);
  EXPECT_FALSE(has(r.err, "\r")) << dump(r);  // not a terminal: no redraws
  EXPECT_TRUE(has(r.err, "has no tokenizer")) << dump(r);
  EXPECT_TRUE(has(r.err, "--tokenizer")) << dump(r);

  // With a tokenizer: no note. With -q (before or after the sub-command): no progress.
  RunResult t =
      run_ds41("make-checkpoint --preset tiny --seed 1 --tokenizer " + kTok + " --out " + dir + "/t -q");
  ASSERT_EQ(t.exit_code, 0) << dump(t);
  EXPECT_FALSE(has(t.err, "has no tokenizer")) << dump(t);
  EXPECT_FALSE(has(t.err, "writing: ")) << dump(t);
  RunResult q = run_ds41("-q make-checkpoint --preset tiny --seed 1 --out " + dir + "/q");
  ASSERT_EQ(q.exit_code, 0) << dump(q);
  EXPECT_TRUE(q.err.empty()) << dump(q);
  std::filesystem::remove_all(dir);
}

TEST(MakeCheckpointUx, ProgressRedrawsOnATerminal) {
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "no `script` (bsdutils)";
  const std::string dir = fresh_dir("mk_tty");
  const std::string log = dir + "/typescript";
  // script -q: no start/done lines; -e: its exit status is the command's; -c: the command.
  const std::string cmd = "script -qec \"" + kDs41 + " make-checkpoint --preset tiny --seed 1 --out " + dir +
                          "/m\" " + log + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string out = slurp(log);
  EXPECT_TRUE(has(out, "\r\033[2Kds41 make-checkpoint: writing: ")) << out;
  EXPECT_TRUE(has(out, "(100%)")) << out;
  EXPECT_TRUE(has(out, "/s")) << out;  // a rate
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::testing_cli
