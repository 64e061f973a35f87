// ds41 CLI: registry of sub-commands. Each tools/cmd_*.cpp registers itself with
// DS41_REGISTER_COMMAND (top level: `ds41 NAME`) or DS41_REGISTER_BENCH (`ds41 bench NAME`),
// so adding a command never edits a shared file.
//
// A setup function adds its CLI11 subcommand to `parent` and installs a callback that stores
// the process exit code in `exit_code` (0 ok, 1 runtime error, 2 usage error). Callbacks print
// errors as "ds41 <cmd>: <message>" and never call exit().
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ds41::cli {

using SetupFn = std::function<void(CLI::App& parent, int& exit_code)>;

struct Registration {
  std::string name;
  SetupFn setup;
};

std::vector<Registration>& commands();
std::vector<Registration>& benches();

struct Registrar {
  Registrar(std::vector<Registration>& list, std::string name, SetupFn fn) {
    list.push_back({std::move(name), std::move(fn)});
  }
};

}  // namespace ds41::cli

#define DS41_CLI_CONCAT2_(a, b) a##b
// Registrars are named by __COUNTER__, not __LINE__: a unity batch of tools/ holds several command
// files, whose registrations may sit on the same line number.
#define DS41_CLI_CONCAT_(a, b) DS41_CLI_CONCAT2_(a, b)
#define DS41_REGISTER_COMMAND(name, fn) \
  static ::ds41::cli::Registrar DS41_CLI_CONCAT_(ds41_cmd_reg_, __COUNTER__)(::ds41::cli::commands(), name, fn)
#define DS41_REGISTER_BENCH(name, fn) \
  static ::ds41::cli::Registrar DS41_CLI_CONCAT_(ds41_bench_reg_, __COUNTER__)(::ds41::cli::benches(), name, fn)
