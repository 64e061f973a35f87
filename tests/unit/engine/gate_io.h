// Test support: GateIo — a FileIo (over PosixIo) whose reads wait while the test holds the gate, so
// a test can keep a persistent-tier block read in flight for as long as it needs and see what the
// engine loop does meanwhile. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "kvcache/file_io.h"
#include "kvcache/posix_io.h"

namespace ds41::testing {

class GateIo final : public kvcache::ForwardingIo {
 public:
  GateIo() : ForwardingIo(kvcache::PosixIo::instance()) {}
  // From now on pread() waits (every call) until release().
  void hold() {
    std::lock_guard<std::mutex> lk(mu_);
    held_gate_ = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      held_gate_ = false;
    }
    cv_.notify_all();
  }
  // Waits until at least `n` reads are waiting at the gate; false after `timeout`.
  bool wait_held(int n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return waiting_ >= n; });
  }
  int waiting() const {
    std::lock_guard<std::mutex> lk(mu_);
    return waiting_;
  }
  // preads that went through (after the gate) so far.
  int reads() const {
    std::lock_guard<std::mutex> lk(mu_);
    return reads_;
  }

  Result<size_t> pread(int fd, void* buf, size_t n, uint64_t offset) override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (held_gate_) {
        ++waiting_;
        cv_.notify_all();
        cv_.wait(lk, [&] { return !held_gate_; });
        --waiting_;
      }
      ++reads_;
    }
    return base_.pread(fd, buf, n, offset);
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool held_gate_ = false;
  int waiting_ = 0, reads_ = 0;
};

}  // namespace ds41::testing
