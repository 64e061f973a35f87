// ds41 engine: PrefixCache — the report's cache design in the request path (issue 13; MODEL_SPEC
// 4.4, 4.5, 5; tech report 3.2.1-3.2.2). The small global KV (890 B/token) is kept in three tiers
// for days, the large SWA state only for minutes, and a lost SWA state is rebuilt by replaying the
// last window instead of recomputing the whole prompt.
//
// Keys. A prompt is cut into blocks of block_tokens (128) and each block has a chain key (src/
// kvcache/block_key.h: XXH3-128 over the model identity, the block size and every token up to
// the block's end), so different models or weights never share blocks. Two key namespaces: the
// exact one, and "approximate" (identity + "+approx") for state that went through a bounded
// replay (blocks emitted after an encoder replay, snapshots of replayed or decoder-replay
// states). An exact consumer never sees approximate state; a replay consumer may use both.
//
// Prompts with images (issue 16): every image-span position carries the same token id, so the
// keys of a request with images also hash each image's content (CacheKeyInput: token ids + image
// spans with their content hashes; docs/formats/kv_block.md "Prompts with images"). Every key of
// such a request (blocks, SWA snapshots and their boundary markers, in-flight registrations) is
// derived that way, so two different images at the same positions share nothing from the
// image's start on; a text-only request keys by its ids alone, as before. The bounded replay
// rebuilds the window from token ids alone: a restore whose replay would read an image-span
// position (EngineInfo::replay_lookback) takes the exact path instead: an SWA snapshot, else
// recompute (counted as "recomputed"). A request with an image without a content hash does not
// use the cache.
//
// Tiers of global-KV blocks, looked up in this order (the walk stops at the first block found
// nowhere):
//   1. engine memory (host memory for the CPU engine; device HBM for the GPU engine): BlockTier
//      with pins (blocks of running and preempted sequences) and LRU among the unpinned;
//   2. the host DRAM tier: BlockTier, LRU; receives what the engine tier evicts;
//   3. the persistent tier (--kv-dir): kvcache::DiskTier, its own LRU above a 72 h retention.
// Blocks found below the engine tier are brought up into it (and pinned by the request). Blocks
// found only in the persistent tier are read off the engine loop thread (block_prefetcher.h): at
// admission start_bring_up() plans the restore and queues the read of those blocks; the request
// is parked (no tokens planned; the others keep stepping) until the loop, at the start of a step,
// takes the finished read, puts its blocks into the DRAM tier and runs restore(), which then finds
// them in memory. A block the read could not serve (absent, corrupt, I/O error) only shortens the
// restore; restore() after start_bring_up() never reads the disk itself.
//
// Reads in flight are shared by block key: a request whose blocks are already being read for
// another request (two requests with the same disk-only prefix admitted together) waits for that
// read instead of reading them again, and reads only the blocks nobody reads yet, in parallel (a
// longer prompt: its own read of the rest). A request parks until every read it waits for is
// back; each read's blocks go into the DRAM tier once and are staged for every waiter, whose
// usage reports them as from disk. A read lives while someone waits for it: an aborted or
// preempted waiter leaves it to the others, and only the last one cancels it. A failed or short
// shared read is a shorter restore for every waiter (the walk stops at the first block missing).
//
// SWA snapshots (state_codec.h payloads in the kvcache block format) live in an SwaPool (DRAM TTL
// pool by default, Redis with --kv-redis) for --kv-swa-ttl. A snapshot at any prefix length L is
// keyed by the chain hash of the first L tokens; to find unaligned ones, a small "marker" entry
// per block boundary lists the snapshot lengths published after it. Lookup tries the last three
// boundaries of the cached block chain and takes the longest snapshot found (an exact restore is
// preferred to a longer replayed one); on a miss: --swa-miss replay (MODEL_SPEC 4.5, approximate)
// from the restored blocks, or recompute (nothing restored; exact).
//
// Publishing: every full block a sequence completes goes to the engine tier at once and to the
// persistent tier through the asynchronous writer (kReject: a full queue drops the write, never
// blocks the loop). Snapshots are published where the engine loop asks (end of the prompt, end of
// the output, boundaries other requests wait for).
//
// Shared prefixes computed once: an admitted request registers the keys of the prompt blocks it
// will compute ("in flight"). A later request whose next blocks are in flight waits (parked)
// for the producer to reach the last shared boundary; the producer stops a prefill chunk there and
// publishes a snapshot, and the waiter then restores blocks + snapshot exactly.
//
// Thread model: used by the engine loop thread only (the memory tiers are loop-thread-only).
// Metrics are atomics in the registry; the disk writer and the block prefetcher have their own
// threads and touch only the persistent tier (DiskTier is thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "engine/block_prefetcher.h"
#include "engine/block_tier.h"
#include "engine/cache_key_input.h"
#include "engine/engine.h"
#include "kvcache/async_writer.h"
#include "kvcache/block_key.h"
#include "kvcache/disk_tier.h"
#include "kvcache/file_io.h"
#include "kvcache/metrics.h"
#include "kvcache/store_config.h"
#include "kvcache/swa_pool.h"

namespace ds41::engine {

enum class SwaMiss { kReplay, kRecompute };
// What happened to the SWA state of a request with cached blocks.
enum class SwaOutcome { kNone, kRestored, kReplayed, kRecomputed };
const char* swa_outcome_name(SwaOutcome o);

struct PrefixCacheConfig {
  std::string model_identity;      // required: model + weights + KV layout (model_identity.h)
  uint64_t model_fingerprint = 0;  // stored in every block header; 0: derived from the identity
  uint32_t block_tokens = 128;
  uint64_t engine_tier_bytes = uint64_t{1} << 30;  // unpinned blocks kept in engine memory
  uint64_t dram_tier_bytes = uint64_t{4} << 30;    // host DRAM tier
  // Persistent tier: used when disk.dir is not empty (disk.capacity_bytes required then).
  kvcache::DiskTierConfig disk;
  kvcache::AsyncWriterConfig writer;
  BlockPrefetcherConfig reader;  // async reads of the persistent tier (block_prefetcher.h)
  kvcache::SwaBackend swa_backend = kvcache::SwaBackend::kDram;
  kvcache::DramSwaPoolConfig dram_swa;
  kvcache::RedisSwaPoolConfig redis;
  int64_t swa_ttl_ns = 300 * kvcache::kNsPerSecond;  // --kv-swa-ttl
  SwaMiss swa_miss = SwaMiss::kReplay;
  // Decoder-replay prefill (MODEL_SPEC 4.4) makes every snapshot approximate.
  bool decoder_replay_prefill = false;
  Status validate() const;
};

// What a restore gave a request (usage fields and metrics).
struct RestoreResult {
  int64_t tokens = 0;  // positions restored: the request's cached_tokens
  int64_t engine_tokens = 0, dram_tokens = 0, disk_tokens = 0;  // full blocks by the tier found in
  int64_t snapshot_tokens = 0;  // the partial last block's tokens, carried by the snapshot
  SwaOutcome swa = SwaOutcome::kNone;
};

// Per-request cache state, owned by the engine loop's request.
struct CacheSession {
  int64_t request_id = 0;
  std::vector<kvcache::BlockKey> keys;   // keys of the sequence's full blocks held (pinned), in order
  int64_t approx_from_block = -1;        // first block in the approximate namespace (-1: none)
  bool approximate = false;              // the state went through a replay (sticky)
  RestoreResult restored;                // of the first admission (usage)
  std::vector<uint8_t> resume_snapshot;  // exported at preemption: the resume is an exact restore
  int64_t wait_boundary = 0;             // parked: waiting for a producer to reach this many tokens
  int64_t wait_producer = -1;
  int64_t inflight_blocks = 0;  // prompt blocks this request registered as in flight
  // Async bring-up: the reads this admission waits for (its own and ones it shares with other
  // requests; the request is parked while any is left), when it parked (clock ns), and the blocks
  // read, staged for this admission's restore(). While disk_via_reader a restore takes
  // persistent-tier blocks from `staged` only.
  std::vector<uint64_t> read_tickets;
  int64_t read_started_ns = 0;
  bool reading() const { return !read_tickets.empty(); }
  bool disk_via_reader = false;
  std::unordered_map<kvcache::BlockKey, BlockBytes, kvcache::BlockKeyHash> staged;
};

class PrefixCache {
 public:
  // Opens the persistent tier (when configured) and the SWA pool. `pool`: optional caller-built
  // SWA pool (tests); null builds the configured one. `io` null: POSIX. clock/metrics/io must
  // outlive the cache.
  static Result<std::unique_ptr<PrefixCache>> create(const PrefixCacheConfig& config, Clock& clock,
                                                     kvcache::MetricsRegistry& metrics,
                                                     kvcache::FileIo* io = nullptr,
                                                     std::unique_ptr<kvcache::SwaPool> pool = nullptr);
  ~PrefixCache();

  const PrefixCacheConfig& config() const { return config_; }
  int64_t block_tokens() const { return config_.block_tokens; }

  // A producer (another running request) will compute blocks this prompt needs: the boundary
  // (tokens) to wait for and the producer's id, or {0, -1}. `limit`: positions a restore may cover.
  std::pair<int64_t, int64_t> shared_prefix_wait(const CacheKeyInput& in, int64_t limit,
                                                 int64_t self_id) const;
  // Registers that `waiter` waits for `producer` to reach `boundary`.
  void want_boundary(int64_t producer, int64_t boundary);
  // The next boundary > computed where `producer` must stop a prefill chunk and publish a
  // snapshot (someone waits there), or 0.
  int64_t next_wanted_boundary(int64_t producer, int64_t computed) const;
  // Whether `producer` is still computing toward `boundary` (registered and in flight).
  bool producer_active(int64_t producer) const;

  // Restores the longest cached prefix of in.tokens[0, limit) into the fresh sequence `seq` (see
  // the file comment) and pins its blocks; a preempted session restores its own snapshot.
  // Registers the blocks of [0, target) that the request will compute as in flight. On any
  // failure the sequence is left fresh and the result says 0 tokens (a cache never fails a
  // request).
  RestoreResult restore(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t limit, int64_t target,
                        CacheSession& s);

  // Async bring-up (the file comment). Call at admission (and when a parked waiter is released)
  // before restore(): when the blocks a restore would use now include some found only in the
  // persistent tier, queues the read of those nobody reads yet, joins the reads in flight of the
  // others, sets s.read_tickets and returns true: park the request until accept_bring_up() says
  // every read is back, then restore(). False: restore() now (nothing to read, no persistent
  // tier, a preempted session's own state, or the read queue is full and no read to join: that
  // restore skips the persistent tier).
  bool start_bring_up(const Engine& engine, const CacheKeyInput& in, int64_t limit, CacheSession& s);
  // Finished reads not yet taken (loop thread, at the start of a step); their blocks are in the
  // DRAM tier. Hand each to every session waiting for it (accept_bring_up).
  std::vector<BlockRead> take_bring_ups();
  // Stages a finished read's blocks for `s` if it waits for that read; true when that was the
  // last read it waited for (restore() now; the time parked goes to the metrics).
  bool accept_bring_up(const BlockRead& read, CacheSession& s);
  // Stops waiting for the session's reads (abort, preemption): a read nobody else waits for is
  // cancelled; drops whatever the session staged.
  void cancel_bring_up(CacheSession& s);
  // Called on a reader thread after each finished read (wakes an idle loop); {} clears it and
  // waits for a call in progress.
  void set_bring_up_listener(std::function<void()> fn);
  // Reads queued, running or finished and not taken.
  size_t bring_ups_outstanding() const { return reader_ ? reader_->outstanding() : 0; }

  // After a step: publishes the full blocks the sequence completed (in.tokens[0, computed)).
  void publish_blocks(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t computed, CacheSession& s);
  // Publishes the SWA snapshot at the sequence's position (= prefix.size()).
  void publish_snapshot(Engine& engine, SeqId seq, const CacheKeyInput& prefix, CacheSession& s);
  // Preemption: keeps the blocks pinned and the snapshot in the session.
  void preempt(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t computed, CacheSession& s);
  // The request is done (finished, aborted, failed): unpins, drops its in-flight registrations.
  void release(CacheSession& s);
  // Before a (re)admission: drops what a previous admission held.
  void reset_for_admission(CacheSession& s);

  // Blocks until every queued persistent write is done or `timeout_ms` passed; true when drained.
  bool drain_writes(int64_t timeout_ms);

  BlockTier& engine_tier() { return engine_tier_; }
  BlockTier& dram_tier() { return dram_tier_; }
  kvcache::DiskTier* disk() { return disk_.get(); }
  kvcache::SwaPool& swa_pool() { return *swa_; }
  // Publishes the tier gauges (call after changes; cheap).
  void update_gauges();

 private:
  PrefixCache(const PrefixCacheConfig& config, Clock& clock, kvcache::MetricsRegistry& metrics,
              kvcache::BlockChainHasher exact, kvcache::BlockChainHasher approx);

  struct Found {
    int64_t blocks = 0;        // leading blocks found in some tier
    int64_t approx_from = -1;  // first block of the approximate namespace
    std::vector<int> tier;     // per block: 0 engine, 1 dram, 2 disk
    std::vector<kvcache::BlockKey> keys;
  };
  // `s`: its staged blocks count as found in the persistent tier; `use_disk`: whether blocks found
  // only in the persistent tier count (a restore after start_bring_up: no).
  Found walk_blocks(const CacheKeyInput& in, int64_t limit, bool allow_approx, const CacheSession& s,
                    bool use_disk) const;
  // Longest verified snapshot at L in [k*B, min((k+1)*B - 1, limit)] for k in the last three
  // boundaries of `f`; its block count is L / B.
  std::optional<std::pair<int64_t, kvcache::SwaBytes>> find_snapshot(const CacheKeyInput& in, int64_t limit,
                                                                     const Found& f, bool allow_approx);
  // Blocks [0, n) into the engine tier (pinned by `s`): from memory, the session's staged blocks,
  // or (unless s.disk_via_reader) read from the persistent tier; false when one is missing/corrupt.
  bool bring_up(const Found& f, int64_t n, CacheSession& s, std::vector<BlockBytes>* out, RestoreResult* r);
  kvcache::SwaBytes swa_get(const kvcache::BlockKey& key);
  void swa_put(const kvcache::BlockKey& key, uint32_t tokens, std::span<const uint8_t> payload);
  kvcache::BlockKey marker_key(const kvcache::BlockKey& boundary_key) const;
  std::vector<uint32_t> marker_lengths(const kvcache::BlockKey& boundary_key);
  const kvcache::BlockChainHasher& hasher(bool approx) const { return approx ? approx_ : exact_; }
  void register_inflight(const CacheKeyInput& in, int64_t from_block, int64_t target, CacheSession& s);
  void unregister_inflight(CacheSession& s);

  PrefixCacheConfig config_;
  Clock& clock_;
  kvcache::BlockChainHasher exact_, approx_;
  BlockTier dram_tier_;
  BlockTier engine_tier_;  // evicts into dram_tier_ (declared after it)
  std::unique_ptr<kvcache::DiskTier> disk_;
  std::unique_ptr<kvcache::SwaPool> swa_;
  std::unique_ptr<kvcache::AsyncWriter> writer_;  // destroyed (drained) before disk_
  std::unique_ptr<BlockPrefetcher> reader_;       // destroyed (joined) before disk_

  // In flight: block key -> producer request id; producer -> its keys; wanted boundaries.
  std::unordered_map<kvcache::BlockKey, int64_t, kvcache::BlockKeyHash> inflight_;
  std::unordered_map<int64_t, std::vector<kvcache::BlockKey>> inflight_by_;
  std::map<int64_t, std::vector<int64_t>> wanted_;  // producer -> boundaries

  // Async reads in flight (submitted, not yet taken): ticket -> its keys and how many sessions
  // wait for it; block key -> the ticket reading it.
  struct SharedRead {
    std::vector<kvcache::BlockKey> keys;
    int64_t waiters = 0;
  };
  std::unordered_map<uint64_t, SharedRead> reads_;
  std::unordered_map<kvcache::BlockKey, uint64_t, kvcache::BlockKeyHash> reading_;
  void forget_read(uint64_t ticket);  // drops reads_[ticket] and its reading_ entries

  kvcache::Counter &lookups_, &hit_requests_, &tok_engine_, &tok_dram_, &tok_disk_, &tok_snapshot_;
  kvcache::Counter &swa_restored_, &swa_replayed_, &swa_recomputed_, &swa_put_, &swa_put_err_, &swa_bad_;
  kvcache::Counter &blocks_published_, &disk_writes_dropped_, &shared_waits_, &restore_failures_;
  kvcache::Counter &evict_engine_, &evict_dram_;
  kvcache::Counter &async_started_, &async_cancelled_, &async_short_, &async_rejected_, &async_blocks_,
      &async_bytes_, &async_wait_us_, &async_joined_;
  kvcache::Histogram& async_wait_s_;
  kvcache::Gauge &g_engine_bytes_, &g_engine_blocks_, &g_dram_bytes_, &g_dram_blocks_, &g_pinned_;
};

}  // namespace ds41::engine
