// ds41 CLI: where the binary finds files of its repository when no flag names them — the shared
// V4.1 tokenizer (../shared/tokenizer-v41 beside the checkout) and the npm tokenizer oracle
// (tests/tokenizer_oracle). Never relative to the current directory: candidates are the source
// tree the binary was built from (DS41_SOURCE_DIR, set by tools/CMakeLists.txt) and the
// ancestors of the executable's own directory, and a miss names every path tried.
// Header-only (tools/ compiles only main.cpp and cmd_*.cpp).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/status.h"

#ifndef DS41_SOURCE_DIR
#define DS41_SOURCE_DIR ""
#endif

namespace ds41::cli {

inline std::string source_dir() { return DS41_SOURCE_DIR; }

// Directory of the running executable ("" if /proc/self/exe cannot be read).
inline std::string executable_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

// The first of `candidates` holding `file`; NotFound naming `what`, every candidate and `hint`.
inline Result<std::string> first_holding(const std::vector<std::string>& candidates, const std::string& file,
                                         const std::string& what, const std::string& hint) {
  std::string tried;
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(c) / file, ec))
      return std::filesystem::weakly_canonical(c, ec).string();
    tried += (tried.empty() ? "" : ", ") + c;
  }
  return not_found("no " + what + " found (looked for " + file + " in: " + tried + "); " + hint);
}

// `rel` under the source tree, then under each ancestor of the executable's directory that
// holds it as `ancestor_rel` (e.g. build/tools/ds41 -> <checkout>/.. /shared/tokenizer-v41).
inline std::vector<std::string> repo_candidates(const std::string& from_source,
                                                const std::string& from_ancestor) {
  std::vector<std::string> c;
  if (!source_dir().empty()) c.push_back(source_dir() + "/" + from_source);
  const std::string exe = executable_dir();
  if (!exe.empty())
    for (std::filesystem::path p = exe; !p.empty(); p = p.parent_path()) {
      c.push_back((p / from_ancestor).string());
      if (p == p.root_path()) break;
    }
  return c;
}

// Folder holding the shared V4.1 tokenizer.json.
inline Result<std::string> default_tokenizer_dir() {
  return first_holding(repo_candidates("../shared/tokenizer-v41", "shared/tokenizer-v41"), "tokenizer.json",
                       "default tokenizer", "pass --tokenizer");
}

// Folder holding the npm tokenizer oracle (oracle.js).
inline Result<std::string> default_oracle_dir() {
  return first_holding(repo_candidates("tests/tokenizer_oracle", "tests/tokenizer_oracle"), "oracle.js",
                       "tokenizer oracle", "pass --oracle-dir, or --no-js");
}

}  // namespace ds41::cli
