// ds41: the single binary. Sub-commands register themselves (tools/cli_registry.h).
#include <algorithm>
#include <cstdio>

#include "cli_registry.h"
#include "core/log.h"

namespace ds41::cli {
std::vector<Registration>& commands() {
  static std::vector<Registration> v;
  return v;
}
std::vector<Registration>& benches() {
  static std::vector<Registration> v;
  return v;
}
}  // namespace ds41::cli

int main(int argc, char** argv) {
  using namespace ds41::cli;
  CLI::App app{"ds41 — DeepSeek-V4.1-Flash inference engine"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for all sub-commands");
  bool verbose = false, quiet = false;
  app.add_flag("-v,--verbose", verbose, "Debug logging");
  app.add_flag("-q,--quiet", quiet, "Only errors");
  int exit_code = 0;

  auto by_name = [](const Registration& a, const Registration& b) { return a.name < b.name; };
  std::sort(commands().begin(), commands().end(), by_name);
  std::sort(benches().begin(), benches().end(), by_name);
  for (auto& r : commands()) r.setup(app, exit_code);
  if (!benches().empty()) {
    CLI::App* bench = app.add_subcommand("bench", "Benchmarks (print JSON with --json)");
    bench->require_subcommand(1);
    for (auto& r : benches()) r.setup(*bench, exit_code);
  }
  app.parse_complete_callback([&] {
    ds41::set_log_level(verbose ? ds41::LogLevel::kDebug : quiet ? ds41::LogLevel::kError : ds41::LogLevel::kInfo);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); every usage error exits 2 as the registry promises
    // (CLI11's own codes, e.g. 106 for a missing sub-command, are not part of our interface).
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
