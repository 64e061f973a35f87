// Runs the built ds41 binary from a chosen working directory (the cwd must not matter to it).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "e2e/checkpoint_cli/cli_util.h"

namespace ds41::testing_cli {

// `cd CWD && ds41 ARGS` (ARGS already shell-quoted by the caller).
inline RunResult run_ds41_in(const std::string& cwd, const std::string& args) {
  static int n = 0;
  const std::string base = std::string(::testing::TempDir()) + "/ds41_runin_" + std::to_string(getpid()) +
                           "_" + std::to_string(n++);
  const std::string cmd =
      "cd '" + cwd + "' && " + kDs41 + " " + args + " > " + base + ".out 2> " + base + ".err";
  const int st = std::system(cmd.c_str());
  RunResult r;
  if (WIFEXITED(st)) {
    r.exit_code = WEXITSTATUS(st);
    if (r.exit_code > 128) r.signal = r.exit_code - 128;
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

// The shared tokenizer folder, and "s contains part" (the folders' test files share these: one
// unity translation unit may hold several of them, CMakeLists.txt "Unity builds").
inline const std::string kTok = std::string(DS41_SHARED_DIR) + "/tokenizer-v41";
inline bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline std::string dump(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

}  // namespace ds41::testing_cli
