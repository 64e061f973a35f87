// ds41 CLI: durations in units people read at a glance (12.3 ms, 75.6 µs, 2.41 s), never
// 7.5572e-05 s.
#pragma once

#include <cstdio>
#include <string>

namespace ds41::cli {

inline std::string human_duration(double seconds) {
  char buf[32];
  if (seconds < 0) seconds = 0;
  if (seconds < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f µs", seconds * 1e6);
  else if (seconds < 1)
    std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  else if (seconds < 120)
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  else
    std::snprintf(buf, sizeof buf, "%dm%04.1fs", static_cast<int>(seconds / 60),
                  seconds - 60 * static_cast<int>(seconds / 60));
  return buf;
}

// Tokens per second with three significant digits or one decimal (81.2, 1530, 0.52).
inline std::string human_rate(double per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, per_s >= 100 ? "%.0f" : per_s >= 1 ? "%.1f" : "%.2f", per_s);
  return buf;
}

}  // namespace ds41::cli
