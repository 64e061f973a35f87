// ds41 CLI: the header every `ds41 bench` JSON report starts with (ARCHITECTURE.md "Tests and
// benchmarks": the git revision, the device and the config), built in one place so the four
// benchmarks report the same fields the same way:
//   "bench":        the benchmark's name
//   "git_revision": short hash of the source tree the binary was built from, "-dirty" when
//                   tracked files differ from it, "unknown" outside a git checkout
//   "device":       {"cpu": model name, "cores": online cores} plus the benchmark's own fields
//   "config":       the benchmark's parameters
// Header-only (tools/ compiles only main.cpp and cmd_*.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "resource_paths.h"

namespace ds41::cli {

// First line of a shell command's stdout, trailing newline removed ("" on failure).
inline std::string bench_shell_line(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  if (const size_t nl = out.find('\n'); nl != std::string::npos) out.resize(nl);
  while (!out.empty() && (out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

// The revision of the checkout the binary was built from (not of the current directory).
inline std::string bench_git_revision() {
  const std::string q = "'" + (source_dir().empty() ? executable_dir() : source_dir()) + "'";
  std::string rev = bench_shell_line("git -C " + q + " rev-parse --short HEAD 2>/dev/null");
  if (rev.empty()) return "unknown";
  if (!bench_shell_line("git -C " + q + " status --porcelain --untracked-files=no 2>/dev/null").empty())
    rev += "-dirty";
  return rev;
}

inline std::string bench_cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown";
}

// {"bench", "git_revision", "device", "config"}; `device_extra` fields are appended to the common
// device fields. Json is nlohmann::json or nlohmann::ordered_json (whichever the report uses).
template <class Json = nlohmann::ordered_json>
Json bench_header(const std::string& bench, const Json& device_extra, const Json& config) {
  Json h;
  h["bench"] = bench;
  h["git_revision"] = bench_git_revision();
  Json dev;
  dev["cpu"] = bench_cpu_model();
  dev["cores"] = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  if (device_extra.is_object())
    for (auto it = device_extra.begin(); it != device_extra.end(); ++it) dev[it.key()] = it.value();
  h["device"] = std::move(dev);
  h["config"] = config;
  return h;
}

}  // namespace ds41::cli
