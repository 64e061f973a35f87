// ds41 CLI: load progress line (see load_progress.h).
#include "load_progress.h"

#include <unistd.h>

#include <cmath>

#include "core/log.h"

namespace ds41::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

}  // namespace

std::string format_load_progress(uint64_t done, uint64_t total, double elapsed_s) {
  const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  std::string s = human_bytes(static_cast<double>(done)) + " / " + human_bytes(static_cast<double>(total));
  char buf[96];
  std::snprintf(buf, sizeof buf, " (%.0f%%)", std::floor(pct));
  s += buf;
  if (elapsed_s > 0 && done > 0) {
    const double rate = static_cast<double>(done) / elapsed_s;
    s += ", " + human_bytes(rate) + "/s";
    if (done < total) {
      std::snprintf(buf, sizeof buf, ", ETA %.1f s", static_cast<double>(total - done) / rate);
      s += buf;
    } else {
      std::snprintf(buf, sizeof buf, ", %.1f s", elapsed_s);
      s += buf;
    }
  }
  return s;
}

std::string format_step_progress(uint64_t done, uint64_t total, double elapsed_s, const std::string& unit) {
  const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%llu / %llu %s (%.0f%%)", static_cast<unsigned long long>(done),
                static_cast<unsigned long long>(total), unit.c_str(), std::floor(pct));
  std::string s = buf;
  if (elapsed_s > 0 && done > 0) {
    const double rate = static_cast<double>(done) / elapsed_s;
    if (done < total)
      std::snprintf(buf, sizeof buf, ", %.2f %s/s, ETA %.1f s", rate, unit.c_str(),
                    static_cast<double>(total - done) / rate);
    else
      std::snprintf(buf, sizeof buf, ", %.2f %s/s, %.1f s", rate, unit.c_str(), elapsed_s);
    s += buf;
  }
  return s;
}

LoadProgress::LoadProgress(std::FILE* out, Mode mode, std::string label)
    : out_(out), mode_(mode), label_(std::move(label)), start_(std::chrono::steady_clock::now()) {}

LoadProgress::LoadProgress(std::FILE* out, Mode mode, std::string label, std::string unit)
    : out_(out),
      mode_(mode),
      label_(std::move(label)),
      unit_(std::move(unit)),
      start_(std::chrono::steady_clock::now()) {}

LoadProgress::Mode LoadProgress::mode_for_stderr() {
  return mode_for(stderr, log_level() >= LogLevel::kError);
}

LoadProgress::Mode LoadProgress::mode_for(std::FILE* out, bool quiet) {
  if (quiet) return Mode::kQuiet;
  return isatty(fileno(out)) ? Mode::kTerminal : Mode::kLines;
}

std::string LoadProgress::text(uint64_t done, uint64_t total, double elapsed_s) const {
  return unit_.empty() ? format_load_progress(done, total, elapsed_s)
                       : format_step_progress(done, total, elapsed_s, unit_);
}

void LoadProgress::update(uint64_t done, uint64_t total) {
  if (mode_ == Mode::kQuiet || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const bool end = done >= total;
  if (mode_ == Mode::kTerminal) {
    // Redraw at most every 100 ms, and always the final state.
    if (!end && last_decile_ >= 0 && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    last_decile_ = 0;
    std::fprintf(out_, "\r\033[2K%s: %s%s", label_.c_str(), text(done, total, elapsed).c_str(),
                 end ? "\n" : "");
  } else {
    const int decile = total ? static_cast<int>(10 * done / total) : 10;
    if (decile == last_decile_ && !end) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s: %s\n", label_.c_str(), text(done, total, elapsed).c_str());
  }
  std::fflush(out_);
  finished_ = end;
}

}  // namespace ds41::cli
