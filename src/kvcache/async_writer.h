// ds41 kvcache: moves persistent-tier writes off the request path. A bounded queue (by block
// count and by bytes) feeds a fixed set of writer threads that call DiskTier::put; a full queue
// either rejects the submission at once (kReject: the caller drops the block, it is only a cache)
// or blocks the submitter up to a deadline (kBlock: back-pressure). Completion callbacks run on a
// writer thread with the put's Status — ok means the block is durably published (acknowledged).
// Group commit: each thread takes a batch of queued blocks and calls DiskTier::put_batch (one
// directory fsync per directory per batch); a batch's callbacks run only after that.
//
// Why dedicated threads and not core::ThreadPool: the writers are long-lived consumers that
// block for most of their life (on the queue when idle, in fsync when busy) for as long as the
// store is open. ThreadPool runs a blocking parallel_for over a known range and returns; parking
// its workers in this loop would take them from every other parallel_for (restores, the CPU
// backend) for the life of the store. So the writer owns its threads: started in the
// constructor, joined in the destructor after the queue drains.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kvcache/disk_tier.h"
#include "kvcache/metrics.h"
#include "kvcache/store_config.h"

namespace ds41::kvcache {

struct BlockWrite {
  BlockKey key;
  uint32_t token_count = 0;
  std::vector<uint8_t> payload;
  // Optional; called exactly once from a writer thread with the put's Status. Not called when
  // submit() itself returns an error (the caller already has it).
  std::function<void(const Status&)> done;
};

enum class SubmitMode { kReject, kBlock };

class AsyncWriter {
 public:
  // `tier` and `metrics` must outlive the writer. Config is validated (DS41_CHECK on invalid:
  // call AsyncWriterConfig::validate() first, KvStore does).
  AsyncWriter(DiskTier& tier, const AsyncWriterConfig& config, MetricsRegistry& metrics);
  // Finishes every queued write, then joins the threads.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Queues a write. kReject: kResourceExhausted when the queue is full. kBlock: waits for room up
  // to timeout_ms (real time), then kResourceExhausted. kFailedPrecondition after shutdown began.
  // A single payload larger than queue_bytes is accepted only into an empty queue.
  Status submit(BlockWrite write, SubmitMode mode = SubmitMode::kReject, int64_t timeout_ms = 1000);

  // Blocks until every write submitted before the call has completed.
  void drain();

  size_t queued_blocks() const;
  uint64_t queued_bytes() const;

 private:
  void worker();

  DiskTier& tier_;
  AsyncWriterConfig config_;
  mutable std::mutex mu_;  // guards queue_, queued_bytes_, in_flight_, stop_
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::condition_variable idle_;
  std::deque<BlockWrite> queue_;
  uint64_t queued_bytes_ = 0;
  int in_flight_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;

  Gauge& depth_;
  Gauge& depth_bytes_;
  Counter& rejected_;
  Counter& blocked_;
  Counter& completed_ok_;
  Counter& completed_err_;
};

}  // namespace ds41::kvcache
