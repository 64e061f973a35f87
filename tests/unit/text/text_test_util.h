// ds41 text tests: shared helpers (the V4.1 tokenizer loaded once per test binary, file I/O,
// running a shell command).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "text/tokenizer.h"

namespace ds41::text::testing {

inline std::string shared_tokenizer_path() {
  return std::string(DS41_SHARED_DIR) + "/tokenizer-v41/tokenizer.json";
}

// The V4.1 tokenizer from ../shared/tokenizer-v41 (aborts the test binary if it cannot load).
inline const Tokenizer& v41_tokenizer() {
  static const Tokenizer* t = [] {
    auto r = Tokenizer::from_file(shared_tokenizer_path());
    if (!r.ok()) {
      std::fprintf(stderr, "cannot load %s: %s\n", shared_tokenizer_path().c_str(),
                   r.status().to_string().c_str());
      std::abort();
    }
    return std::move(r).value().release();
  }();
  return *t;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

// Runs `cmd` with /bin/sh; returns the exit status and captures stdout+stderr into *output.
inline int run_command(const std::string& cmd, std::string* output) {
  std::string full = "(" + cmd + ") 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace ds41::text::testing
