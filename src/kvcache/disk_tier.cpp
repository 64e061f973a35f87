// ds41 kvcache: DiskTier implementation. File I/O always happens outside mu_; the index is a
// per-process view of the shared directory, corrected lazily (a missing file is dropped, a file
// written by another process is adopted on first sight, a rescan reconciles everything).
#include "kvcache/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/log.h"

namespace ds41 {
namespace {

constexpr const char* kLayoutMarker = "ds41-kvstore-layout 1\n";
constexpr const char* kBlockSuffix = ".kvb";
constexpr int64_t kRefuseLogIntervalNs = 10 * kNsPerSecond;

std::string hostname_tag() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "host";
  std::string s;
  for (char* p = buf; *p; ++p) s += (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-') ? *p : '_';
  return s.empty() ? "host" : s;
}

double elapsed_ms(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

DiskTier::DiskTier(const DiskTierConfig& config, FileIo& io, Clock& clock, MetricsRegistry& m)
    : config_(config),
      io_(io),
      clock_(clock),
      blocks_dir_(config.dir + "/blocks"),
      tmp_dir_(config.dir + "/tmp"),
      hits_(m.counter("ds41_kv_disk_hits_total", "Global-KV blocks read from the persistent tier")),
      misses_(m.counter("ds41_kv_disk_misses_total",
                        "Global-KV block reads that missed (absent, corrupt, error)")),
      read_bytes_(m.counter("ds41_kv_disk_read_bytes_total", "Bytes of verified blocks read")),
      written_bytes_(m.counter("ds41_kv_disk_written_bytes_total", "Bytes of blocks published")),
      writes_(m.counter("ds41_kv_disk_writes_total", "Blocks published")),
      write_dedup_(
          m.counter("ds41_kv_disk_write_dedup_total", "Writes skipped because the block already existed")),
      write_errors_(
          m.counter("ds41_kv_disk_write_errors_total", "Block writes that failed with an I/O error")),
      refused_(m.counter("ds41_kv_disk_writes_refused_total",
                         "Writes refused because capacity is full of blocks under retention")),
      checksum_failures_(m.counter("ds41_kv_disk_checksum_failures_total",
                                   "Blocks that failed verification (corrupt or torn) and were deleted")),
      incompatible_(m.counter("ds41_kv_disk_incompatible_total",
                              "Blocks of another format version or model fingerprint (treated as misses)")),
      read_errors_(m.counter("ds41_kv_disk_read_errors_total", "Block reads that failed with an I/O error")),
      evict_lru_(m.counter("ds41_kv_disk_evictions_total", "Blocks removed from the persistent tier",
                           {{"reason", "lru"}})),
      evict_corrupt_(m.counter("ds41_kv_disk_evictions_total", "Blocks removed from the persistent tier",
                               {{"reason", "corrupt"}})),
      evict_external_(m.counter("ds41_kv_disk_evictions_total", "Blocks removed from the persistent tier",
                                {{"reason", "external"}})),
      used_gauge_(m.gauge("ds41_kv_disk_used_bytes", "Bytes of blocks in this process's index of the tier")),
      blocks_gauge_(m.gauge("ds41_kv_disk_blocks", "Blocks in this process's index of the tier")),
      scan_ms_gauge_(
          m.gauge("ds41_kv_disk_index_scan_ms", "Duration of the last index rebuild (directory scan), ms")) {}

DiskTier::~DiskTier() = default;

Result<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierConfig& config, FileIo& io, Clock& clock,
                                                 MetricsRegistry& metrics) {
  DS41_RETURN_IF_ERROR(config.validate());
  std::unique_ptr<DiskTier> t(new DiskTier(config, io, clock, metrics));
  DS41_RETURN_IF_ERROR(t->init_layout());
  DS41_RETURN_IF_ERROR(t->remove_stale_temps());
  auto t0 = std::chrono::steady_clock::now();
  DS41_ASSIGN_OR_RETURN(Index idx, t->scan_directory());
  {
    std::lock_guard<std::mutex> lock(t->mu_);
    t->install_index(std::move(idx));
  }
  t->last_scan_ms_.store(elapsed_ms(t0));
  t->scan_ms_gauge_.set(static_cast<int64_t>(t->last_scan_ms_.load()));
  t->last_rescan_mono_ns_.store(clock.now_mono_ns());
  log_info("kvcache", "disk tier " + config.dir + ": " + std::to_string(t->block_count()) + " blocks, " +
                          std::to_string(t->used_bytes()) + " bytes indexed in " +
                          std::to_string(t->last_scan_ms_.load()) + " ms");
  return t;
}

Status DiskTier::init_layout() {
  // mkdir -p for the root (shared mounts may already have it).
  std::string acc;
  size_t pos = 0;
  const std::string& d = config_.dir;
  while (pos != std::string::npos) {
    size_t next = d.find('/', pos + 1);
    acc = d.substr(0, next);
    if (!acc.empty() && acc != "/") DS41_RETURN_IF_ERROR(io_.mkdir(acc).with_context("kv disk tier"));
    pos = next;
  }
  DS41_RETURN_IF_ERROR(io_.mkdir(blocks_dir_));
  DS41_RETURN_IF_ERROR(io_.mkdir(tmp_dir_));
  char sub[3];
  for (int i = 0; i < 256; ++i) {
    std::snprintf(sub, sizeof(sub), "%02x", i);
    DS41_RETURN_IF_ERROR(io_.mkdir(blocks_dir_ + "/" + sub));
  }
  std::string marker = config_.dir + "/LAYOUT";
  auto existing = read_whole_file(io_, marker);
  if (existing.ok()) {
    std::string got(existing->begin(), existing->end());
    if (got != kLayoutMarker)
      return failed_precondition("kv disk tier " + config_.dir + ": LAYOUT is '" + got +
                                 "', this build writes '" +
                                 std::string(kLayoutMarker, std::strlen(kLayoutMarker) - 1) + "'");
    return ok_status();
  }
  if (existing.status().code() != StatusCode::kNotFound) return existing.status();
  std::span<const uint8_t> part(reinterpret_cast<const uint8_t*>(kLayoutMarker), std::strlen(kLayoutMarker));
  std::span<const uint8_t> parts[1] = {part};
  // Several processes may race here; each renames identical content, so the last one wins harmlessly.
  return publish_file_atomic(io_, temp_path_in(tmp_dir_, BlockKey{}), marker, parts, kTimeOmit, config_.sync);
}

bool DiskTier::remove_if_abandoned(const std::string& path, int64_t mtime_ns, int64_t now_ns) {
  // Another live process may be writing it: only remove temps that are clearly abandoned.
  return now_ns - mtime_ns > config_.stale_tmp_age_ns && io_.unlink(path).ok();
}

Status DiskTier::remove_stale_temps() {
  std::vector<std::pair<std::string, FileStat>> entries;
  DS41_RETURN_IF_ERROR(io_.list_dir_stats(tmp_dir_, &entries));
  const int64_t now = clock_.now_unix_ns();
  int removed = 0;
  for (const auto& [n, st] : entries) removed += remove_if_abandoned(tmp_dir_ + "/" + n, st.mtime_ns, now);
  if (removed) log_info("kvcache", "disk tier: removed " + std::to_string(removed) + " stale temp files");
  return ok_status();
}

Result<DiskTier::Index> DiskTier::scan_directory() {
  // The 256 block directories are independent: list + stat them on several threads (the cost is
  // one stat per file, ~1M for a full tier), each into its own map, merged at the end.
  constexpr int kDirs = 256;
  int threads = config_.scan_threads > 0
                    ? config_.scan_threads
                    : static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  threads = std::min(threads, kDirs);
  std::vector<Index> parts(kDirs);
  std::vector<Status> errors(kDirs);
  std::atomic<int> next{0};
  std::atomic<int> stale_removed{0};
  const int64_t now_ns = clock_.now_unix_ns();
  auto work = [&] {
    char sub[3];
    std::vector<std::pair<std::string, FileStat>> entries;
    for (int i; (i = next.fetch_add(1)) < kDirs;) {
      std::snprintf(sub, sizeof(sub), "%02x", i);
      std::string d = blocks_dir_ + "/" + sub;
      entries.clear();
      errors[i] = io_.list_dir_stats(d, &entries);
      if (!errors[i].ok()) continue;
      parts[i].reserve(entries.size());
      for (const auto& [n, st] : entries) {
        if (n.starts_with('.') && n.ends_with(".tmp")) {
          // An in-flight write (temp files live beside their final name), or a crashed one's.
          if (remove_if_abandoned(d + "/" + n, st.mtime_ns, now_ns)) stale_removed.fetch_add(1);
          continue;
        }
        if (n.size() != 32 + std::strlen(kBlockSuffix) || !n.ends_with(kBlockSuffix)) continue;
        if (!st.is_regular) continue;
        auto key = BlockKey::from_hex(std::string_view(n).substr(0, 32));
        if (!key) continue;
        Entry e;
        e.bytes = st.size;
        e.created_ns = st.mtime_ns;
        e.access_ns = std::max(st.atime_ns, st.mtime_ns);
        parts[i].emplace(*key, e);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (int n = stale_removed.load())
    log_info("kvcache", "disk tier: removed " + std::to_string(n) + " stale temp files from block directories");
  Index idx;
  size_t total = 0;
  for (int i = 0; i < kDirs; ++i) {
    DS41_RETURN_IF_ERROR(errors[i]);
    total += parts[i].size();
  }
  idx.reserve(total);
  for (auto& p : parts) idx.merge(p);
  return idx;
}

void DiskTier::install_index(Index fresh) {
  // Keep access times this process knows to be newer (a throttled touch may not be on disk).
  if (!index_.empty()) {
    for (auto& [k, e] : fresh) {
      auto it = index_.find(k);
      if (it != index_.end() && it->second.created_ns == e.created_ns)
        e.access_ns = std::max(e.access_ns, it->second.access_ns);
    }
  }
  // Bulk build of the two ordered sets: sort once, then append with an end() hint (linear)
  // instead of a million tree searches.
  const int64_t cutoff = clock_.now_unix_ns() - config_.retention_ns;
  std::vector<std::pair<int64_t, BlockKey>> young, old;
  uint64_t used = 0;
  for (auto& [k, e] : fresh) {
    e.old = e.created_ns <= cutoff;
    if (e.old)
      old.emplace_back(e.access_ns, k);
    else
      young.emplace_back(e.created_ns, k);
    used += e.bytes;
  }
  std::sort(young.begin(), young.end());
  std::sort(old.begin(), old.end());
  young_.clear();
  old_lru_.clear();
  for (const auto& p : young) young_.emplace_hint(young_.end(), p);
  for (const auto& p : old) old_lru_.emplace_hint(old_lru_.end(), p);
  index_ = std::move(fresh);
  used_bytes_ = used;
  used_gauge_.set(static_cast<int64_t>(used_bytes_));
  blocks_gauge_.set(static_cast<int64_t>(index_.size()));
}

void DiskTier::index_insert(const BlockKey& key, const Entry& e0) {
  Entry e = e0;
  int64_t cutoff = clock_.now_unix_ns() - config_.retention_ns;
  e.old = e.created_ns <= cutoff;
  if (e.old)
    old_lru_.emplace(e.access_ns, key);
  else
    young_.emplace(e.created_ns, key);
  index_[key] = e;
  used_bytes_ += e.bytes;
  used_gauge_.set(static_cast<int64_t>(used_bytes_));
  blocks_gauge_.set(static_cast<int64_t>(index_.size()));
}

void DiskTier::index_remove(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  const Entry& e = it->second;
  if (e.old)
    old_lru_.erase({e.access_ns, key});
  else
    young_.erase({e.created_ns, key});
  used_bytes_ -= e.bytes;
  index_.erase(it);
  used_gauge_.set(static_cast<int64_t>(used_bytes_));
  blocks_gauge_.set(static_cast<int64_t>(index_.size()));
}

void DiskTier::index_touch(const BlockKey& key, int64_t access_ns) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  Entry& e = it->second;
  if (e.old) {
    old_lru_.erase({e.access_ns, key});
    old_lru_.emplace(access_ns, key);
  }
  e.access_ns = access_ns;
}

void DiskTier::promote_aged(int64_t now_ns) {
  int64_t cutoff = now_ns - config_.retention_ns;
  while (!young_.empty() && young_.begin()->first <= cutoff) {
    BlockKey k = young_.begin()->second;
    young_.erase(young_.begin());
    Entry& e = index_[k];
    e.old = true;
    old_lru_.emplace(e.access_ns, k);
  }
}

bool DiskTier::make_room(std::unique_lock<std::mutex>& lock, uint64_t incoming) {
  int guard = 0;
  while (used_bytes_ + reserved_bytes_ + incoming > config_.capacity_bytes) {
    if (++guard > 100000) return false;
    promote_aged(clock_.now_unix_ns());
    if (old_lru_.empty()) return false;
    auto [access_ns, key] = *old_lru_.begin();
    Entry e = index_[key];
    std::string path = block_path(key);
    lock.unlock();
    auto st = io_.stat(path);
    lock.lock();
    auto it = index_.find(key);
    if (it == index_.end() || it->second.access_ns != e.access_ns) continue;  // changed meanwhile
    if (!st.ok()) {
      // Gone (another process evicted it) or unreadable metadata: stop accounting for it.
      index_remove(key);
      evict_external_.inc();
      continue;
    }
    // Another process used or rewrote it since we last looked: refresh, pick again.
    if (st->mtime_ns > e.created_ns || st->atime_ns > e.access_ns) {
      Entry fresh = e;
      fresh.created_ns = std::max(e.created_ns, st->mtime_ns);
      fresh.access_ns = std::max({e.access_ns, st->atime_ns, st->mtime_ns});
      fresh.bytes = st->size;
      index_remove(key);
      index_insert(key, fresh);
      continue;
    }
    index_remove(key);
    lock.unlock();
    Status s = io_.unlink(path);
    lock.lock();
    if (s.ok() || s.code() == StatusCode::kNotFound)
      evict_lru_.inc();
    else
      log_warn("kvcache", "disk tier: evicting " + path + ": " + s.to_string());
  }
  return true;
}

std::string DiskTier::block_path(const BlockKey& key) const {
  std::string h = key.hex();
  return blocks_dir_ + "/" + h.substr(0, 2) + "/" + h + kBlockSuffix;
}

std::string DiskTier::temp_path(const BlockKey& key) {
  // Beside the final name: the rename stays inside one directory (no filesystem-wide cross-
  // directory rename lock, one directory modified) and writers of different directories do not
  // contend on one temp directory's lock. The leading dot keeps it out of the index scan.
  std::string h = key.hex();
  return temp_path_in(blocks_dir_ + "/" + h.substr(0, 2), key);
}

std::string DiskTier::temp_path_in(const std::string& dir, const BlockKey& key) {
  static const std::string host = hostname_tag();
  char buf[96];
  std::snprintf(buf, sizeof(buf), ".%d.%llx.%llu.tmp", static_cast<int>(getpid()),
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(this)),
                static_cast<unsigned long long>(temp_seq_.fetch_add(1)));
  return dir + "/." + key.hex() + "." + host + buf;
}

void DiskTier::maybe_rescan() {
  if (config_.rescan_interval_ns == 0) return;
  int64_t now = clock_.now_mono_ns();
  if (now - last_rescan_mono_ns_.load() < config_.rescan_interval_ns) return;
  if (rescanning_.exchange(true)) return;
  last_rescan_mono_ns_.store(now);
  Status s = rescan();
  if (!s.ok()) log_warn("kvcache", "disk tier rescan: " + s.to_string());
  rescanning_.store(false);
}

Status DiskTier::rescan() {
  auto t0 = std::chrono::steady_clock::now();
  DS41_ASSIGN_OR_RETURN(Index idx, scan_directory());
  {
    std::lock_guard<std::mutex> lock(mu_);
    install_index(std::move(idx));
  }
  last_scan_ms_.store(elapsed_ms(t0));
  scan_ms_gauge_.set(static_cast<int64_t>(last_scan_ms_.load()));
  return ok_status();
}

Status DiskTier::put(const BlockKey& key, uint32_t token_count, std::span<const uint8_t> payload) {
  PutRequest r{key, token_count, payload};
  return put_batch(std::span<const PutRequest>(&r, 1))[0];
}

// Group commit in three stages (docs/formats/kv_block.md "Group commit"): every block of the batch
// is written to its temp file with writeback started, so the data of the whole batch is on its
// way to the disk at once; then all temp files are fsynced together (FileIo::fsync_many: one
// io_uring submission, so they wait for shared journal commits concurrently) and each is renamed;
// then every distinct block directory is fsynced, again all at once. A block is acknowledged (ok)
// only after its data fsync, its rename and its directory's fsync all succeeded.
std::vector<Status> DiskTier::put_batch(std::span<const PutRequest> requests) {
  maybe_rescan();
  std::vector<Status> out(requests.size());
  std::vector<Slot> slots(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) out[i] = stage_block(requests[i], &slots[i]);
  std::vector<size_t> staged;
  for (size_t i = 0; i < requests.size(); ++i)
    if (out[i].ok() && !slots[i].present) staged.push_back(i);
  if (config_.sync) {
    // All data fsyncs of the batch at once (io_uring on Linux): they share journal commits.
    std::vector<int> fds;
    for (size_t i : staged) fds.push_back(slots[i].pub.fd);
    std::vector<Status> synced = io_.fsync_many(fds);
    for (size_t j = 0; j < staged.size(); ++j) {
      if (synced[j].ok()) continue;
      const size_t i = staged[j];
      abort_temp_file(io_, &slots[i].pub);
      out[i] = finish_block(requests[i], &slots[i], synced[j].with_context(slots[i].pub.tmp_path));
    }
  }
  for (size_t i : staged) {
    if (!out[i].ok()) continue;
    out[i] = finish_block(requests[i], &slots[i], commit_temp_file(io_, &slots[i].pub, /*sync=*/false));
  }
  if (!config_.sync) return out;
  std::vector<std::string> unique;
  for (size_t i = 0; i < requests.size(); ++i)
    if (out[i].ok()) unique.push_back(slots[i].dir);
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  std::vector<Status> dir_synced = io_.fsync_dirs(unique);
  for (size_t u = 0; u < unique.size(); ++u) {
    const Status& s = dir_synced[u];
    if (s.ok()) continue;
    log_warn("kvcache", "disk tier: group commit: " + s.to_string());
    for (size_t i = 0; i < requests.size(); ++i) {
      if (slots[i].dir != unique[u] || !out[i].ok()) continue;
      out[i] = s;
      write_errors_.inc();
    }
  }
  return out;
}

Status DiskTier::stage_block(const PutRequest& r, Slot* slot) {
  if (r.payload.size() > kBlockMaxPayloadBytes)
    return invalid_argument("kv disk tier: payload of " + std::to_string(r.payload.size()) +
                            " bytes exceeds the " + std::to_string(kBlockMaxPayloadBytes) +
                            "-byte block limit");
  slot->size = kBlockHeaderBytes + r.payload.size();
  slot->pub.final_path = block_path(r.key);
  slot->dir = slot->pub.final_path.substr(0, slot->pub.final_path.find_last_of('/'));
  // Content address: if the file is already there (ours or another process's), we are done.
  if (auto st = io_.stat(slot->pub.final_path); st.ok() && st->is_regular && st->size == slot->size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.find(r.key) == index_.end())
      index_insert(r.key, Entry{st->size, st->mtime_ns, std::max(st->atime_ns, st->mtime_ns), false});
    write_dedup_.inc();
    // Another writer may have renamed it without its directory fsync yet: the batch fsyncs it too.
    slot->present = true;
    return ok_status();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    index_remove(r.key);  // a stale entry (file vanished or has the wrong size)
    if (slot->size > config_.capacity_bytes || !make_room(lock, slot->size)) {
      refused_.inc();
      int64_t now = clock_.now_mono_ns();
      int64_t last = last_refuse_log_ns_.load();
      if (last == 0 || now - last >= kRefuseLogIntervalNs) {
        last_refuse_log_ns_.store(now);
        log_warn("kvcache", "disk tier " + config_.dir + ": refusing block writes: capacity " +
                                std::to_string(config_.capacity_bytes) +
                                " bytes is full of blocks younger than " + "the retention period (" +
                                std::to_string(config_.retention_ns / kNsPerSecond) +
                                " s); refused so far: " + std::to_string(refused_.value()));
      }
      return resource_exhausted("kv disk tier: capacity " + std::to_string(config_.capacity_bytes) +
                                " bytes is full of blocks under retention; write of " + r.key.hex() +
                                " refused");
    }
    reserved_bytes_ += slot->size;
    slot->reserved = true;
  }
  BlockMeta meta{r.key, BlockKind::kGlobalKv, config_.model_fingerprint, r.token_count};
  auto header = encode_block_header(meta, r.payload);
  std::span<const uint8_t> parts[2] = {std::span<const uint8_t>(header), r.payload};
  slot->now_ns = clock_.now_unix_ns();
  slot->pub.tmp_path = temp_path(r.key);
  Status s = stage_temp_file(io_, &slot->pub, parts, slot->now_ns, config_.sync);
  if (!s.ok()) return finish_block(r, slot, s);
  return ok_status();
}

Status DiskTier::finish_block(const PutRequest& r, Slot* slot, Status committed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (slot->reserved) reserved_bytes_ -= slot->size;
  slot->reserved = false;
  if (!committed.ok()) {
    write_errors_.inc();
    log_warn("kvcache", "disk tier: write of block " + r.key.hex() + " failed: " + committed.to_string());
    return committed;
  }
  index_remove(r.key);
  index_insert(r.key, Entry{slot->size, slot->now_ns, slot->now_ns, false});
  writes_.inc();
  written_bytes_.inc(slot->size);
  return ok_status();
}

void DiskTier::note_corrupt(const BlockKey& key, const std::string& path, const FileStat& st,
                            const Status& why) {
  checksum_failures_.inc();
  log_warn("kvcache", "disk tier: " + path + " failed verification, deleting: " + why.message());
  // Only delete the file we actually read: another process may have just published a good one.
  auto now_st = io_.stat(path);
  if (now_st.ok() && now_st->ino == st.ino && now_st->dev == st.dev) (void)io_.unlink(path);
  std::lock_guard<std::mutex> lock(mu_);
  index_remove(key);
  evict_corrupt_.inc();
}

std::optional<StoredBlock> DiskTier::get(const BlockKey& key) {
  const std::string path = block_path(key);
  FileStat st;
  auto bytes = read_whole_file(io_, path, &st);
  if (!bytes.ok()) {
    misses_.inc();
    if (bytes.status().code() == StatusCode::kNotFound) {
      std::lock_guard<std::mutex> lock(mu_);
      if (index_.count(key)) {
        index_remove(key);
        evict_external_.inc();
      }
    } else {
      read_errors_.inc();
      log_warn("kvcache", "disk tier: reading " + path + ": " + bytes.status().to_string());
    }
    return std::nullopt;
  }
  BlockMeta expect{key, BlockKind::kGlobalKv, config_.model_fingerprint, 0};
  auto meta = decode_block(*bytes, expect);
  if (!meta.ok()) {
    misses_.inc();
    if (meta.status().code() == StatusCode::kDataLoss)
      note_corrupt(key, path, st, meta.status());
    else
      incompatible_.inc();
    return std::nullopt;
  }
  hits_.inc();
  read_bytes_.inc(bytes->size());
  const int64_t now = clock_.now_unix_ns();
  bool stamp = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end() || it->second.created_ns != st.mtime_ns) {
      index_remove(key);
      index_insert(key, Entry{st.size, st.mtime_ns, std::max(st.atime_ns, st.mtime_ns), false});
      it = index_.find(key);
    }
    if (now - it->second.access_ns >= config_.touch_interval_ns) {
      index_touch(key, now);
      stamp = true;
    }
  }
  // The file's atime is the LRU clock shared with other processes (docs/formats/kv_block.md).
  if (stamp) {
    Status s = io_.set_times(path, now, kTimeOmit);
    if (!s.ok()) log_debug("kvcache", "disk tier: touching " + path + ": " + s.to_string());
  }
  return StoredBlock{*meta, std::move(*bytes)};
}

void DiskTier::prefetch(const BlockKey& key) {
  auto fd = io_.open(block_path(key), O_RDONLY | O_NOATIME, 0);
  if (!fd.ok()) return;
  (void)io_.advise_willneed(*fd);
  (void)io_.close(*fd);
}

bool DiskTier::contains(const BlockKey& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(key)) return true;
  }
  auto st = io_.stat(block_path(key));
  if (!st.ok() || !st->is_regular || st->size < kBlockHeaderBytes) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!index_.count(key))
    index_insert(key, Entry{st->size, st->mtime_ns, std::max(st->atime_ns, st->mtime_ns), false});
  return true;
}

Status DiskTier::erase(const BlockKey& key) {
  Status s = io_.unlink(block_path(key));
  std::lock_guard<std::mutex> lock(mu_);
  index_remove(key);
  if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  return ok_status();
}

uint64_t DiskTier::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_bytes_;
}

size_t DiskTier::block_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

// ---- Operator API (ds41 kv). Added after the serving path; reuses the index and make_room(). ----

std::vector<DiskTier::BlockInfo> DiskTier::list_blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  promote_aged(clock_.now_unix_ns());
  std::vector<BlockInfo> out;
  out.reserve(index_.size());
  auto info = [&](const BlockKey& k) {
    const Entry& e = index_.at(k);
    return BlockInfo{k, e.bytes, e.created_ns, e.access_ns, !e.old};
  };
  for (const auto& [access, k] : old_lru_) out.push_back(info(k));
  for (const auto& [created, k] : young_) out.push_back(info(k));
  return out;
}

DiskTier::Usage DiskTier::usage() {
  std::lock_guard<std::mutex> lock(mu_);
  promote_aged(clock_.now_unix_ns());
  Usage u;
  u.blocks = index_.size();
  u.bytes = used_bytes_;
  bool first = true;
  for (const auto& [k, e] : index_) {
    if (!e.old) {
      ++u.retained_blocks;
      u.retained_bytes += e.bytes;
    }
    if (first || e.created_ns < u.oldest_created_ns) u.oldest_created_ns = e.created_ns;
    if (first || e.created_ns > u.newest_created_ns) u.newest_created_ns = e.created_ns;
    if (first || e.access_ns < u.lru_access_ns) u.lru_access_ns = e.access_ns;
    first = false;
  }
  return u;
}

DiskTier::VerifyOutcome DiskTier::verify_block(const BlockKey& key, std::optional<uint64_t> fingerprint,
                                               bool dry_run) {
  VerifyOutcome out;
  const std::string path = block_path(key);
  FileStat st;
  // read_whole_file opens with O_NOATIME: verifying does not count as a use for the LRU.
  auto bytes = read_whole_file(io_, path, &st);
  if (!bytes.ok()) {
    out.detail = bytes.status();
    if (bytes.status().code() == StatusCode::kNotFound) {
      out.result = VerifyResult::kMissing;
      std::lock_guard<std::mutex> lock(mu_);
      if (index_.count(key)) {
        index_remove(key);
        evict_external_.inc();
      }
    } else {
      out.result = VerifyResult::kReadError;
      read_errors_.inc();
    }
    return out;
  }
  auto header = peek_block_header(*bytes);
  if (header.ok()) out.meta = header->meta;
  uint64_t fp = fingerprint ? *fingerprint : (header.ok() ? header->meta.model_fingerprint : 0);
  auto meta = decode_block(*bytes, BlockMeta{key, BlockKind::kGlobalKv, fp, 0});
  if (meta.ok()) {
    out.meta = *meta;
    return out;
  }
  out.detail = meta.status();
  if (meta.status().code() != StatusCode::kDataLoss) {
    // Another format version (kUnimplemented) or model fingerprint (kFailedPrecondition).
    out.result = VerifyResult::kIncompatible;
    incompatible_.inc();
    return out;
  }
  out.result = VerifyResult::kCorrupt;
  if (dry_run) return out;
  note_corrupt(key, path, st, meta.status());
  auto after = io_.stat(path);
  out.deleted = !after.ok() || after->ino != st.ino || after->dev != st.dev;
  return out;
}

DiskTier::GcReport DiskTier::collect_garbage(bool dry_run) {
  GcReport r;
  r.capacity_bytes = config_.capacity_bytes;
  std::unique_lock<std::mutex> lock(mu_);
  promote_aged(clock_.now_unix_ns());
  r.used_before = used_bytes_;
  // Candidates in eviction order (LRU first), as make_room() will take them.
  std::vector<BlockInfo> candidates;
  candidates.reserve(old_lru_.size());
  for (const auto& [access, k] : old_lru_) {
    const Entry& e = index_.at(k);
    candidates.push_back(BlockInfo{k, e.bytes, e.created_ns, e.access_ns, false});
  }
  if (dry_run) {
    uint64_t used = used_bytes_;
    for (const auto& c : candidates) {
      if (used <= config_.capacity_bytes) break;
      used -= c.bytes;
      r.evicted.push_back(c);
      r.evicted_bytes += c.bytes;
    }
    r.used_after = used;
  } else {
    const uint64_t external_before = evict_external_.value();
    // make_room() gives up after a bounded number of steps per call; go on while it progresses.
    for (int round = 0; round < 1000 && used_bytes_ + reserved_bytes_ > config_.capacity_bytes; ++round) {
      if (make_room(lock, 0)) break;
      promote_aged(clock_.now_unix_ns());
      if (old_lru_.empty()) break;
    }
    for (const auto& c : candidates) {
      if (index_.count(c.key)) continue;  // kept (or refreshed: another process used/rewrote it)
      r.evicted.push_back(c);
      r.evicted_bytes += c.bytes;
    }
    r.vanished_blocks = static_cast<size_t>(evict_external_.value() - external_before);
    r.used_after = used_bytes_;
  }
  r.evicted_blocks = r.evicted.size();
  for (const auto& [created, k] : young_) r.retained_bytes += index_.at(k).bytes;
  r.retention_exceeds_capacity = r.retained_bytes > config_.capacity_bytes;
  return r;
}

}  // namespace ds41
