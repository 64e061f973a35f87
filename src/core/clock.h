// ds41 core: injectable clock. TTL / retention / timing code takes a Clock& so tests can
// advance time without sleeping (ARCHITECTURE.md "Errors, ownership, threads").
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ds41 {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time, nanoseconds since the Unix epoch (for persisted timestamps).
  virtual int64_t now_unix_ns() const = 0;
  // Monotonic time in nanoseconds (for durations and timeouts).
  virtual int64_t now_mono_ns() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t now_unix_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  int64_t now_mono_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // Process-wide instance for production wiring.
  static SystemClock& instance() {
    static SystemClock c;
    return c;
  }
};

// Test clock: time moves only when advance() is called. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_unix_ns = 1'700'000'000'000'000'000LL) : t_(start_unix_ns) {}
  int64_t now_unix_ns() const override { return t_.load(); }
  int64_t now_mono_ns() const override { return t_.load(); }
  void advance_ns(int64_t ns) { t_.fetch_add(ns); }
  void advance_s(double s) { t_.fetch_add(static_cast<int64_t>(s * 1e9)); }

 private:
  std::atomic<int64_t> t_;
};

}  // namespace ds41
