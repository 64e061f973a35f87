// ds41 kvcache: KvStore wiring and the SWA verification wrapper.
#include "kvcache/kv_store.h"

#include <algorithm>
#include <atomic>

#include "kvcache/dram_swa_pool.h"
#include "kvcache/redis_swa_pool.h"

namespace ds41::kvcache {

KvStore::KvStore(const KvStoreConfig& config, BlockChainHasher hasher, MetricsRegistry& metrics)
    : config_(config),
      hasher_(std::move(hasher)),
      swa_corrupt_(metrics.counter("ds41_kv_swa_checksum_failures_total",
                                   "SWA snapshots that failed verification and were erased")) {}

Result<std::unique_ptr<KvStore>> KvStore::open(const KvStoreConfig& config, FileIo& io, Clock& clock,
                                               MetricsRegistry& metrics) {
  DS41_RETURN_IF_ERROR(config.validate());
  std::unique_ptr<SwaPool> pool;
  if (config.swa_backend == SwaBackend::kDram) {
    DS41_ASSIGN_OR_RETURN(pool, DramSwaPool::create(config.dram, clock, metrics));
  } else {
    DS41_ASSIGN_OR_RETURN(pool, RedisSwaPool::create(config.redis, clock, metrics));
  }
  return open_with_pool(config, io, clock, metrics, std::move(pool));
}

Result<std::unique_ptr<KvStore>> KvStore::open_with_pool(const KvStoreConfig& config0, FileIo& io,
                                                         Clock& clock, MetricsRegistry& metrics,
                                                         std::unique_ptr<SwaPool> swa) {
  KvStoreConfig config = config0;
  config.disk.model_fingerprint = config.model_fingerprint;
  DS41_RETURN_IF_ERROR(config.validate());
  if (!swa) return invalid_argument("kv store: SWA pool must not be null");
  DS41_ASSIGN_OR_RETURN(BlockChainHasher hasher,
                        BlockChainHasher::create(config.model_identity, config.block_tokens));
  std::unique_ptr<KvStore> s(new KvStore(config, std::move(hasher), metrics));
  DS41_ASSIGN_OR_RETURN(s->disk_, DiskTier::open(config.disk, io, clock, metrics));
  s->swa_ = std::move(swa);
  s->writer_ = std::make_unique<AsyncWriter>(*s->disk_, config.writer, metrics);
  return s;
}

PrefixLookupResult KvStore::lookup(std::span<const int32_t> tokens, size_t max_tokens) {
  return lookup_longest_prefix(hasher_, *disk_, swa_.get(), tokens, max_tokens);
}

std::vector<StoredBlock> KvStore::restore(std::span<const BlockKey> keys, ThreadPool* pool) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const int lanes = pool ? std::max(1, pool->size()) : 1;
  const int64_t window = lanes > 1 ? 4 * lanes : 0;
  std::vector<std::optional<StoredBlock>> got(keys.size());
  std::atomic<int64_t> next{0};        // next block to read
  std::atomic<int64_t> prefetched{0};  // blocks [0, prefetched) have had their read-ahead issued
  // Blocks past a miss are useless to the caller. A block the tier does not hold (its index, or a
  // stat for blocks another server wrote) ends the chain before any read, so no lane reads past a
  // known hole however the lanes are scheduled; a read that still fails (corrupt, or removed
  // meanwhile) ends it where it fails.
  int64_t held = 0;
  while (held < n && disk_->contains(keys[held])) ++held;
  std::atomic<int64_t> first_miss{held};
  auto lane = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n && i < first_miss.load();) {
      const int64_t want = std::min(n, std::min(first_miss.load(), i + 1 + window));
      for (int64_t p = prefetched.load(); p < want;) {
        if (prefetched.compare_exchange_weak(p, p + 1)) {
          if (p > i) disk_->prefetch(keys[p]);  // the block being read now needs no hint
          ++p;
        }
      }
      got[i] = disk_->get(keys[i]);
      if (!got[i]) {
        int64_t m = first_miss.load();
        while (i < m && !first_miss.compare_exchange_weak(m, i)) {
        }
      }
    }
  };
  if (lanes > 1)
    pool->parallel_for(lanes, [&](int64_t b, int64_t e) {
      for (int64_t l = b; l < e; ++l) lane();
    });
  else
    lane();
  std::vector<StoredBlock> out;
  out.reserve(keys.size());
  for (auto& g : got) {
    if (!g) break;
    out.push_back(std::move(*g));
  }
  return out;
}

Status KvStore::write_block(const BlockKey& key, uint32_t token_count, std::vector<uint8_t> payload,
                            SubmitMode mode, std::function<void(const Status&)> done) {
  return writer_->submit(BlockWrite{key, token_count, std::move(payload), std::move(done)}, mode);
}

Status KvStore::put_swa_key(const BlockKey& key, uint32_t token_count, std::span<const uint8_t> snapshot) {
  BlockMeta meta{key, BlockKind::kSwaSnapshot, config_.model_fingerprint, token_count};
  return swa_->put_owned(key, encode_block(meta, snapshot));
}

Status KvStore::put_swa(std::span<const int32_t> prefix_tokens, std::span<const uint8_t> snapshot) {
  return put_swa_key(hasher_.prefix_key(prefix_tokens), static_cast<uint32_t>(prefix_tokens.size()),
                     snapshot);
}

std::optional<SwaSnapshot> KvStore::get_swa_key(const BlockKey& key) {
  SwaBytes b = swa_->get(key);
  if (!b) return std::nullopt;
  auto meta = decode_block(*b, BlockMeta{key, BlockKind::kSwaSnapshot, config_.model_fingerprint, 0});
  if (!meta.ok()) {
    if (meta.status().code() == StatusCode::kDataLoss) {
      swa_corrupt_.inc();
      (void)swa_->erase(key);
    }
    return std::nullopt;
  }
  return SwaSnapshot{std::move(b), meta->token_count};
}

std::optional<SwaSnapshot> KvStore::get_swa(std::span<const int32_t> prefix_tokens) {
  return get_swa_key(hasher_.prefix_key(prefix_tokens));
}

}  // namespace ds41::kvcache
