// ds41 kvcache: DiskTier's directory layout, index build and eviction. File I/O always happens
// outside mu_; the index is a per-process view of the shared directory, corrected lazily (a
// missing file is dropped, a file written by another process is adopted on first sight, a rescan
// reconciles everything). Writes, reads and the operator API are in disk_tier_*.cpp.
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
#include "core/thread_pool.h"

namespace ds41::kvcache {
namespace {

constexpr const char* kLayoutMarker = "ds41-kvstore-layout 1\n";
constexpr const char* kBlockSuffix = ".kvb";

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
      index_(config.retention_ns),
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
  // Each pool task runs the shared work loop, which takes directories until none is left.
  ThreadPool pool(threads);
  pool.parallel_for(threads, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) work();
  });
  if (int n = stale_removed.load())
    log_info("kvcache",
             "disk tier: removed " + std::to_string(n) + " stale temp files from block directories");
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
  index_.replace_all(std::move(fresh), clock_.now_unix_ns());
  update_gauges();
}

void DiskTier::index_insert(const BlockKey& key, const Entry& e) {
  index_.insert(key, e, clock_.now_unix_ns());
  update_gauges();
}

void DiskTier::index_remove(const BlockKey& key) {
  index_.remove(key);
  update_gauges();
}

void DiskTier::update_gauges() {
  used_gauge_.set(static_cast<int64_t>(index_.used_bytes()));
  blocks_gauge_.set(static_cast<int64_t>(index_.size()));
}

bool DiskTier::make_room(std::unique_lock<std::mutex>& lock, uint64_t incoming) {
  int guard = 0;
  while (index_.used_bytes() + reserved_bytes_ + incoming > config_.capacity_bytes) {
    if (++guard > 100000) return false;
    index_.promote_aged(clock_.now_unix_ns());
    const std::optional<BlockKey> victim = index_.lru_victim();
    if (!victim) return false;
    const BlockKey key = *victim;
    const Entry e = *index_.find(key);
    std::string path = block_path(key);
    lock.unlock();
    auto st = io_.stat(path);
    lock.lock();
    const Entry* now_e = index_.find(key);
    if (now_e == nullptr || now_e->access_ns != e.access_ns) continue;  // changed meanwhile
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

bool DiskTier::contains(const BlockKey& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.contains(key)) return true;
  }
  auto st = io_.stat(block_path(key));
  if (!st.ok() || !st->is_regular || st->size < kBlockHeaderBytes) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!index_.contains(key))
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
  return index_.used_bytes();
}

size_t DiskTier::block_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

}  // namespace ds41::kvcache
