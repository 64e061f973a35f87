// ds41 engine: PrefixCache (prefix_cache.h).
#include "engine/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "engine/state_codec.h"
#include "kvcache/block_format.h"
#include "kvcache/dram_swa_pool.h"
#include "kvcache/posix_io.h"
#include "kvcache/redis_swa_pool.h"

namespace ds41::engine {

using kvcache::BlockKey;

const char* swa_outcome_name(SwaOutcome o) {
  switch (o) {
    case SwaOutcome::kRestored: return "restored";
    case SwaOutcome::kReplayed: return "replayed";
    case SwaOutcome::kRecomputed: return "recomputed";
    default: return "none";
  }
}

Status PrefixCacheConfig::validate() const {
  if (model_identity.empty()) return invalid_argument("prefix cache: model_identity is required");
  if (block_tokens == 0) return invalid_argument("prefix cache: block_tokens must be > 0");
  if (swa_ttl_ns <= 0) return invalid_argument("--kv-swa-ttl must be > 0");
  if (!disk.dir.empty()) DS41_RETURN_IF_ERROR(disk.validate());
  DS41_RETURN_IF_ERROR(writer.validate());
  DS41_RETURN_IF_ERROR(reader.validate());
  if (swa_backend == kvcache::SwaBackend::kRedis) DS41_RETURN_IF_ERROR(redis.validate());
  return dram_swa.validate();
}

namespace {
constexpr size_t kMarkerMax = 16;  // snapshot lengths remembered per block boundary
constexpr int kBoundariesSearched = 3;

// MODEL_SPEC 4.5 Encoder SWA Bounded Replay (Engine::replay_window) rebuilds the SWA state of a
// prefix of H tokens from token ids alone: an image-span position among those it reads (the
// engine's replay_lookback; 0: unknown, all of them) cannot be rebuilt, so such a restore takes
// the exact path (a snapshot, else recompute).
bool replay_can_rebuild(const Engine& engine, const CacheKeyInput& in, int64_t H) {
  if (in.images.empty()) return true;
  const int64_t lookback = engine.info().replay_lookback;
  return !in.has_image_in(lookback > 0 ? std::max<int64_t>(0, H - lookback) : 0, H);
}

}  // namespace

PrefixCache::PrefixCache(const PrefixCacheConfig& c, Clock& clock, kvcache::MetricsRegistry& m,
                         kvcache::BlockChainHasher exact, kvcache::BlockChainHasher approx)
    : config_(c),
      clock_(clock),
      exact_(std::move(exact)),
      approx_(std::move(approx)),
      dram_tier_(c.dram_tier_bytes, [this](const BlockKey&, BlockBytes) { evict_dram_.inc(); }),
      engine_tier_(c.engine_tier_bytes,
                   [this](const BlockKey& k, BlockBytes b) {
                     evict_engine_.inc();
                     if (config_.dram_tier_bytes > 0) dram_tier_.put(k, std::move(b));
                   }),
      lookups_(m.counter("ds41_prefix_cache_lookups_total", "Requests that looked up the prefix cache")),
      hit_requests_(m.counter("ds41_prefix_cache_hits_total", "Requests that restored at least one token")),
      tok_engine_(m.counter("ds41_prefix_cache_cached_tokens_total",
                            "Prompt tokens restored, by where they came from", {{"tier", "engine"}})),
      tok_dram_(m.counter("ds41_prefix_cache_cached_tokens_total",
                          "Prompt tokens restored, by where they came from", {{"tier", "dram"}})),
      tok_disk_(m.counter("ds41_prefix_cache_cached_tokens_total",
                          "Prompt tokens restored, by where they came from", {{"tier", "disk"}})),
      tok_snapshot_(m.counter("ds41_prefix_cache_cached_tokens_total",
                              "Prompt tokens restored, by where they came from", {{"tier", "swa_snapshot"}})),
      swa_restored_(m.counter("ds41_prefix_cache_swa_total", "SWA state of requests with cached blocks",
                              {{"result", "restored"}})),
      swa_replayed_(m.counter("ds41_prefix_cache_swa_total", "SWA state of requests with cached blocks",
                              {{"result", "replayed"}})),
      swa_recomputed_(m.counter("ds41_prefix_cache_swa_total", "SWA state of requests with cached blocks",
                                {{"result", "recomputed"}})),
      swa_put_(m.counter("ds41_prefix_cache_swa_snapshots_published_total", "SWA snapshots published")),
      swa_put_err_(m.counter("ds41_prefix_cache_swa_publish_errors_total",
                             "SWA snapshots the pool refused (too large, node down)")),
      swa_bad_(m.counter("ds41_prefix_cache_swa_rejected_total",
                         "SWA snapshots found but unusable (corrupt, other layout, import failed)")),
      blocks_published_(m.counter("ds41_prefix_cache_blocks_published_total",
                                  "Global-KV blocks published into the engine tier")),
      disk_writes_dropped_(m.counter("ds41_prefix_cache_disk_writes_dropped_total",
                                     "Blocks not queued for the persistent tier (write queue full)")),
      shared_waits_(m.counter("ds41_prefix_cache_shared_prefix_waits_total",
                              "Requests that waited for another request computing their prefix")),
      restore_failures_(m.counter("ds41_prefix_cache_restore_failures_total",
                                  "Restores abandoned after an engine error (the request recomputed)")),
      evict_engine_(m.counter("ds41_prefix_cache_evictions_total", "Blocks evicted (LRU, unpinned)",
                              {{"tier", "engine"}})),
      evict_dram_(m.counter("ds41_prefix_cache_evictions_total", "Blocks evicted (LRU, unpinned)",
                            {{"tier", "dram"}})),
      async_started_(m.counter("ds41_prefix_cache_async_bring_ups_total",
                               "Admissions parked while blocks found only in the persistent tier were read "
                               "off the engine loop thread")),
      async_cancelled_(
          m.counter("ds41_prefix_cache_async_bring_ups_cancelled_total",
                    "Async bring-ups dropped before they were used (request aborted or preempted)")),
      async_short_(m.counter("ds41_prefix_cache_async_read_failures_total",
                             "Async bring-ups that came back short (a block absent, corrupt or unreadable): "
                             "a shorter restore")),
      async_rejected_(
          m.counter("ds41_prefix_cache_async_reads_rejected_total",
                    "Admissions restored without the persistent tier because the read queue was full")),
      async_blocks_(m.counter("ds41_prefix_cache_async_read_blocks_total",
                              "Blocks read from the persistent tier off the engine loop thread")),
      async_bytes_(m.counter("ds41_prefix_cache_async_read_bytes_total",
                             "Payload bytes read from the persistent tier off the engine loop thread")),
      async_wait_us_(
          m.counter("ds41_prefix_cache_async_wait_microseconds_total",
                    "Time requests spent parked on an async bring-up, summed over the finished ones")),
      async_joined_(m.counter("ds41_prefix_cache_async_reads_joined_total",
                              "Async bring-ups that waited for a read another request had started instead "
                              "of reading those blocks again")),
      async_wait_s_(m.histogram("ds41_prefix_cache_async_wait_seconds",
                                "Time a request spent parked on an async bring-up (finished ones)",
                                kvcache::latency_bounds_seconds())),
      g_engine_bytes_(m.gauge("ds41_prefix_cache_bytes", "Block payload bytes held", {{"tier", "engine"}})),
      g_engine_blocks_(m.gauge("ds41_prefix_cache_blocks", "Blocks held", {{"tier", "engine"}})),
      g_dram_bytes_(m.gauge("ds41_prefix_cache_bytes", "Block payload bytes held", {{"tier", "dram"}})),
      g_dram_blocks_(m.gauge("ds41_prefix_cache_blocks", "Blocks held", {{"tier", "dram"}})),
      g_pinned_(m.gauge("ds41_prefix_cache_pinned_blocks",
                        "Engine-tier blocks pinned by running or preempted requests")) {}

PrefixCache::~PrefixCache() = default;

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(const PrefixCacheConfig& config0, Clock& clock,
                                                         kvcache::MetricsRegistry& metrics,
                                                         kvcache::FileIo* io,
                                                         std::unique_ptr<kvcache::SwaPool> pool) {
  PrefixCacheConfig config = config0;
  if (config.model_fingerprint == 0)
    config.model_fingerprint = XXH3_64bits(config.model_identity.data(), config.model_identity.size()) | 1;
  config.disk.model_fingerprint = config.model_fingerprint;
  config.dram_swa.ttl_ns = config.swa_ttl_ns;
  config.redis.ttl_ns = config.swa_ttl_ns;
  DS41_RETURN_IF_ERROR(config.validate());
  DS41_ASSIGN_OR_RETURN(auto exact,
                        kvcache::BlockChainHasher::create(config.model_identity, config.block_tokens));
  DS41_ASSIGN_OR_RETURN(
      auto approx, kvcache::BlockChainHasher::create(config.model_identity + "+approx", config.block_tokens));
  std::unique_ptr<PrefixCache> pc(
      new PrefixCache(config, clock, metrics, std::move(exact), std::move(approx)));
  if (!config.disk.dir.empty()) {
    kvcache::FileIo& fio = io ? *io : kvcache::PosixIo::instance();
    DS41_ASSIGN_OR_RETURN(pc->disk_, kvcache::DiskTier::open(config.disk, fio, clock, metrics));
    pc->writer_ = std::make_unique<kvcache::AsyncWriter>(*pc->disk_, config.writer, metrics);
    pc->reader_ = std::make_unique<BlockPrefetcher>(*pc->disk_, config.reader);
  }
  if (pool) {
    pc->swa_ = std::move(pool);
  } else if (config.swa_backend == kvcache::SwaBackend::kRedis) {
    DS41_ASSIGN_OR_RETURN(pc->swa_, kvcache::RedisSwaPool::create(config.redis, clock, metrics));
  } else {
    DS41_ASSIGN_OR_RETURN(pc->swa_, kvcache::DramSwaPool::create(config.dram_swa, clock, metrics));
  }
  return pc;
}

void PrefixCache::update_gauges() {
  g_engine_bytes_.set(static_cast<int64_t>(engine_tier_.bytes()));
  g_engine_blocks_.set(static_cast<int64_t>(engine_tier_.blocks()));
  g_dram_bytes_.set(static_cast<int64_t>(dram_tier_.bytes()));
  g_dram_blocks_.set(static_cast<int64_t>(dram_tier_.blocks()));
  g_pinned_.set(static_cast<int64_t>(engine_tier_.pinned_blocks()));
}

// ---------------------------------------------------------------- SWA pool access

kvcache::SwaBytes PrefixCache::swa_get(const BlockKey& key) {
  kvcache::SwaBytes b = swa_->get(key);
  if (!b) return nullptr;
  auto meta = kvcache::decode_block(
      *b, kvcache::BlockMeta{key, kvcache::BlockKind::kSwaSnapshot, config_.model_fingerprint, 0});
  if (!meta.ok()) {
    swa_bad_.inc();
    if (meta.status().code() == StatusCode::kDataLoss) (void)swa_->erase(key);
    return nullptr;
  }
  return b;
}

void PrefixCache::swa_put(const BlockKey& key, uint32_t tokens, std::span<const uint8_t> payload) {
  kvcache::BlockMeta meta{key, kvcache::BlockKind::kSwaSnapshot, config_.model_fingerprint, tokens};
  Status st = swa_->put_owned(key, kvcache::encode_block(meta, payload), config_.swa_ttl_ns);
  if (!st.ok()) swa_put_err_.inc();
}

BlockKey PrefixCache::marker_key(const BlockKey& k) const {
  // A key no chain hash produces on purpose: the boundary's key with fixed bits flipped.
  return BlockKey{k.hi ^ 0x5357414d41524b31ULL /* "SWAMARK1" */, k.lo ^ 0x6473343173776121ULL};
}

std::vector<uint32_t> PrefixCache::marker_lengths(const BlockKey& boundary_key) {
  std::vector<uint32_t> out;
  kvcache::SwaBytes b = swa_get(marker_key(boundary_key));
  if (!b) return out;
  std::span<const uint8_t> p = std::span<const uint8_t>(*b).subspan(kvcache::kBlockHeaderBytes);
  for (size_t i = 0; i + 4 <= p.size() && out.size() < kMarkerMax; i += 4) {
    uint32_t v = 0;
    std::memcpy(&v, p.data() + i, 4);
    out.push_back(v);
  }
  return out;
}

// ---------------------------------------------------------------- lookup

PrefixCache::Found PrefixCache::walk_blocks(const CacheKeyInput& in, int64_t limit, bool allow_approx,
                                            const CacheSession& s, bool use_disk) const {
  const int64_t B = config_.block_tokens;
  const int64_t nmax = std::max<int64_t>(0, limit) / B;
  Found f;
  if (nmax == 0) return f;
  const CacheKeyInput span = in.first(nmax * B);
  std::vector<BlockKey> ek = span.chain_keys(exact_), ak;
  auto where = [&](const BlockKey& k) -> int {
    if (engine_tier_.contains(k)) return 0;
    if (dram_tier_.contains(k)) return 1;
    if (s.staged.count(k)) return 2;
    if (use_disk && disk_ && disk_->contains(k)) return 2;
    return -1;
  };
  for (int64_t i = 0; i < nmax; ++i) {
    int t = -1;
    if (f.approx_from < 0) {
      t = where(ek[i]);
      if (t >= 0) {
        f.keys.push_back(ek[i]);
      } else if (allow_approx) {
        if (ak.empty()) ak = span.chain_keys(approx_);
        t = where(ak[i]);
        if (t >= 0) {
          f.approx_from = i;
          f.keys.push_back(ak[i]);
        }
      }
    } else {
      t = where(ak[i]);
      if (t >= 0) f.keys.push_back(ak[i]);
    }
    if (t < 0) break;
    f.tier.push_back(t);
    ++f.blocks;
  }
  return f;
}

std::optional<std::pair<int64_t, kvcache::SwaBytes>> PrefixCache::find_snapshot(const CacheKeyInput& in,
                                                                                int64_t limit, const Found& f,
                                                                                bool allow_approx) {
  const int64_t B = config_.block_tokens;
  for (int64_t k = f.blocks; k >= 0 && k > f.blocks - kBoundariesSearched; --k) {
    // Namespaces a snapshot at a length in block k may come from: past the first approximate
    // block only the approximate one; otherwise exact, then approximate when allowed.
    std::vector<bool> spaces;
    if (f.approx_from >= 0 && k > f.approx_from) {
      spaces = {true};
    } else {
      spaces = {false};
      if (allow_approx) spaces.push_back(true);
    }
    const int64_t hi = std::min(limit, (k + 1) * B - 1);
    std::optional<std::pair<int64_t, kvcache::SwaBytes>> best;
    for (bool approx : spaces) {
      const kvcache::BlockChainHasher& h = hasher(approx);
      std::vector<int64_t> lens;
      if (k > 0 && k * B <= limit) lens.push_back(k * B);
      const BlockKey boundary = in.first(k * B).prefix_key(h);
      for (uint32_t L : marker_lengths(boundary))
        if (static_cast<int64_t>(L) > k * B && static_cast<int64_t>(L) <= hi) lens.push_back(L);
      std::sort(lens.rbegin(), lens.rend());
      for (int64_t L : lens) {
        if (best && L <= best->first) break;
        const BlockKey key = in.first(L).prefix_key(h);
        kvcache::SwaBytes b = swa_get(key);
        if (!b) continue;
        auto info = peek_swa_snapshot(std::span<const uint8_t>(*b).subspan(kvcache::kBlockHeaderBytes));
        if (!info.ok() || info->position != L || info->block_tokens != B ||
            ((info->flags & kSwaFlagApproximate) && !allow_approx)) {
          swa_bad_.inc();
          continue;
        }
        best = {L, std::move(b)};
        break;
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

bool PrefixCache::bring_up(const Found& f, int64_t n, CacheSession& s, std::vector<BlockBytes>* out,
                           RestoreResult* r) {
  const int64_t B = config_.block_tokens;
  for (int64_t i = 0; i < n; ++i) {
    const BlockKey& k = f.keys[i];
    BlockBytes b = engine_tier_.get(k);
    int tier = 0;
    // Read from the persistent tier for this admission (usage says disk), also when a request
    // that shared the read restored first and the block is in the engine tier by now.
    if (auto st = s.staged.find(k); st != s.staged.end()) {
      if (!b) b = st->second;
      tier = 2;
    }
    if (!b) {
      b = dram_tier_.get(k);
      tier = 1;
    }
    if (!b && disk_ && !s.disk_via_reader) {
      std::optional<kvcache::StoredBlock> sb = disk_->get(k);
      if (sb) {
        auto p = sb->payload();
        b = std::make_shared<const std::vector<uint8_t>>(p.begin(), p.end());
      }
      tier = 2;
    }
    if (!b) return false;  // evicted or corrupt since the walk (a corrupt block was deleted)
    engine_tier_.put(k, b);
    engine_tier_.pin(k);
    s.keys.push_back(k);
    out->push_back(std::move(b));
    (tier == 0 ? r->engine_tokens : tier == 1 ? r->dram_tokens : r->disk_tokens) += B;
  }
  return true;
}

// ---------------------------------------------------------------- in flight / shared prefixes

std::pair<int64_t, int64_t> PrefixCache::shared_prefix_wait(const CacheKeyInput& in, int64_t limit,
                                                            int64_t self_id) const {
  const int64_t B = config_.block_tokens;
  const int64_t nmax = std::max<int64_t>(0, limit) / B;
  if (nmax == 0 || inflight_.empty()) return {0, -1};
  std::vector<BlockKey> keys = in.first(nmax * B).chain_keys(exact_);
  int64_t i = 0;
  while (i < nmax && (engine_tier_.contains(keys[i]) || dram_tier_.contains(keys[i]) ||
                      (disk_ && disk_->contains(keys[i]))))
    ++i;
  int64_t j = i, producer = -1;
  for (; j < nmax; ++j) {
    auto it = inflight_.find(keys[j]);
    if (it == inflight_.end() || it->second == self_id || (producer >= 0 && it->second != producer)) break;
    producer = it->second;
  }
  if (j == i) return {0, -1};
  return {j * B, producer};
}

void PrefixCache::want_boundary(int64_t producer, int64_t boundary) {
  auto& v = wanted_[producer];
  if (std::find(v.begin(), v.end(), boundary) == v.end()) v.push_back(boundary);
  shared_waits_.inc();
}

int64_t PrefixCache::next_wanted_boundary(int64_t producer, int64_t computed) const {
  auto it = wanted_.find(producer);
  if (it == wanted_.end()) return 0;
  int64_t best = 0;
  for (int64_t b : it->second)
    if (b > computed && (best == 0 || b < best)) best = b;
  return best;
}

bool PrefixCache::producer_active(int64_t producer) const { return inflight_by_.count(producer) != 0; }

void PrefixCache::register_inflight(const CacheKeyInput& in, int64_t from_block, int64_t target,
                                    CacheSession& s) {
  const int64_t B = config_.block_tokens;
  const int64_t n = target / B;
  if (s.approx_from_block >= 0 || n <= from_block) return;  // approximate blocks: nobody exact waits
  std::vector<BlockKey> keys = in.first(n * B).chain_keys(exact_);
  auto& mine = inflight_by_[s.request_id];
  for (int64_t i = from_block; i < n; ++i) {
    if (inflight_.count(keys[i]) || engine_tier_.contains(keys[i])) continue;
    inflight_[keys[i]] = s.request_id;
    mine.push_back(keys[i]);
  }
  if (mine.empty()) inflight_by_.erase(s.request_id);
  s.inflight_blocks = static_cast<int64_t>(n - from_block);
}

void PrefixCache::unregister_inflight(CacheSession& s) {
  auto it = inflight_by_.find(s.request_id);
  if (it != inflight_by_.end()) {
    for (const BlockKey& k : it->second) {
      auto f = inflight_.find(k);
      if (f != inflight_.end() && f->second == s.request_id) inflight_.erase(f);
    }
    inflight_by_.erase(it);
  }
  wanted_.erase(s.request_id);
}

// ---------------------------------------------------------------- restore / publish

void PrefixCache::reset_for_admission(CacheSession& s) {
  unregister_inflight(s);
  for (const BlockKey& k : s.keys) engine_tier_.unpin(k);
  s.keys.clear();
  s.approx_from_block = -1;
  s.wait_boundary = 0;
  s.wait_producer = -1;
}

RestoreResult PrefixCache::restore(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t limit,
                                   int64_t target, CacheSession& s) {
  const int64_t B = config_.block_tokens;
  RestoreResult r;
  // What an async bring-up staged is used by this restore only (it stays in the DRAM tier).
  struct Unstage {
    CacheSession& s;
    ~Unstage() {
      s.staged.clear();
      s.disk_via_reader = false;
    }
  } unstage{s};
  // A preempted request: its blocks are still pinned and its snapshot is in the session.
  if (!s.resume_snapshot.empty()) {
    std::vector<uint8_t> snap = std::move(s.resume_snapshot);
    s.resume_snapshot.clear();
    auto info = peek_swa_snapshot(snap);
    if (info.ok() && info->position <= limit && info->position / B <= static_cast<int64_t>(s.keys.size())) {
      const int64_t n = info->position / B;
      std::vector<BlockBytes> held;
      for (int64_t i = 0; i < n; ++i) held.push_back(engine_tier_.get(s.keys[i]));
      if (std::all_of(held.begin(), held.end(), [](const BlockBytes& b) { return b != nullptr; })) {
        std::vector<std::span<const uint8_t>> v;
        for (const BlockBytes& b : held) v.emplace_back(*b);
        if (engine.import_state(seq, v, snap, B).ok()) {
          for (int64_t i = n; i < static_cast<int64_t>(s.keys.size()); ++i) engine_tier_.unpin(s.keys[i]);
          s.keys.resize(static_cast<size_t>(n));
          r.tokens = info->position;
          r.engine_tokens = n * B;
          r.snapshot_tokens = r.tokens - n * B;
          r.swa = SwaOutcome::kRestored;
          return r;
        }
      }
    }
    restore_failures_.inc();
  }
  reset_for_admission(s);
  lookups_.inc();
  const bool allow_approx = config_.swa_miss == SwaMiss::kReplay || config_.decoder_replay_prefill;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = RestoreResult{};
    Found f = walk_blocks(in, limit, allow_approx, s, !s.disk_via_reader);
    auto snap = find_snapshot(in, limit, f, allow_approx);
    int64_t n = 0;
    if (snap) {
      n = snap->first / B;
    } else if (f.blocks > 0 && config_.swa_miss == SwaMiss::kReplay &&
               replay_can_rebuild(engine, in, f.blocks * B)) {
      n = f.blocks;
    } else {
      r.swa = f.blocks > 0 ? SwaOutcome::kRecomputed : SwaOutcome::kNone;
      break;
    }
    std::vector<BlockBytes> blocks;
    if (!bring_up(f, n, s, &blocks, &r)) {
      for (const BlockKey& k : s.keys) engine_tier_.unpin(k);
      s.keys.clear();
      continue;  // a block vanished or was corrupt (and deleted): look up again
    }
    std::vector<std::span<const uint8_t>> views;
    for (const BlockBytes& b : blocks) views.emplace_back(*b);
    std::span<const uint8_t> payload;
    if (snap) payload = std::span<const uint8_t>(*snap->second).subspan(kvcache::kBlockHeaderBytes);
    Status st = engine.import_state(seq, views, payload, B);
    if (st.ok() && !snap) st = engine.replay_window(seq, in.tokens.first(static_cast<size_t>(n * B)));
    if (!st.ok()) {
      // The sequence may hold part of the import: the caller recreates it (r.tokens == 0 and
      // seq position != 0 tell it to).
      log_warn("prefix_cache", "restore of " + std::to_string(n * B) + " tokens failed: " + st.message());
      restore_failures_.inc();
      if (snap) swa_bad_.inc();
      for (const BlockKey& k : s.keys) engine_tier_.unpin(k);
      s.keys.clear();
      r = RestoreResult{};
      break;
    }
    if (snap) {
      const bool approx_snap = (peek_swa_snapshot(payload)->flags & kSwaFlagApproximate) != 0;
      r.tokens = snap->first;
      r.snapshot_tokens = r.tokens - n * B;
      r.swa = SwaOutcome::kRestored;
      if (f.approx_from >= 0 && f.approx_from < n) s.approx_from_block = f.approx_from;
      if (approx_snap || s.approx_from_block >= 0) {
        s.approximate = true;
        if (s.approx_from_block < 0) s.approx_from_block = n;
      }
    } else {
      r.tokens = n * B;
      r.swa = SwaOutcome::kReplayed;
      s.approximate = true;
      s.approx_from_block = f.approx_from >= 0 ? f.approx_from : n;
    }
    break;
  }
  if (config_.decoder_replay_prefill) s.approximate = true;
  // Metrics.
  if (r.tokens > 0) hit_requests_.inc();
  tok_engine_.inc(static_cast<uint64_t>(r.engine_tokens));
  tok_dram_.inc(static_cast<uint64_t>(r.dram_tokens));
  tok_disk_.inc(static_cast<uint64_t>(r.disk_tokens));
  tok_snapshot_.inc(static_cast<uint64_t>(r.snapshot_tokens));
  if (r.swa == SwaOutcome::kRestored) swa_restored_.inc();
  if (r.swa == SwaOutcome::kReplayed) swa_replayed_.inc();
  if (r.swa == SwaOutcome::kRecomputed) swa_recomputed_.inc();
  register_inflight(in, r.tokens / B, target, s);
  update_gauges();
  return r;
}

// ---------------------------------------------------------------- async bring-up

bool PrefixCache::start_bring_up(const Engine& engine, const CacheKeyInput& in, int64_t limit, CacheSession& s) {
  cancel_bring_up(s);
  if (!reader_) return false;
  s.disk_via_reader = true;  // from here on, this admission's restore never reads the disk itself
  if (!s.resume_snapshot.empty()) return false;  // a preempted session restores its pinned blocks
  const int64_t B = config_.block_tokens;
  const bool allow_approx = config_.swa_miss == SwaMiss::kReplay || config_.decoder_replay_prefill;
  const Found f = walk_blocks(in, limit, allow_approx, s, /*use_disk=*/true);
  if (std::find(f.tier.begin(), f.tier.end(), 2) == f.tier.end()) return false;
  // The blocks restore() would use: as many as the snapshot covers, else all (replay), else none.
  int64_t n = 0;
  if (auto snap = find_snapshot(in, limit, f, allow_approx)) {
    n = snap->first / B;
  } else if (config_.swa_miss == SwaMiss::kReplay && replay_can_rebuild(engine, in, f.blocks * B)) {
    n = f.blocks;  // as restore() decides (a replay window over image positions recomputes)
  }
  std::vector<BlockKey> keys;
  for (int64_t i = 0; i < n; ++i)
    if (f.tier[i] == 2) keys.push_back(f.keys[i]);
  if (keys.empty()) {
    // Nothing to read: the restore uses memory tiers only, or nothing (no snapshot and --swa-miss
    // recompute). It may look at the persistent tier's index again so that blocks found there
    // still count as a recompute (a lookup, no read).
    s.disk_via_reader = false;
    return false;
  }
  // Blocks another request's read brings up already: wait for that read (once per read). The
  // rest: one read of our own, in parallel with the shared ones.
  const int64_t parked_ns = clock_.now_mono_ns();  // before a reader can start on it
  std::vector<uint64_t> tickets;
  std::vector<BlockKey> own;
  for (const BlockKey& k : keys) {
    auto r = reading_.find(k);
    if (r == reading_.end())
      own.push_back(k);
    else if (std::find(tickets.begin(), tickets.end(), r->second) == tickets.end())
      tickets.push_back(r->second);
  }
  const bool joined = !tickets.empty();
  if (!own.empty()) {
    Result<uint64_t> ticket = reader_->submit(own);
    if (ticket.ok()) {
      for (const BlockKey& k : own) reading_[k] = *ticket;
      reads_[*ticket] = SharedRead{std::move(own), 0};
      tickets.push_back(*ticket);
    } else {
      async_rejected_.inc();  // the blocks of the shared reads only, if any
    }
  }
  if (tickets.empty()) return false;
  for (uint64_t t : tickets) ++reads_[t].waiters;
  if (joined) async_joined_.inc();
  s.read_tickets = std::move(tickets);
  s.read_started_ns = parked_ns;
  async_started_.inc();
  return true;
}

void PrefixCache::forget_read(uint64_t ticket) {
  auto r = reads_.find(ticket);
  if (r == reads_.end()) return;
  for (const BlockKey& k : r->second.keys) {
    auto it = reading_.find(k);
    if (it != reading_.end() && it->second == ticket) reading_.erase(it);
  }
  reads_.erase(r);
}

std::vector<BlockRead> PrefixCache::take_bring_ups() {
  if (!reader_) return {};
  std::vector<BlockRead> reads = reader_->take_completed();
  for (const BlockRead& read : reads) {
    forget_read(read.ticket);  // from now on these blocks are in memory (or not to be had)
    async_blocks_.inc(read.blocks.size());
    async_bytes_.inc(read.bytes);
    if (!read.status.ok()) {
      async_short_.inc();
      log_debug("prefix_cache", "async read " + std::to_string(read.ticket) +
                                    " came back short: " + read.status.message());
    }
    // Into the DRAM tier once: requests with this prefix admitted later find it in memory.
    if (config_.dram_tier_bytes > 0)
      for (size_t i = 0; i < read.blocks.size(); ++i) dram_tier_.put(read.keys[i], read.blocks[i]);
  }
  if (!reads.empty()) update_gauges();
  return reads;
}

bool PrefixCache::accept_bring_up(const BlockRead& read, CacheSession& s) {
  auto it = std::find(s.read_tickets.begin(), s.read_tickets.end(), read.ticket);
  if (read.ticket == 0 || it == s.read_tickets.end()) return false;
  s.read_tickets.erase(it);
  // Staged for this session even when the DRAM tier cannot keep them (its restore needs them).
  for (size_t i = 0; i < read.blocks.size(); ++i) s.staged[read.keys[i]] = read.blocks[i];
  if (!s.read_tickets.empty()) return false;
  const int64_t waited_ns = std::max<int64_t>(0, clock_.now_mono_ns() - s.read_started_ns);
  async_wait_us_.inc(static_cast<uint64_t>(waited_ns / 1000));
  async_wait_s_.observe(static_cast<double>(waited_ns) * 1e-9);
  return true;
}

void PrefixCache::cancel_bring_up(CacheSession& s) {
  if (s.reading()) {
    for (uint64_t t : s.read_tickets) {
      auto r = reads_.find(t);
      if (r == reads_.end()) continue;  // taken already
      if (--r->second.waiters > 0) continue;  // others still wait for it: it goes on
      if (reader_) reader_->cancel(t);
      forget_read(t);
    }
    async_cancelled_.inc();
    s.read_tickets.clear();
  }
  s.staged.clear();
  s.disk_via_reader = false;
}

void PrefixCache::set_bring_up_listener(std::function<void()> fn) {
  if (reader_) reader_->set_listener(std::move(fn));
}

void PrefixCache::publish_blocks(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t computed,
                                 CacheSession& s) {
  const int64_t B = config_.block_tokens;
  const int64_t have = static_cast<int64_t>(s.keys.size()), full = computed / B;
  if (full <= have) return;
  for (int64_t i = have; i < full; ++i) {
    const bool approx = s.approx_from_block >= 0 && i >= s.approx_from_block;
    const BlockKey key = in.first((i + 1) * B).prefix_key(hasher(approx));
    auto payload = engine.export_kv_block(seq, i, B);
    if (!payload.ok()) {
      log_warn("prefix_cache", "block export failed: " + payload.status().message());
      return;
    }
    BlockBytes bytes = std::make_shared<const std::vector<uint8_t>>(std::move(*payload));
    engine_tier_.put(key, bytes);
    engine_tier_.pin(key);
    s.keys.push_back(key);
    blocks_published_.inc();
    // No longer in flight: waiters find it in the engine tier.
    auto f = inflight_.find(key);
    if (f != inflight_.end() && f->second == s.request_id) inflight_.erase(f);
    if (writer_ && !disk_->contains(key)) {
      Status st = writer_->submit(kvcache::BlockWrite{key, static_cast<uint32_t>(B), *bytes, {}},
                                  kvcache::SubmitMode::kReject);
      if (!st.ok()) disk_writes_dropped_.inc();
    }
  }
  update_gauges();
}

void PrefixCache::publish_snapshot(Engine& engine, SeqId seq, const CacheKeyInput& prefix, CacheSession& s) {
  const int64_t B = config_.block_tokens;
  const int64_t L = prefix.size();
  if (L == 0) return;
  auto payload = engine.export_swa_snapshot(seq, B, s.approximate);
  if (!payload.ok()) {
    log_warn("prefix_cache", "snapshot export failed: " + payload.status().message());
    return;
  }
  const kvcache::BlockChainHasher& h = hasher(s.approximate);
  swa_put(prefix.prefix_key(h), static_cast<uint32_t>(L), *payload);
  swa_put_.inc();
  if (L % B != 0) {
    // Remember L under its block boundary so a lookup can find this unaligned snapshot.
    const BlockKey boundary = prefix.first((L / B) * B).prefix_key(h);
    std::vector<uint32_t> lens = marker_lengths(boundary);
    lens.erase(std::remove(lens.begin(), lens.end(), static_cast<uint32_t>(L)), lens.end());
    lens.insert(lens.begin(), static_cast<uint32_t>(L));
    if (lens.size() > kMarkerMax) lens.resize(kMarkerMax);
    std::vector<uint8_t> p(lens.size() * 4);
    std::memcpy(p.data(), lens.data(), p.size());
    swa_put(marker_key(boundary), static_cast<uint32_t>((L / B) * B), p);
  }
  auto w = wanted_.find(s.request_id);
  if (w != wanted_.end()) std::erase(w->second, L);
}

void PrefixCache::preempt(Engine& engine, SeqId seq, const CacheKeyInput& in, int64_t computed,
                          CacheSession& s) {
  publish_blocks(engine, seq, in, computed, s);
  auto snap = engine.export_swa_snapshot(seq, config_.block_tokens, s.approximate);
  if (snap.ok()) s.resume_snapshot = std::move(*snap);
  unregister_inflight(s);  // waiters stop waiting for a preempted producer
}

void PrefixCache::release(CacheSession& s) {
  cancel_bring_up(s);
  unregister_inflight(s);
  for (const BlockKey& k : s.keys) engine_tier_.unpin(k);
  s.keys.clear();
  s.resume_snapshot.clear();
  update_gauges();
}

bool PrefixCache::drain_writes(int64_t timeout_ms) {
  if (!writer_) return true;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (writer_->queued_blocks() > 0) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The queue is empty; blocks being written finish within one group commit.
  writer_->drain();
  return true;
}

}  // namespace ds41::engine
