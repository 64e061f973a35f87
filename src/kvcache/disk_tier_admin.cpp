// ds41 kvcache: the DiskTier operator API behind `ds41 kv stats|verify|gc`: index snapshots in
// eviction order, usage, verification of one block without touching its access time, and
// garbage collection through the same eviction path as writes (make_room). None of these stamps
// access times.
#include <optional>
#include <vector>

#include "kvcache/disk_tier.h"

namespace ds41::kvcache {

std::vector<DiskTier::BlockInfo> DiskTier::list_blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  index_.promote_aged(clock_.now_unix_ns());
  std::vector<BlockInfo> out;
  out.reserve(index_.size());
  auto info = [&](const BlockKey& k) {
    const Entry& e = index_.entries().at(k);
    return BlockInfo{k, e.bytes, e.created_ns, e.access_ns, !e.old};
  };
  for (const auto& [access, k] : index_.lru()) out.push_back(info(k));
  for (const auto& [created, k] : index_.retained()) out.push_back(info(k));
  return out;
}

DiskTier::Usage DiskTier::usage() {
  std::lock_guard<std::mutex> lock(mu_);
  index_.promote_aged(clock_.now_unix_ns());
  Usage u;
  u.blocks = index_.size();
  u.bytes = index_.used_bytes();
  bool first = true;
  for (const auto& [k, e] : index_.entries()) {
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
      if (index_.contains(key)) {
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
  index_.promote_aged(clock_.now_unix_ns());
  r.used_before = index_.used_bytes();
  // Candidates in eviction order (LRU first), as make_room() will take them.
  std::vector<BlockInfo> candidates;
  candidates.reserve(index_.lru().size());
  for (const auto& [access, k] : index_.lru()) {
    const Entry& e = index_.entries().at(k);
    candidates.push_back(BlockInfo{k, e.bytes, e.created_ns, e.access_ns, false});
  }
  if (dry_run) {
    uint64_t used = index_.used_bytes();
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
    for (int round = 0; round < 1000 && index_.used_bytes() + reserved_bytes_ > config_.capacity_bytes;
         ++round) {
      if (make_room(lock, 0)) break;
      index_.promote_aged(clock_.now_unix_ns());
      if (!index_.lru_victim()) break;
    }
    for (const auto& c : candidates) {
      if (index_.contains(c.key)) continue;  // kept (or refreshed: another process used/rewrote it)
      r.evicted.push_back(c);
      r.evicted_bytes += c.bytes;
    }
    r.vanished_blocks = static_cast<size_t>(evict_external_.value() - external_before);
    r.used_after = index_.used_bytes();
  }
  r.evicted_blocks = r.evicted.size();
  for (const auto& [created, k] : index_.retained()) r.retained_bytes += index_.entries().at(k).bytes;
  r.retention_exceeds_capacity = r.retained_bytes > config_.capacity_bytes;
  return r;
}

}  // namespace ds41::kvcache
