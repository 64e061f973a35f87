// ds41: the single binary. Sub-commands register themselves (tools/cli_registry.h).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_header.h"
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

namespace {

constexpr const char* kVersion = "0.1.0";

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The closest candidate within a third of the word's length (at least 2 edits), or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

// After a parse error: walks argv along the sub-command tree and names the closest sub-command
// or long flag for the first word that is neither. "" when there is nothing to suggest.
std::string did_you_mean(CLI::App& app, int argc, char** argv) {
  CLI::App* cur = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string tok = argv[i];
    if (tok == "--") break;
    if (tok.rfind("--", 0) == 0) {
      const std::string name = tok.substr(0, tok.find('='));
      std::vector<std::string> longs;
      bool known = false;
      for (CLI::App* a = cur; a != nullptr; a = a->get_parent())
        for (const CLI::Option* o : a->get_options()) {
          for (const auto& l : o->get_lnames()) {
            longs.push_back("--" + l);
            known = known || name == "--" + l;
          }
        }
      if (known) continue;
      const std::string s = closest(name, longs);
      if (!s.empty()) return "did you mean '" + s + "'?";
      continue;
    }
    if (tok[0] == '-') continue;
    std::vector<std::string> subs;
    CLI::App* next = nullptr;
    for (CLI::App* s : cur->get_subcommands([](CLI::App*) { return true; })) {
      subs.push_back(s->get_name());
      if (s->get_name() == tok) next = s;
    }
    if (next != nullptr) {
      cur = next;
      continue;
    }
    // An option's value or a positional argument of a command that takes one.
    if (subs.empty() || (cur != &app && cur->get_require_subcommand_min() == 0)) continue;
    const std::string s = closest(tok, subs);
    if (!s.empty()) return "did you mean '" + s + "'?";
    return "";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ds41::cli;
  // `ds41 help [CMD...]` is `ds41 [CMD...] --help`.
  std::vector<char*> args(argv, argv + argc);
  static char help_flag[] = "--help";
  if (args.size() >= 2 && std::string(args[1]) == "help") {
    args.erase(args.begin() + 1);
    args.push_back(help_flag);
  }
  argc = static_cast<int>(args.size());
  argv = args.data();

  CLI::App app{"ds41 — DeepSeek-V4.1-Flash inference engine"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for all sub-commands");
  app.set_version_flag(
      "--version", [] { return std::string("ds41 ") + kVersion + " (git " + bench_git_revision() + ")\n"; });
  // -v / -q are accepted after the sub-command too: sub-commands inherit fallthrough.
  app.fallthrough();
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
    ds41::set_log_level(verbose ? ds41::LogLevel::kDebug
                        : quiet ? ds41::LogLevel::kError
                                : ds41::LogLevel::kInfo);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help); every usage error exits 2 as the registry promises
    // (CLI11's own codes, e.g. 106 for a missing sub-command, are not part of our interface).
    const int rc = app.exit(e);
    if (rc == 0) return 0;
    const std::string hint = did_you_mean(app, argc, argv);
    if (!hint.empty()) std::fprintf(stderr, "ds41: %s\n", hint.c_str());
    return 2;
  }
  return exit_code;
}
