// Helpers for tests that run the built ds41 binary: run a command, capture stdout/stderr and the
// exit status, and fresh temp directories.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ds41::testing_cli {

inline const std::string kDs41 = std::string(DS41_BINARY_DIR) + "/tools/ds41";

struct RunResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;      // signal number when killed (a crash)
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fresh, empty directory under the test temp dir.
inline std::string fresh_dir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "/ds41_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// Runs `ds41 ARGS` (ARGS already shell-quoted by the caller).
inline RunResult run_ds41(const std::string& args) {
  static int n = 0;
  std::string base =
      std::string(::testing::TempDir()) + "/ds41_run_" + std::to_string(getpid()) + "_" + std::to_string(n++);
  std::string cmd = kDs41 + " " + args + " > " + base + ".out 2> " + base + ".err";
  int st = std::system(cmd.c_str());
  RunResult r;
  if (WIFEXITED(st)) {
    r.exit_code = WEXITSTATUS(st);
    // The shell reports a signal-killed child as 128 + signal.
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

}  // namespace ds41::testing_cli
