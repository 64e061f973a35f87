// ds41 kvcache: AsyncWriter implementation (mutex + condition variables; no exceptions escape
// a worker: callbacks are user code and must not throw).
#include "kvcache/async_writer.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace ds41::kvcache {

AsyncWriter::AsyncWriter(DiskTier& tier, const AsyncWriterConfig& config, MetricsRegistry& m)
    : tier_(tier),
      config_(config),
      depth_(m.gauge("ds41_kv_write_queue_depth", "Blocks waiting in the persistent-tier write queue")),
      depth_bytes_(m.gauge("ds41_kv_write_queue_bytes", "Payload bytes waiting in the write queue")),
      rejected_(m.counter("ds41_kv_write_queue_rejected_total",
                          "Block writes rejected because the queue was full")),
      blocked_(m.counter("ds41_kv_write_queue_blocked_total", "Submissions that had to wait for queue room")),
      completed_ok_(
          m.counter("ds41_kv_write_completed_total", "Queued block writes completed", {{"result", "ok"}})),
      completed_err_(m.counter("ds41_kv_write_completed_total", "Queued block writes completed",
                               {{"result", "error"}})) {
  DS41_CHECK(config_.validate().ok(), "AsyncWriterConfig must be validated before use");
  for (int i = 0; i < config_.threads; ++i) threads_.emplace_back([this] { worker(); });
}

AsyncWriter::~AsyncWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  not_empty_.notify_all();
  not_full_.notify_all();
  for (auto& t : threads_) t.join();
}

Status AsyncWriter::submit(BlockWrite write, SubmitMode mode, int64_t timeout_ms) {
  const uint64_t bytes = write.payload.size();
  std::unique_lock<std::mutex> lock(mu_);
  auto has_room = [&] {
    if (queue_.empty()) return true;
    return queue_.size() < config_.queue_blocks && queued_bytes_ + bytes <= config_.queue_bytes;
  };
  if (stop_) return failed_precondition("kv async writer: shutting down");
  if (!has_room()) {
    if (mode == SubmitMode::kReject) {
      rejected_.inc();
      return resource_exhausted("kv async writer: queue full (" + std::to_string(queue_.size()) +
                                " blocks, " + std::to_string(queued_bytes_) + " bytes)");
    }
    blocked_.inc();
    bool ok =
        not_full_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return stop_ || has_room(); });
    if (stop_) return failed_precondition("kv async writer: shutting down");
    if (!ok) {
      rejected_.inc();
      return resource_exhausted("kv async writer: queue still full after " + std::to_string(timeout_ms) +
                                " ms");
    }
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(write));
  depth_.set(static_cast<int64_t>(queue_.size()));
  depth_bytes_.set(static_cast<int64_t>(queued_bytes_));
  lock.unlock();
  not_empty_.notify_one();
  return ok_status();
}

void AsyncWriter::worker() {
  std::vector<BlockWrite> batch;
  std::vector<DiskTier::PutRequest> reqs;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    // Group commit: take a share of the queue (at most max_batch) so every thread stays busy.
    const size_t share = (queue_.size() + config_.threads - 1) / static_cast<size_t>(config_.threads);
    const size_t take = std::clamp<size_t>(share, 1, config_.max_batch);
    batch.clear();
    for (size_t i = 0; i < take; ++i) {
      queued_bytes_ -= queue_.front().payload.size();
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    in_flight_ += static_cast<int>(batch.size());
    depth_.set(static_cast<int64_t>(queue_.size()));
    depth_bytes_.set(static_cast<int64_t>(queued_bytes_));
    lock.unlock();
    not_full_.notify_all();

    reqs.clear();
    for (const auto& w : batch) reqs.push_back({w.key, w.token_count, w.payload});
    // Acknowledge only after the whole batch's renames are durable (one dir fsync per directory).
    std::vector<Status> results = tier_.put_batch(reqs);
    for (size_t i = 0; i < batch.size(); ++i) {
      (results[i].ok() ? completed_ok_ : completed_err_).inc();
      if (batch[i].done) batch[i].done(results[i]);
    }

    lock.lock();
    in_flight_ -= static_cast<int>(batch.size());
    if (queue_.empty() && in_flight_ == 0) idle_.notify_all();
  }
}

void AsyncWriter::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && in_flight_ == 0; });
}

size_t AsyncWriter::queued_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

uint64_t AsyncWriter::queued_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_bytes_;
}

}  // namespace ds41::kvcache
