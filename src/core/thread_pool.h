// ds41 core: a fixed thread pool with a blocking parallel_for. Owned by whoever creates
// it (the CLI / engine); model code receives it, never spawns threads itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ds41 {

class ThreadPool {
 public:
  // n_threads <= 1 runs everything inline on the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(begin, end) over [0, n) split into contiguous chunks; blocks until done.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int idx);
  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace ds41
