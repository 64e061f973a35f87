// ds41 kvcache: the persistent global-KV tier — content-addressed block files in a directory that
// several processes (on one or several machines) may share. Format and cross-process rules:
// docs/formats/kv_block.md. The class is one public face over four parts, each in its own file:
//   disk_tier.cpp               directory layout, index build (scan at open and on rescan),
//                               eviction under the capacity cap (make_room), block paths
//   block_index.h               the index itself: retention (never evict a block younger than the
//                               retention period) and LRU order above it
//   disk_tier_group_commit.cpp  writes: atomic publish of a batch with one directory fsync per
//                               directory, capacity reservation, refused writes when only young
//                               blocks fill the disk
//   disk_tier_verified_read.cpp reads: verified (a corrupt/torn block is a miss and is deleted)
//   disk_tier_admin.cpp         the operator API behind `ds41 kv stats|verify|gc`
// Thread model: put / put_batch / get / prefetch / contains / erase may run on several threads at
// once (the async writer's threads, the prefix cache's block readers, the engine loop's lookups):
// the index is guarded by mu_, file I/O runs outside it, and a reader sees a block whole under its
// final name or not at all (atomic publish).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "kvcache/atomic_publish.h"
#include "kvcache/block_format.h"
#include "kvcache/block_index.h"
#include "kvcache/file_io.h"
#include "kvcache/metrics.h"
#include "kvcache/store_config.h"

namespace ds41::kvcache {

// A verified block read from the tier: the whole file; payload() skips the header.
struct StoredBlock {
  BlockMeta meta;
  std::vector<uint8_t> bytes;
  std::span<const uint8_t> payload() const {
    return std::span<const uint8_t>(bytes).subspan(kBlockHeaderBytes);
  }
};

class DiskTier {
 public:
  // Creates the layout if missing, removes stale temp files, rebuilds the index. `io`, `clock`
  // and `metrics` must outlive the tier.
  static Result<std::unique_ptr<DiskTier>> open(const DiskTierConfig& config, FileIo& io, Clock& clock,
                                                MetricsRegistry& metrics);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Durably publishes one global-KV block (meta.kind must be kGlobalKv; the fingerprint is the
  // tier's). Returns ok once the block is on disk under its final name (or already was: keys are
  // content addresses). kResourceExhausted when capacity is full of blocks under retention (the
  // write is refused, counted and logged) or the disk is full; other I/O errors as kIoError.
  Status put(const BlockKey& key, uint32_t token_count, std::span<const uint8_t> payload);

  // Group commit: publishes every block like put() (temp file, write, fsync, rename) but fsyncs
  // each distinct block directory ONCE for the whole batch, after all renames. Returns one Status
  // per request, in order; an ok Status means data and directory entry are durable. When a
  // directory fsync fails, every block of the batch renamed into that directory gets that error
  // (not acknowledged), even though its file may be visible.
  struct PutRequest {
    BlockKey key;
    uint32_t token_count = 0;
    std::span<const uint8_t> payload;
  };
  std::vector<Status> put_batch(std::span<const PutRequest> requests);

  // Verified read. nullopt = miss: absent, evicted, unreadable, or corrupt/torn (then deleted).
  std::optional<StoredBlock> get(const BlockKey& key);

  // Starts reading the block's file into the page cache without waiting (no verification, no
  // accounting; a missing file is ignored). KvStore::restore keeps a window of these ahead of its
  // readers so the disk sees many requests at once.
  void prefetch(const BlockKey& key);

  // Whether the block is present (index, else the directory: another process may have written
  // it). Does not verify the content (get() does).
  bool contains(const BlockKey& key);

  // Removes a block; ok when absent.
  Status erase(const BlockKey& key);

  // Re-lists the directory and replaces the index (keeps newer access times known in-process).
  Status rescan();

  uint64_t used_bytes() const;
  size_t block_count() const;
  const DiskTierConfig& config() const { return config_; }
  // Final path of a block: <dir>/blocks/<first two hex digits>/<32 hex digits>.kvb
  std::string block_path(const BlockKey& key) const;
  // Wall time the last index build took (open or rescan), ms.
  double last_scan_ms() const { return last_scan_ms_.load(); }

  // ---- Operator API (`ds41 kv stats|verify|gc`). None of these stamps access times. ----

  // One indexed block as the tier sees it (sizes and times from the last index build).
  struct BlockInfo {
    BlockKey key;
    uint64_t bytes = 0;
    int64_t created_ns = 0;  // publish time (file mtime)
    int64_t access_ns = 0;   // last use (file atime)
    bool under_retention = false;
  };
  // Snapshot of the index after ageing it against the clock: blocks past retention first, least
  // recently used first (eviction order), then blocks under retention, oldest first.
  std::vector<BlockInfo> list_blocks();

  struct Usage {
    size_t blocks = 0;
    uint64_t bytes = 0;
    size_t retained_blocks = 0;  // still under retention (never evicted)
    uint64_t retained_bytes = 0;
    int64_t oldest_created_ns = 0;  // 0 when empty
    int64_t newest_created_ns = 0;
    int64_t lru_access_ns = 0;  // least recent access among all blocks; 0 when empty
  };
  Usage usage();

  // Verifies one block file without touching its access time: format, checksum, key and kind.
  // `fingerprint` nullopt accepts whatever model fingerprint the block's header states. A
  // corrupt/torn block is deleted (same inode rule and counters as get()) unless `dry_run`;
  // a block of another fingerprint or format version is incompatible and kept.
  enum class VerifyResult { kOk, kCorrupt, kIncompatible, kMissing, kReadError };
  struct VerifyOutcome {
    VerifyResult result = VerifyResult::kOk;
    Status detail;         // why, for anything but kOk
    BlockMeta meta;        // decoded header when kOk or kIncompatible by fingerprint
    bool deleted = false;  // kCorrupt and the file is gone now
  };
  VerifyOutcome verify_block(const BlockKey& key, std::optional<uint64_t> fingerprint, bool dry_run);

  // Enforces config().capacity_bytes now: evicts blocks past retention, least recently used
  // first, until used <= capacity (the eviction path of put(): make_room). Never touches a block
  // under retention. dry_run lists what would go and changes nothing.
  struct GcReport {
    uint64_t capacity_bytes = 0;
    uint64_t used_before = 0;
    uint64_t used_after = 0;    // projected when dry_run
    size_t evicted_blocks = 0;  // would be evicted when dry_run
    uint64_t evicted_bytes = 0;
    size_t vanished_blocks = 0;               // of evicted: already deleted by another process
    std::vector<BlockInfo> evicted;           // in eviction order
    uint64_t retained_bytes = 0;              // under retention after gc
    bool retention_exceeds_capacity = false;  // under-retention blocks alone exceed capacity
  };
  GcReport collect_garbage(bool dry_run);

 private:
  using Entry = BlockIndex::Entry;
  using Index = BlockIndex::Map;

  // One block of a put_batch between its stages.
  struct Slot {
    uint64_t size = 0;      // header + payload
    int64_t now_ns = 0;     // publish time (mtime = atime)
    bool reserved = false;  // size counted in reserved_bytes_
    bool present = false;   // already on disk (content address): nothing to write
    PendingPublish pub;     // temp file, open between stage and commit
    std::string dir;        // final directory, for the group directory fsync
  };
  // Stage 1 of a put: limits, dedup by content address, capacity reservation (or refusal), the
  // temp file written with writeback started. Non-ok = this block is done (failed/refused).
  Status stage_block(const PutRequest& r, Slot* slot);
  // After commit_temp_file (or its failure): releases the reservation, updates index + metrics.
  Status finish_block(const PutRequest& r, Slot* slot, Status committed);

  DiskTier(const DiskTierConfig& config, FileIo& io, Clock& clock, MetricsRegistry& metrics);
  Status init_layout();
  Status remove_stale_temps();
  // Unlinks a temp file whose mtime is older than stale_tmp_age (a crashed writer's); true if removed.
  bool remove_if_abandoned(const std::string& path, int64_t mtime_ns, int64_t now_ns);
  // Lists and stats the 256 block directories in parallel (a ThreadPool of scan_threads, made
  // for the scan: it runs at open and on rescan only).
  Result<Index> scan_directory();
  void install_index(Index index);  // replaces the index (mu_ held by caller)

  // Index maintenance with the gauges kept in step (mu_ held).
  void index_insert(const BlockKey& key, const Entry& e);
  void index_remove(const BlockKey& key);
  void update_gauges();
  // Frees space until used + reserved + incoming <= capacity by evicting LRU blocks older than
  // retention. Returns false when that is impossible. mu_ held; drops it around file deletes.
  bool make_room(std::unique_lock<std::mutex>& lock, uint64_t incoming);

  void note_corrupt(const BlockKey& key, const std::string& path, const FileStat& st, const Status& why);
  // Temp name for a block's in-flight write, in the block's own directory:
  // <dir>/blocks/<hh>/.<32 hex>.<host>.<pid>.<instance>.<seq>.tmp
  std::string temp_path(const BlockKey& key);
  std::string temp_path_in(const std::string& dir, const BlockKey& key);
  void maybe_rescan();

  DiskTierConfig config_;
  FileIo& io_;
  Clock& clock_;
  std::string blocks_dir_;
  std::string tmp_dir_;

  mutable std::mutex mu_;  // guards index_, reserved_bytes_
  BlockIndex index_;
  uint64_t reserved_bytes_ = 0;  // in-flight writes that already passed the capacity check

  std::atomic<uint64_t> temp_seq_{0};
  std::atomic<bool> rescanning_{false};
  std::atomic<int64_t> last_rescan_mono_ns_{0};
  std::atomic<double> last_scan_ms_{0};
  std::atomic<int64_t> last_refuse_log_ns_{0};

  Counter& hits_;
  Counter& misses_;
  Counter& read_bytes_;
  Counter& written_bytes_;
  Counter& writes_;
  Counter& write_dedup_;
  Counter& write_errors_;
  Counter& refused_;
  Counter& checksum_failures_;
  Counter& incompatible_;
  Counter& read_errors_;
  Counter& evict_lru_;
  Counter& evict_corrupt_;
  Counter& evict_external_;
  Gauge& used_gauge_;
  Gauge& blocks_gauge_;
  Gauge& scan_ms_gauge_;
};

}  // namespace ds41::kvcache
