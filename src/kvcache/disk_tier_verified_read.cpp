// ds41 kvcache: DiskTier reads — verified reads (format, checksum, key, kind and fingerprint
// checked before a block is served; a corrupt or torn block is a miss and is deleted), the shared
// LRU clock stamped on use, and read-ahead hints for restores.
#include <fcntl.h>

#include <algorithm>
#include <string>

#include "core/log.h"
#include "kvcache/disk_tier.h"
#include "kvcache/unique_fd.h"

namespace ds41::kvcache {

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
      if (index_.contains(key)) {
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
    const Entry* e = index_.find(key);
    if (e == nullptr || e->created_ns != st.mtime_ns) {
      index_insert(key, Entry{st.size, st.mtime_ns, std::max(st.atime_ns, st.mtime_ns), false});
      e = index_.find(key);
    }
    if (now - e->access_ns >= config_.touch_interval_ns) {
      index_.touch(key, now);
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
  auto fd = open_fd(io_, block_path(key), O_RDONLY | O_NOATIME, 0);
  if (!fd.ok()) return;
  (void)io_.advise_willneed(fd->get());
}

}  // namespace ds41::kvcache
