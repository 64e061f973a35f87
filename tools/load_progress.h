// ds41 CLI: load progress for `ds41 serve` / `ds41 chat` (bytes, rate, ETA). On a terminal one
// line is redrawn in place; otherwise plain lines at most every 10% (logs stay short); quiet
// prints nothing. Fed by model::LoadOptions::progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ds41::cli {

// "12.0 MiB / 40.0 MiB (30%), 55.1 MiB/s, ETA 0.5 s" — pure, for the line and for tests.
std::string format_load_progress(uint64_t done, uint64_t total, double elapsed_s);
// "3 / 28 settings (10%), 2.1 settings/s, ETA 11.9 s" — the same for counted steps (benchmarks).
std::string format_step_progress(uint64_t done, uint64_t total, double elapsed_s, const std::string& unit);

class LoadProgress {
 public:
  enum class Mode { kTerminal, kLines, kQuiet };
  // `out` must outlive the object. label prefixes every line ("ds41 serve: loading weights").
  LoadProgress(std::FILE* out, Mode mode, std::string label);
  // Counts steps named `unit` ("runs", "settings") instead of bytes.
  LoadProgress(std::FILE* out, Mode mode, std::string label, std::string unit);
  // Mode for stderr from the global log level: -q (kError and above) is quiet.
  static Mode mode_for_stderr();
  // Mode for stderr: quiet wins, then a terminal check (isatty).
  static Mode mode_for(std::FILE* out, bool quiet);
  // Called with bytes done / total (model::LoadOptions::progress); done == total ends the line.
  void update(uint64_t done, uint64_t total);

 private:
  std::string text(uint64_t done, uint64_t total, double elapsed_s) const;
  std::FILE* out_;
  Mode mode_;
  std::string label_;
  std::string unit_;  // empty: bytes
  std::chrono::steady_clock::time_point start_, last_draw_;
  int last_decile_ = -1;
  bool finished_ = false;
};

}  // namespace ds41::cli
