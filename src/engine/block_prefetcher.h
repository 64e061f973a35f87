// ds41 engine: BlockPrefetcher — reads global-KV blocks from the persistent tier (kvcache::DiskTier,
// --kv-dir) off the engine loop thread (issue 13: "blocks found below the top tier are brought up
// asynchronously; the request waits only for its own blocks"). The prefix cache submits, at a
// request's admission, the keys of the leading blocks whose only copy is on disk; a reader thread
// reads them in order (verified reads: DiskTier::get) and posts the payloads to a completion
// queue; the loop thread takes completions at the start of a step and only then touches its
// memory tiers (BlockTier stays loop-thread-only). A listener, called after each completion, wakes
// a loop that sleeps with nothing else to do.
//
// A read stops at the first block it cannot serve (absent, evicted, corrupt and deleted, I/O
// error): the blocks after it are of no use to a prefix restore. That is a shorter result, never an
// error of the request. Queue bounded by reads (at most one per request; the prefix cache shares a
// read between the requests that need its blocks, prefix_cache.h); a full queue refuses at once
// (the caller restores without the persistent tier). cancel() drops a queued read, or the result of
// a running one, so an aborted request leaves nothing behind.
//
// Thread model: submit / cancel / take_completed / set_listener from any thread (the engine loop).
// DiskTier::get, prefetch and contains are safe to call from several threads at once and
// concurrently with the async writer's put_batch: the index is guarded by DiskTier's mutex, file
// I/O runs outside it, a reader sees a block either whole under its final name or not at all
// (atomic publish), and the counters are atomics (KvStore::restore reads from pool threads the same
// way). Why own threads and not core::ThreadPool: like kvcache::AsyncWriter, the readers block (on
// the queue, in the disk) for the cache's lifetime, which would take pool workers from the CPU
// backend's parallel_for.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "engine/block_tier.h"
#include "kvcache/block_key.h"
#include "kvcache/disk_tier.h"

namespace ds41::engine {

struct BlockPrefetcherConfig {
  int threads = 2;         // concurrent reads (requests), each reading its blocks in order
  size_t max_queued = 64;  // reads waiting for a thread before submit() refuses
  Status validate() const;
};

// One finished read.
struct BlockRead {
  uint64_t ticket = 0;
  std::vector<kvcache::BlockKey> keys;  // asked for, in order
  std::vector<BlockBytes> blocks;       // payloads (header stripped) of keys[0, blocks.size())
  uint64_t bytes = 0;                   // payload bytes in `blocks`
  Status status;  // ok: every key read; otherwise why the read stopped at keys[blocks.size()]
};

class BlockPrefetcher {
 public:
  // `tier` must outlive the prefetcher. Config is validated (DS41_CHECK: validate() first).
  BlockPrefetcher(kvcache::DiskTier& tier, const BlockPrefetcherConfig& config);
  // Drops queued reads, waits for the running ones (a block read is bounded I/O), joins.
  ~BlockPrefetcher();
  BlockPrefetcher(const BlockPrefetcher&) = delete;
  BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;

  // Queues a read of `keys` (non-empty); returns its ticket (> 0). kResourceExhausted when
  // max_queued reads are waiting; kFailedPrecondition after shutdown began.
  Result<uint64_t> submit(std::vector<kvcache::BlockKey> keys);
  // Forgets a read: queued -> dropped, running -> its result is discarded, done -> removed.
  // Unknown or already taken tickets are ignored.
  void cancel(uint64_t ticket);
  // The finished reads not yet taken (in completion order).
  std::vector<BlockRead> take_completed();
  // Reads queued, running or finished but not taken.
  size_t outstanding() const;
  // Called (on a reader thread, must not block long) after each read that will be returned by
  // take_completed(). Replacing it waits for a call in progress, so after set_listener({})
  // returns the old listener is never called again.
  void set_listener(std::function<void()> fn);

 private:
  struct Job {
    uint64_t ticket = 0;
    std::vector<kvcache::BlockKey> keys;
  };
  void worker();
  BlockRead read(Job job);

  kvcache::DiskTier& tier_;
  BlockPrefetcherConfig config_;
  mutable std::mutex mu_;  // guards everything below but the listener
  std::condition_variable not_empty_;
  std::deque<Job> queue_;
  std::unordered_set<uint64_t> running_, cancelled_;  // cancelled_ ⊆ running_
  std::deque<BlockRead> done_;
  uint64_t next_ticket_ = 1;
  bool stop_ = false;
  std::mutex listener_mu_;  // held while the listener runs
  std::function<void()> listener_;
  std::vector<std::thread> threads_;
};

}  // namespace ds41::engine
