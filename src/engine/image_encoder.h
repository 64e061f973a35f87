// ds41 engine: ImageEncoder — the engine loop's image-encoder worker (issue 16, encoder/prefill
// overlap). The loop hands it the images of a request that missed the vision-feature cache; one
// worker thread runs Engine::encode_images on them while the loop thread keeps calling step() for
// the other requests (the GPU engine runs its tower on its own CUDA stream and workspace, the CPU
// engine on the shared thread pool, engine.h "Thread model"). The loop polls the job's ticket each
// step and admits the request's prefill once its span rows are back.
//
// Contract:
//   - submit() never blocks: it refuses with kResourceExhausted once `max_jobs` jobs are queued or
//     running (the bound; the loop keeps the request parked and retries: backpressure).
//   - jobs run one at a time, in submission order (Engine::encode_images calls never overlap).
//   - a job's images are kept alive by the job (shared_ptr), so a request that goes away while its
//     job is queued or running leaks nothing: cancel() makes the worker skip a job not started yet
//     and drop the result of one in progress (an encode in progress is not interrupted).
//   - the listener (set before the first submit; must not block) is called on the worker thread
//     after every job ends, so a sleeping loop wakes up.
//   - stop() (and the destructor) cancels the queued jobs, waits for the one in progress, joins.
//   - time (busy seconds) comes from the injected Clock.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "engine/engine.h"
#include "image/preprocess.h"

namespace ds41::engine {

// One request's images in the encoder. Shared by the loop (which polls it) and the worker.
class EncodeTicket {
 public:
  // The job ended (encoded, failed, or cancelled before it ran).
  bool done() const;
  // The span rows per image (as Engine::encode_images), or the encode's error; once, after done().
  Result<std::vector<std::vector<float>>> take();
  // The request went away: skip the job if it has not started, drop its result otherwise.
  void cancel();
  bool cancelled() const;

 private:
  friend class ImageEncoder;
  mutable std::mutex mu_;
  bool done_ = false, cancelled_ = false;
  Result<std::vector<std::vector<float>>> result_ = unavailable("the image job has not run");
  bool taken_ = false;
  std::vector<std::shared_ptr<const image::PreparedImage>> images_;  // kept alive by the job
};

struct ImageEncoderStats {
  int64_t queued = 0;    // jobs waiting for the worker
  int64_t running = 0;   // 0 or 1: a job is being encoded now
  int64_t jobs = 0;      // jobs finished (ok or error; cancelled-before-start not counted)
  int64_t images = 0;    // images encoded successfully
  int64_t errors = 0;    // jobs that failed
  int64_t rejected = 0;  // submits refused because the queue was full
  int64_t busy_ns = 0;   // time spent in Engine::encode_images (injected clock)
};

class ImageEncoder {
 public:
  // engine and clock must outlive the encoder. max_jobs >= 1: queued + running jobs at most.
  ImageEncoder(Engine* engine, int64_t max_jobs, Clock* clock);
  ~ImageEncoder();  // stop()
  ImageEncoder(const ImageEncoder&) = delete;
  ImageEncoder& operator=(const ImageEncoder&) = delete;

  void set_listener(std::function<void()> fn);
  // Queues the images (none null) as one job; the worker thread starts on the first submit.
  // kResourceExhausted when max_jobs jobs are queued or running; kUnavailable after stop().
  Result<std::shared_ptr<EncodeTicket>> submit(
      std::vector<std::shared_ptr<const image::PreparedImage>> images);
  void stop();
  ImageEncoderStats stats() const;
  int64_t max_jobs() const { return max_jobs_; }

 private:
  void run();

  Engine* const engine_;
  const int64_t max_jobs_;
  Clock* const clock_;
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<EncodeTicket>> queue_;
  bool stopping_ = false;
  std::thread thread_;
  std::mutex join_mu_;  // serializes stop()'s join
  std::function<void()> listener_;
  ImageEncoderStats st_;
};

}  // namespace ds41::engine
