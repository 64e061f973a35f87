// ds41 core: thread pool implementation (per-call job objects; see thread_pool.h).
#include "core/thread_pool.h"

#include <algorithm>

namespace ds41 {

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

static void run_chunk(const std::function<void(int64_t, int64_t)>& fn, int64_t n, int idx, int parts) {
  int64_t b = n * idx / parts, e = n * (idx + 1) / parts;
  if (b < e) fn(b, e);
}

int ThreadPool::take_chunk_locked(std::list<Job*>::iterator it) {
  Job* job = *it;
  int idx = job->next++;
  if (job->next == job->parts) open_.erase(it);
  return idx;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  Job job{&fn, n, n_threads_};
  std::unique_lock<std::mutex> lock(mu_);
  auto it = open_.insert(open_.end(), &job);
  lock.unlock();
  work_cv_.notify_all();
  // The caller works through its own job's chunks until none is left to hand out.
  lock.lock();
  while (job.next < job.parts) {
    int idx = take_chunk_locked(it);
    lock.unlock();
    run_chunk(fn, n, idx, job.parts);
    lock.lock();
    ++job.finished;
  }
  // Chunks taken by workers may still be running: the job must outlive them.
  done_cv_.wait(lock, [&] { return job.finished == job.parts; });
}

void ThreadPool::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !open_.empty(); });
    if (stop_) return;
    auto it = open_.begin();
    Job* job = *it;
    int idx = take_chunk_locked(it);
    lock.unlock();
    run_chunk(*job->fn, job->n, idx, job->parts);
    lock.lock();
    if (++job->finished == job->parts) done_cv_.notify_all();
  }
}

}  // namespace ds41
