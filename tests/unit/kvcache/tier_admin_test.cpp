// Tests for the DiskTier operator API behind `ds41 kv` (list_blocks, usage, verify_block,
// collect_garbage): gc never evicts a block under retention even when the store stays over
// capacity, evicts past-retention blocks least recently used first (a touched block survives),
// a dry run changes nothing and predicts the real run exactly; verify finds corrupt, torn and
// misnamed blocks, deletes them only when asked, and keeps blocks of another model fingerprint.
// Time comes from a FakeClock: no sleeps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "kvcache/disk_tier.h"
#include "kvcache/posix_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

constexpr int64_t kAdminHour = 3600 * kNsPerSecond;
constexpr int64_t kMinute = 60 * kNsPerSecond;
constexpr int64_t kRetention = 72 * kAdminHour;

class TierAdminTest : public ::testing::Test {
 protected:
  // Payload sizes differ per block so byte sums catch a wrong block being counted.
  static size_t payload_size(uint64_t i) { return 3000 + 53 * i; }
  static uint64_t file_bytes(uint64_t i) { return kBlockHeaderBytes + payload_size(i); }
  static BlockKey key(uint64_t i) { return BlockKey{i * 104729 + 3, i + 11}; }
  static std::vector<uint8_t> payload(uint64_t i) { return testing::make_payload(i, payload_size(i)); }

  DiskTierConfig config(uint64_t capacity_bytes, uint64_t fingerprint = 42) {
    DiskTierConfig c;
    c.dir = dir_.sub("store");
    c.capacity_bytes = capacity_bytes;
    c.retention_ns = kRetention;
    c.model_fingerprint = fingerprint;
    c.sync = false;
    c.touch_interval_ns = 0;
    c.rescan_interval_ns = 0;
    return c;
  }
  // Each open gets its own metrics registry (a fresh process's view).
  std::unique_ptr<DiskTier> open(const DiskTierConfig& c) {
    registries_.push_back(std::make_unique<MetricsRegistry>());
    auto t = DiskTier::open(c, PosixIo::instance(), clock_, *registries_.back());
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }
  MetricsRegistry& last_metrics() { return *registries_.back(); }
  void put(DiskTier& t, uint64_t i) { ASSERT_TRUE(t.put(key(i), 128, payload(i)).ok()) << i; }
  bool exists(DiskTier& t, uint64_t i) { return std::filesystem::exists(t.block_path(key(i))); }

  // Blocks 0..n_old-1 written one minute apart, then 100 h later blocks n_old..n_old+n_young-1
  // (also one minute apart). Returns total bytes.
  uint64_t populate(int n_old, int n_young) {
    auto t = open(config(1ULL << 40));
    uint64_t total = 0;
    for (int i = 0; i < n_old; ++i) {
      put(*t, i);
      total += file_bytes(i);
      clock_.advance_ns(kMinute);
    }
    clock_.advance_ns(100 * kAdminHour);
    for (int i = n_old; i < n_old + n_young; ++i) {
      put(*t, i);
      total += file_bytes(i);
      clock_.advance_ns(kMinute);
    }
    return total;
  }

  testing::ScratchDir dir_{"admin"};
  FakeClock clock_;
  std::vector<std::unique_ptr<MetricsRegistry>> registries_;
};

TEST_F(TierAdminTest, UsageSplitsRetainedFromEvictable) {
  const uint64_t total = populate(5, 4);
  auto t = open(config(1ULL << 40));
  DiskTier::Usage u = t->usage();
  EXPECT_EQ(u.blocks, 9u);
  EXPECT_EQ(u.bytes, total);
  EXPECT_EQ(u.retained_blocks, 4u);
  uint64_t young = 0;
  for (int i = 5; i < 9; ++i) young += file_bytes(i);
  EXPECT_EQ(u.retained_bytes, young);
  // Clock now: start + 5 min + 100 h + 4 min. Block 0 was written at start, block 8 at +8 min+100h.
  const int64_t start = 1'700'000'000'000'000'000LL;
  EXPECT_EQ(u.oldest_created_ns, start);
  EXPECT_EQ(u.newest_created_ns, start + 5 * kMinute + 100 * kAdminHour + 3 * kMinute);
  EXPECT_EQ(u.lru_access_ns, start);
  // Ageing: 73 h later every block is past retention.
  clock_.advance_ns(73 * kAdminHour);
  EXPECT_EQ(t->usage().retained_blocks, 0u);
}

TEST_F(TierAdminTest, ListBlocksIsEvictionOrderThenYoungOldestFirst) {
  populate(4, 3);
  auto t = open(config(1ULL << 40));
  // Touch block 1 (old): it becomes the most recently used old block.
  ASSERT_TRUE(t->get(key(1)).has_value());
  auto l = t->list_blocks();
  ASSERT_EQ(l.size(), 7u);
  std::vector<uint64_t> want_hi = {key(0).hi, key(2).hi, key(3).hi, key(1).hi,
                                   key(4).hi, key(5).hi, key(6).hi};
  for (size_t i = 0; i < l.size(); ++i) {
    EXPECT_EQ(l[i].key.hi, want_hi[i]) << i;
    EXPECT_EQ(l[i].under_retention, i >= 4) << i;
  }
  EXPECT_EQ(l[0].bytes, file_bytes(0));
}

TEST_F(TierAdminTest, GcNeverEvictsBlocksUnderRetentionEvenOverCapacity) {
  populate(6, 6);
  uint64_t young = 0;
  for (int i = 6; i < 12; ++i) young += file_bytes(i);
  // Capacity below what the young blocks alone take.
  auto t = open(config(young / 2));
  DiskTier::GcReport r = t->collect_garbage(/*dry_run=*/false);
  EXPECT_EQ(r.evicted_blocks, 6u);
  EXPECT_TRUE(r.retention_exceeds_capacity);
  EXPECT_EQ(r.retained_bytes, young);
  EXPECT_EQ(r.used_after, young);
  EXPECT_GT(r.used_after, r.capacity_bytes);
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(exists(*t, i)) << "old block " << i << " should be evicted";
  for (int i = 6; i < 12; ++i) EXPECT_TRUE(exists(*t, i)) << "young block " << i << " was evicted";
  EXPECT_EQ(t->block_count(), 6u);
  EXPECT_EQ(last_metrics().counter_value("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 6u);
  // A second gc has nothing left to evict and still reports the over-retention condition.
  DiskTier::GcReport again = t->collect_garbage(false);
  EXPECT_EQ(again.evicted_blocks, 0u);
  EXPECT_TRUE(again.retention_exceeds_capacity);
  // Retention 0: everything is evictable; now gc gets under capacity.
  auto c0 = config(young / 2);
  c0.retention_ns = 0;
  auto t0 = open(c0);
  DiskTier::GcReport r0 = t0->collect_garbage(false);
  EXPECT_FALSE(r0.retention_exceeds_capacity);
  EXPECT_LE(r0.used_after, young / 2);
  EXPECT_GT(r0.evicted_blocks, 0u);
}

TEST_F(TierAdminTest, GcEvictsLeastRecentlyUsedFirstAndTouchedBlocksSurvive) {
  populate(10, 2);
  {
    auto t = open(config(1ULL << 40));
    clock_.advance_ns(kMinute);
    // Use blocks 0, 2 and 4 (the oldest three): they become the most recently used.
    for (uint64_t i : {4, 0, 2}) {
      ASSERT_TRUE(t->get(key(i)).has_value());
      clock_.advance_ns(kMinute);
    }
  }
  // Keep the young blocks plus room for exactly five old blocks: evict the other five.
  uint64_t keep = file_bytes(10) + file_bytes(11);
  for (int i : {0, 2, 4, 8, 9}) keep += file_bytes(i);
  auto t = open(config(keep));
  DiskTier::GcReport r = t->collect_garbage(false);
  std::vector<uint64_t> want = {1, 3, 5, 6, 7};  // untouched, in write (= access) order
  ASSERT_EQ(r.evicted.size(), want.size());
  uint64_t want_bytes = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(r.evicted[i].key, key(want[i])) << i;
    want_bytes += file_bytes(want[i]);
  }
  EXPECT_EQ(r.evicted_bytes, want_bytes);
  EXPECT_EQ(r.used_after, keep);
  EXPECT_FALSE(r.retention_exceeds_capacity);
  for (int i : {0, 2, 4, 8, 9, 10, 11}) EXPECT_TRUE(exists(*t, i)) << i;
  for (uint64_t i : want) EXPECT_FALSE(exists(*t, i)) << i;
}

TEST_F(TierAdminTest, DryRunChangesNothingAndPredictsTheRealRun) {
  populate(8, 3);
  uint64_t cap = 0;
  for (int i = 5; i < 11; ++i) cap += file_bytes(i);
  auto t = open(config(cap));
  const uint64_t used = t->used_bytes();
  DiskTier::GcReport dry = t->collect_garbage(/*dry_run=*/true);
  EXPECT_EQ(dry.evicted_blocks, 5u);
  EXPECT_EQ(dry.used_before, used);
  EXPECT_EQ(dry.used_after, cap);
  EXPECT_EQ(t->used_bytes(), used);
  EXPECT_EQ(t->block_count(), 11u);
  for (int i = 0; i < 11; ++i) EXPECT_TRUE(exists(*t, i)) << i;
  EXPECT_EQ(last_metrics().counter_value("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 0u);
  DiskTier::GcReport real = t->collect_garbage(false);
  ASSERT_EQ(real.evicted.size(), dry.evicted.size());
  for (size_t i = 0; i < real.evicted.size(); ++i) EXPECT_EQ(real.evicted[i].key, dry.evicted[i].key) << i;
  EXPECT_EQ(real.used_after, dry.used_after);
  EXPECT_EQ(real.evicted_bytes, dry.evicted_bytes);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(exists(*t, i)) << i;
}

TEST_F(TierAdminTest, GcUnderCapacityEvictsNothing) {
  const uint64_t total = populate(4, 2);
  auto t = open(config(total));
  DiskTier::GcReport r = t->collect_garbage(false);
  EXPECT_EQ(r.evicted_blocks, 0u);
  EXPECT_EQ(r.used_after, total);
  EXPECT_EQ(t->block_count(), 6u);
}

TEST_F(TierAdminTest, VerifyFindsCorruptTornAndMisnamedBlocksAndDeletesOnlyWhenAsked) {
  populate(0, 6);
  auto t = open(config(1ULL << 40));
  // Block 1: one payload byte flipped. Block 2: truncated. Block 3: a valid copy of block 4.
  {
    std::fstream f(t->block_path(key(1)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(kBlockHeaderBytes + 100);
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(kBlockHeaderBytes + 100);
    f.write(&c, 1);
  }
  std::filesystem::resize_file(t->block_path(key(2)), file_bytes(2) - 10);
  std::filesystem::copy_file(t->block_path(key(4)), t->block_path(key(3)),
                             std::filesystem::copy_options::overwrite_existing);
  for (int i : {0, 4, 5})
    EXPECT_EQ(t->verify_block(key(i), std::nullopt, true).result, DiskTier::VerifyResult::kOk);
  for (int i : {1, 2, 3}) {
    auto v = t->verify_block(key(i), std::nullopt, /*dry_run=*/true);
    EXPECT_EQ(v.result, DiskTier::VerifyResult::kCorrupt) << i;
    EXPECT_EQ(v.detail.code(), StatusCode::kDataLoss) << i;
    EXPECT_FALSE(v.deleted);
    EXPECT_TRUE(exists(*t, i)) << "dry run deleted block " << i;
  }
  EXPECT_EQ(last_metrics().counter_value("ds41_kv_disk_checksum_failures_total"), 0u);
  for (int i : {1, 2, 3}) {
    auto v = t->verify_block(key(i), std::nullopt, /*dry_run=*/false);
    EXPECT_EQ(v.result, DiskTier::VerifyResult::kCorrupt) << i;
    EXPECT_TRUE(v.deleted) << i;
    EXPECT_FALSE(exists(*t, i)) << i;
  }
  EXPECT_EQ(last_metrics().counter_value("ds41_kv_disk_checksum_failures_total"), 3u);
  EXPECT_EQ(last_metrics().counter_value("ds41_kv_disk_evictions_total", {{"reason", "corrupt"}}), 3u);
  EXPECT_EQ(t->block_count(), 3u);
  EXPECT_EQ(t->verify_block(key(1), std::nullopt, false).result, DiskTier::VerifyResult::kMissing);
}

TEST_F(TierAdminTest, VerifyKeepsBlocksOfAnotherFingerprint) {
  {
    auto t = open(config(1ULL << 40, /*fingerprint=*/42));
    put(*t, 0);
  }
  {
    auto t = open(config(1ULL << 40, /*fingerprint=*/7));
    put(*t, 1);
  }
  auto t = open(config(1ULL << 40, 42));
  // Without an expectation each block is checked against its own header's fingerprint.
  auto any1 = t->verify_block(key(1), std::nullopt, false);
  EXPECT_EQ(any1.result, DiskTier::VerifyResult::kOk);
  EXPECT_EQ(any1.meta.model_fingerprint, 7u);
  EXPECT_EQ(any1.meta.token_count, 128u);
  auto v = t->verify_block(key(1), 42, false);
  EXPECT_EQ(v.result, DiskTier::VerifyResult::kIncompatible);
  EXPECT_EQ(v.detail.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.meta.model_fingerprint, 7u);
  EXPECT_TRUE(exists(*t, 1));
  EXPECT_EQ(t->verify_block(key(0), 42, false).result, DiskTier::VerifyResult::kOk);
  EXPECT_EQ(t->verify_block(key(0), 7, false).result, DiskTier::VerifyResult::kIncompatible);
  EXPECT_TRUE(exists(*t, 0));
}

TEST_F(TierAdminTest, VerifyDoesNotStampAccessTimes) {
  populate(3, 0);
  clock_.advance_ns(kAdminHour);
  auto t = open(config(1ULL << 40));
  auto before = t->list_blocks();
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(t->verify_block(key(i), std::nullopt, false).result, DiskTier::VerifyResult::kOk);
  auto after = t->list_blocks();
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i].access_ns, after[i].access_ns) << i;
  auto st = PosixIo::instance().stat(t->block_path(key(0)));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->atime_ns, before[0].access_ns);
}

}  // namespace
}  // namespace ds41::kvcache
