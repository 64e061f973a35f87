// ds41 kvcache: DiskTier writes — group commit of a batch of blocks (docs/formats/kv_block.md
// "Group commit"), the capacity reservation that refuses writes when only blocks under retention
// fill the tier, and the index/metrics update once a block is published.
#include <algorithm>
#include <string>
#include <vector>

#include "core/log.h"
#include "kvcache/disk_tier.h"

namespace ds41::kvcache {
namespace {

constexpr int64_t kRefuseLogIntervalNs = 10 * kNsPerSecond;

}  // namespace

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
    for (size_t i : staged) fds.push_back(slots[i].pub.fd.get());
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
    if (!index_.contains(r.key))
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

}  // namespace ds41::kvcache
