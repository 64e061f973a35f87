// ds41 kvcache: the two-class KV store facade the engine holds — block-chain hashing, the
// persistent global-KV tier with its async writer, and the SWA snapshot pool (DRAM or Redis per
// config), with SWA values wrapped in the same verified block format as global blocks. Opaque
// byte blocks plus metadata only: no model or token semantics beyond token ids for hashing.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "core/clock.h"
#include "core/thread_pool.h"
#include "kvcache/async_writer.h"
#include "kvcache/block_key.h"
#include "kvcache/disk_tier.h"
#include "kvcache/file_io.h"
#include "kvcache/metrics.h"
#include "kvcache/prefix_lookup.h"
#include "kvcache/store_config.h"
#include "kvcache/swa_pool.h"

namespace ds41::kvcache {

// A verified SWA snapshot; payload() views the stored bytes past the header.
struct SwaSnapshot {
  SwaBytes bytes;
  uint32_t token_count = 0;
  std::span<const uint8_t> payload() const {
    return std::span<const uint8_t>(*bytes).subspan(kBlockHeaderBytes);
  }
};

class KvStore {
 public:
  // Validates `config`, opens the tier (rebuilding its index) and builds the SWA pool.
  // `io`, `clock`, `metrics` must outlive the store.
  static Result<std::unique_ptr<KvStore>> open(const KvStoreConfig& config, FileIo& io, Clock& clock,
                                               MetricsRegistry& metrics);
  // As open(), with a caller-built SWA pool (tests, custom backends).
  static Result<std::unique_ptr<KvStore>> open_with_pool(const KvStoreConfig& config, FileIo& io,
                                                         Clock& clock, MetricsRegistry& metrics,
                                                         std::unique_ptr<SwaPool> swa);

  const BlockChainHasher& hasher() const { return hasher_; }
  PrefixLookupResult lookup(std::span<const int32_t> tokens, size_t max_tokens = 0);

  // Reads the blocks in order and stops at the first miss (the result may be shorter than
  // `keys`). With a pool, every pool thread reads blocks in key order (dynamic assignment) while a
  // read-ahead window of `4 x threads` blocks is prefetched ahead of them, so the disk sees many
  // requests at once; blocks past a miss are not read.
  std::vector<StoredBlock> restore(std::span<const BlockKey> keys, ThreadPool* pool = nullptr);

  // Queues a global-KV block for the persistent tier (see AsyncWriter::submit).
  Status write_block(const BlockKey& key, uint32_t token_count, std::vector<uint8_t> payload,
                     SubmitMode mode = SubmitMode::kReject, std::function<void(const Status&)> done = {});

  // SWA snapshot at the end of `prefix_tokens` (any length).
  Status put_swa(std::span<const int32_t> prefix_tokens, std::span<const uint8_t> snapshot);
  Status put_swa_key(const BlockKey& key, uint32_t token_count, std::span<const uint8_t> snapshot);
  // nullopt on any miss; a snapshot that fails verification is erased and counted.
  std::optional<SwaSnapshot> get_swa(std::span<const int32_t> prefix_tokens);
  std::optional<SwaSnapshot> get_swa_key(const BlockKey& key);

  DiskTier& disk() { return *disk_; }
  AsyncWriter& writer() { return *writer_; }
  SwaPool& swa() { return *swa_; }

 private:
  KvStore(const KvStoreConfig& config, BlockChainHasher hasher, MetricsRegistry& metrics);

  KvStoreConfig config_;
  BlockChainHasher hasher_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<SwaPool> swa_;
  std::unique_ptr<AsyncWriter> writer_;  // declared last: destroyed (drained) first
  Counter& swa_corrupt_;
};

}  // namespace ds41::kvcache
