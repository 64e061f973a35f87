// ds41 core: a fixed thread pool with a blocking parallel_for. Owned by whoever creates
// it (the CLI / engine); model code receives it, never spawns threads itself.
//
// Concurrency contract: parallel_for may be called from any number of threads at once on the
// same pool, and from inside a running fn (nested). Every call is its own job object (its
// range, its chunk counter, its completion count) in the pool's FIFO of open jobs; idle workers
// take chunks from the oldest open job, and the caller always works through the chunks of its own
// job, so a call makes progress even when every worker is busy (or blocked in a nested call).
// The chunking is a function of (n, size()) only: chunk i of size() is [n*i/size(), n*(i+1)/size()),
// whichever thread runs it, so results never depend on scheduling.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
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
  // Calls fn(begin, end) over [0, n) split into size() contiguous chunks; blocks until every
  // chunk has returned. Safe to call concurrently and re-entrantly (see the header comment).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  // One parallel_for call. Lives on the caller's stack; fields below `fn`/`n`/`parts` are
  // guarded by the pool's mu_.
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n;
    int parts;
    int next = 0;      // next chunk index to hand out
    int finished = 0;  // chunks that have returned
  };
  // Hands out the next chunk of `job` (mu_ held); unlinks the job from the open list when its
  // last chunk is taken. Returns the chunk index.
  int take_chunk_locked(std::list<Job*>::iterator it);
  void worker_loop();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards open_, stop_ and every Job's next/finished
  std::condition_variable work_cv_;  // a job was opened, or stop
  std::condition_variable done_cv_;  // some job's chunk finished
  std::list<Job*> open_;             // jobs with chunks not yet handed out, oldest first
  bool stop_ = false;
};

}  // namespace ds41
