// ds41 engine: BlockPrefetcher (block_prefetcher.h). One mutex over the queue and the completion
// state; the disk is read outside it; the listener runs outside it (under its own mutex).
#include "engine/block_prefetcher.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace ds41::engine {

Status BlockPrefetcherConfig::validate() const {
  if (threads < 1 || threads > 64)
    return invalid_argument("block prefetcher: threads must be in [1, 64], got " + std::to_string(threads));
  if (max_queued < 1) return invalid_argument("block prefetcher: max_queued must be >= 1");
  return ok_status();
}

BlockPrefetcher::BlockPrefetcher(kvcache::DiskTier& tier, const BlockPrefetcherConfig& config)
    : tier_(tier), config_(config) {
  DS41_CHECK(config_.validate().ok(), "BlockPrefetcherConfig must be validated before use");
  for (int i = 0; i < config_.threads; ++i) threads_.emplace_back([this] { worker(); });
}

BlockPrefetcher::~BlockPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  not_empty_.notify_all();
  for (auto& t : threads_) t.join();
}

Result<uint64_t> BlockPrefetcher::submit(std::vector<kvcache::BlockKey> keys) {
  if (keys.empty()) return invalid_argument("block prefetcher: nothing to read");
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return failed_precondition("block prefetcher: shutting down");
    if (queue_.size() >= config_.max_queued)
      return resource_exhausted("block prefetcher: " + std::to_string(queue_.size()) + " reads queued (max " +
                                std::to_string(config_.max_queued) + ")");
    ticket = next_ticket_++;
    queue_.push_back(Job{ticket, std::move(keys)});
  }
  not_empty_.notify_one();
  return ticket;
}

void BlockPrefetcher::cancel(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto q = std::find_if(queue_.begin(), queue_.end(), [&](const Job& j) { return j.ticket == ticket; });
  if (q != queue_.end()) {
    queue_.erase(q);
    return;
  }
  if (running_.count(ticket)) {
    cancelled_.insert(ticket);
    return;
  }
  std::erase_if(done_, [&](const BlockRead& r) { return r.ticket == ticket; });
}

std::vector<BlockRead> BlockPrefetcher::take_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockRead> out(std::make_move_iterator(done_.begin()), std::make_move_iterator(done_.end()));
  done_.clear();
  return out;
}

size_t BlockPrefetcher::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + running_.size() - cancelled_.size() + done_.size();
}

void BlockPrefetcher::set_listener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(fn);
}

BlockRead BlockPrefetcher::read(Job job) {
  BlockRead r;
  r.ticket = job.ticket;
  // Read-ahead hints for the whole chain first: the disk sees every request at once.
  for (const kvcache::BlockKey& k : job.keys) tier_.prefetch(k);
  for (size_t i = 0; i < job.keys.size(); ++i) {
    std::optional<kvcache::StoredBlock> sb = tier_.get(job.keys[i]);
    if (!sb) {
      r.status = not_found(
          "block " + std::to_string(i) + " of " + std::to_string(job.keys.size()) + " (" + job.keys[i].hex() +
          ") is absent, corrupt or unreadable in the persistent tier (ds41_kv_disk_* metrics say which)");
      break;
    }
    auto p = sb->payload();
    r.bytes += p.size();
    r.blocks.push_back(std::make_shared<const std::vector<uint8_t>>(p.begin(), p.end()));
  }
  r.keys = std::move(job.keys);
  return r;
}

void BlockPrefetcher::worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      not_empty_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ (the destructor cleared the queue)
      job = std::move(queue_.front());
      queue_.pop_front();
      running_.insert(job.ticket);
    }
    BlockRead r = read(std::move(job));
    bool deliver = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_.erase(r.ticket);
      deliver = cancelled_.erase(r.ticket) == 0 && !stop_;
      if (deliver) done_.push_back(std::move(r));
    }
    if (deliver) {
      std::lock_guard<std::mutex> lock(listener_mu_);
      if (listener_) listener_();
    }
  }
}

}  // namespace ds41::engine
