// ds41 CLI: human-readable formatting shared by sub-commands' text output.
#pragma once

#include <cstdio>
#include <string>

namespace ds41::cli {

// Decimal (kB, MB, GB: checkpoint and payload sizes, as vendors quote them) or binary units
// (KiB, MiB, GiB: capacities given as --kv-disk-capacity 500G, which parses as powers of 1024).
enum class ByteUnits { kDecimal, kBinary };

inline std::string human_bytes(double b, ByteUnits units) {
  const bool bin = units == ByteUnits::kBinary;
  const char* dec_names[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  const char* bin_names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const double step = bin ? 1024.0 : 1000.0;
  int i = 0;
  while (b >= step && i < 5) {
    b /= step;
    ++i;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, i ? "%.2f %s" : "%.0f %s", b, bin ? bin_names[i] : dec_names[i]);
  return buf;
}

}  // namespace ds41::cli
