// Tests for kvcache/disk_tier: round trips, restart (index rebuild), retention (never evict a
// young block; refuse writes instead), LRU above retention, corrupt/torn/vanished files, blocks
// written by another instance, stale temp cleanup. Time comes from a FakeClock: no sleeps.
#include "kvcache/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kvcache/posix_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

constexpr int64_t kDiskHour = 3600 * kNsPerSecond;
constexpr size_t kDiskPayload = 4000;
constexpr uint64_t kFileBytes = kBlockHeaderBytes + kDiskPayload;

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierConfig config(uint64_t capacity_blocks = 1000) {
    DiskTierConfig c;
    c.dir = dir_.sub("store");
    c.capacity_bytes = capacity_blocks * kFileBytes;
    c.model_fingerprint = 42;
    c.sync = false;  // durability is the crash test's job; keep this fast
    c.touch_interval_ns = 0;
    return c;
  }
  std::unique_ptr<DiskTier> open(const DiskTierConfig& c) {
    auto t = DiskTier::open(c, PosixIo::instance(), clock_, metrics_);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }
  static BlockKey key(uint64_t i) { return BlockKey{i * 7919 + 1, i}; }
  static std::vector<uint8_t> payload(uint64_t i) { return testing::make_payload(i, kDiskPayload); }
  void expect_block(DiskTier& t, uint64_t i) {
    auto b = t.get(key(i));
    ASSERT_TRUE(b.has_value()) << "block " << i << " missing";
    auto want = payload(i);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), b->payload().begin(), b->payload().end())) << i;
    EXPECT_EQ(b->meta.token_count, 128u);
  }
  uint64_t counter(const std::string& n, const MetricLabels& l = {}) { return metrics_.counter_value(n, l); }

  testing::ScratchDir dir_{"disk"};
  FakeClock clock_;
  MetricsRegistry metrics_;
};

TEST_F(DiskTierTest, PutGetRoundTripAndDedup) {
  auto t = open(config());
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
  for (uint64_t i = 0; i < 20; ++i) expect_block(*t, i);
  EXPECT_FALSE(t->get(key(99)).has_value());
  EXPECT_EQ(counter("ds41_kv_disk_hits_total"), 20u);
  EXPECT_EQ(counter("ds41_kv_disk_misses_total"), 1u);
  EXPECT_EQ(t->block_count(), 20u);
  EXPECT_EQ(t->used_bytes(), 20 * kFileBytes);
  ASSERT_TRUE(t->put(key(3), 128, payload(3)).ok());
  EXPECT_EQ(counter("ds41_kv_disk_write_dedup_total"), 1u);
  EXPECT_EQ(t->block_count(), 20u);
  EXPECT_TRUE(std::filesystem::exists(t->block_path(key(3))));
  EXPECT_NE(t->block_path(key(3)).find("/blocks/" + key(3).hex().substr(0, 2) + "/" + key(3).hex() + ".kvb"),
            std::string::npos);
}

TEST_F(DiskTierTest, IndexIsRebuiltOnRestart) {
  {
    auto t = open(config());
    for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
  }
  auto t = open(config());
  EXPECT_EQ(t->block_count(), 50u);
  EXPECT_EQ(t->used_bytes(), 50 * kFileBytes);
  for (uint64_t i = 0; i < 50; i += 7) expect_block(*t, i);
  EXPECT_GE(t->last_scan_ms(), 0.0);
}

TEST_F(DiskTierTest, YoungBlocksAreNeverEvictedWritesAreRefused) {
  auto t = open(config(4));
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
  clock_.advance_ns(71 * kDiskHour);
  auto s = t->put(key(4), 128, payload(4));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("retention"), std::string::npos);
  EXPECT_EQ(counter("ds41_kv_disk_writes_refused_total"), 1u);
  EXPECT_NE(metrics_.prometheus_text().find("ds41_kv_disk_writes_refused_total 1"), std::string::npos);
  for (uint64_t i = 0; i < 4; ++i) expect_block(*t, i);
  EXPECT_FALSE(t->contains(key(4)));
  // A restart does not reset block ages (they come from the file mtime).
  t.reset();
  t = open(config(4));
  EXPECT_EQ(t->put(key(4), 128, payload(4)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(counter("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 0u);
}

TEST_F(DiskTierTest, LruEvictionAboveRetention) {
  auto t = open(config(4));
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
    clock_.advance_ns(1 * kNsPerSecond);
  }
  clock_.advance_ns(73 * kDiskHour);
  // Use blocks 0 and 2 (in that order): LRU order becomes 1, 3, 0, 2.
  expect_block(*t, 0);
  clock_.advance_ns(kNsPerSecond);
  expect_block(*t, 2);
  ASSERT_TRUE(t->put(key(10), 128, payload(10)).ok());
  EXPECT_FALSE(t->contains(key(1)));
  EXPECT_FALSE(std::filesystem::exists(t->block_path(key(1))));
  ASSERT_TRUE(t->put(key(11), 128, payload(11)).ok());
  EXPECT_FALSE(t->contains(key(3)));
  ASSERT_TRUE(t->put(key(12), 128, payload(12)).ok());
  EXPECT_FALSE(t->contains(key(0)));
  expect_block(*t, 2);
  EXPECT_EQ(counter("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 3u);
  EXPECT_LE(t->used_bytes(), 4 * kFileBytes);
  // Now 2 is old, 10..12 are young: one more write evicts 2, the next one is refused.
  ASSERT_TRUE(t->put(key(13), 128, payload(13)).ok());
  EXPECT_FALSE(t->contains(key(2)));
  EXPECT_EQ(t->put(key(14), 128, payload(14)).code(), StatusCode::kResourceExhausted);
  for (uint64_t i : {10, 11, 12, 13}) expect_block(*t, i);
}

TEST_F(DiskTierTest, MixedAgesEvictOnlyOldBlocks) {
  auto t = open(config(6));
  for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());  // will be old
  clock_.advance_ns(71 * kDiskHour);
  for (uint64_t i = 3; i < 6; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());  // stay young
  clock_.advance_ns(2 * kDiskHour);
  // Make a young block the least recently used of all: it still must not be evicted.
  clock_.advance_ns(kNsPerSecond);
  for (uint64_t i : {0, 1, 2}) expect_block(*t, i);
  for (uint64_t i = 6; i < 9; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok()) << i;
  for (uint64_t i = 0; i < 3; ++i) EXPECT_FALSE(t->contains(key(i)));
  for (uint64_t i = 3; i < 9; ++i) expect_block(*t, i);
  EXPECT_EQ(t->put(key(9), 128, payload(9)).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(counter("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 3u);
}

TEST_F(DiskTierTest, LruAccessTimesSurviveRestartThroughAtime) {
  {
    auto t = open(config(3));
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
    clock_.advance_ns(80 * kDiskHour);
    expect_block(*t, 0);  // stamps atime
  }
  auto t = open(config(3));
  clock_.advance_ns(kNsPerSecond);
  ASSERT_TRUE(t->put(key(5), 128, payload(5)).ok());
  EXPECT_TRUE(t->contains(key(0)));
  EXPECT_EQ(t->contains(key(1)) + t->contains(key(2)), 1);
}

TEST_F(DiskTierTest, CorruptTornAndEmptyFilesAreMissesAndDeleted) {
  auto t = open(config());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(t->put(key(i), 128, payload(i)).ok());
  // Bit flip in the payload.
  {
    std::fstream f(t->block_path(key(0)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x5a');
  }
  // Torn: truncated mid-payload.
  ASSERT_EQ(::truncate(t->block_path(key(1)).c_str(), kBlockHeaderBytes + 100), 0);
  // Empty file.
  ASSERT_EQ(::truncate(t->block_path(key(2)).c_str(), 0), 0);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(t->get(key(i)).has_value()) << i;
    EXPECT_FALSE(std::filesystem::exists(t->block_path(key(i)))) << i;
    EXPECT_FALSE(t->contains(key(i)));
  }
  expect_block(*t, 3);
  EXPECT_EQ(counter("ds41_kv_disk_checksum_failures_total"), 3u);
  EXPECT_EQ(counter("ds41_kv_disk_evictions_total", {{"reason", "corrupt"}}), 3u);
  EXPECT_EQ(t->block_count(), 1u);
  // A block file renamed to another key's name is wrong content for that name.
  std::filesystem::copy_file(t->block_path(key(3)), t->block_path(key(7)));
  EXPECT_FALSE(t->get(key(7)).has_value());
  EXPECT_FALSE(std::filesystem::exists(t->block_path(key(7))));
}

TEST_F(DiskTierTest, OtherModelFingerprintIsAMissButNotDeleted) {
  auto t = open(config());
  ASSERT_TRUE(t->put(key(1), 128, payload(1)).ok());
  auto c = config();
  c.model_fingerprint = 43;
  auto other = open(c);
  EXPECT_FALSE(other->get(key(1)).has_value());
  EXPECT_TRUE(std::filesystem::exists(t->block_path(key(1))));
  EXPECT_EQ(counter("ds41_kv_disk_incompatible_total"), 1u);
}

TEST_F(DiskTierTest, SharedDirectorySeesOtherWritersAndExternalDeletes) {
  auto a = open(config());
  auto b = open(config());
  ASSERT_TRUE(a->put(key(1), 128, payload(1)).ok());
  EXPECT_EQ(b->block_count(), 0u);
  EXPECT_TRUE(b->contains(key(1)));  // found in the directory, adopted into b's index
  expect_block(*b, 1);
  ASSERT_TRUE(b->put(key(1), 128, payload(1)).ok());  // content address: dedup, no rewrite
  EXPECT_EQ(counter("ds41_kv_disk_write_dedup_total"), 1u);
  ASSERT_TRUE(b->erase(key(1)).ok());
  EXPECT_FALSE(a->get(key(1)).has_value());  // a's index entry is dropped on the miss
  EXPECT_EQ(a->block_count(), 0u);
  EXPECT_EQ(counter("ds41_kv_disk_evictions_total", {{"reason", "external"}}), 1u);
  ASSERT_TRUE(a->put(key(2), 128, payload(2)).ok());
  ASSERT_TRUE(b->rescan().ok());
  EXPECT_EQ(b->block_count(), 1u);
}

TEST_F(DiskTierTest, EvictionRespectsAnotherProcessesRecentUse) {
  auto c = config(2);
  auto a = open(c);
  auto b = open(c);
  ASSERT_TRUE(a->put(key(0), 128, payload(0)).ok());
  clock_.advance_ns(kNsPerSecond);
  ASSERT_TRUE(a->put(key(1), 128, payload(1)).ok());
  clock_.advance_ns(100 * kDiskHour);
  expect_block(*b, 0);  // b uses block 0: stamps its atime; a's index does not know
  clock_.advance_ns(kNsPerSecond);
  ASSERT_TRUE(a->put(key(2), 128, payload(2)).ok());
  EXPECT_TRUE(std::filesystem::exists(a->block_path(key(0))));   // recently used elsewhere: kept
  EXPECT_FALSE(std::filesystem::exists(a->block_path(key(1))));  // evicted instead
}

TEST_F(DiskTierTest, StaleTempFilesAreRemovedFreshOnesKept) {
  auto c = config();
  { auto t = open(c); }
  // Block temps live beside their final names (blocks/<hh>/.<key>....tmp); tmp/ holds the
  // LAYOUT marker's. Both places are cleaned at open, only of clearly abandoned files.
  std::string stale = c.dir + "/tmp/stale.tmp", fresh = c.dir + "/tmp/fresh.tmp";
  std::string stale_b = c.dir + "/blocks/ab/.abcdef.host.1.2.3.tmp";
  std::string fresh_b = c.dir + "/blocks/07/.07cdef.host.1.2.4.tmp";
  for (const auto& p : {stale, fresh, stale_b, fresh_b}) std::ofstream(p) << "x";
  int64_t old_ns = clock_.now_unix_ns() - 2 * kDiskHour;
  for (const auto& p : {stale, stale_b}) ASSERT_TRUE(PosixIo::instance().set_times(p, old_ns, old_ns).ok());
  for (const auto& p : {fresh, fresh_b})
    ASSERT_TRUE(PosixIo::instance().set_times(p, clock_.now_unix_ns(), clock_.now_unix_ns()).ok());
  auto t = open(c);
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(fresh));
  EXPECT_FALSE(std::filesystem::exists(stale_b));
  EXPECT_TRUE(std::filesystem::exists(fresh_b));
  EXPECT_EQ(t->block_count(), 0u);  // temps are never indexed as blocks
}

TEST_F(DiskTierTest, BadConfigAndOversizedBlock) {
  DiskTierConfig c;
  auto r = DiskTier::open(c, PosixIo::instance(), clock_, metrics_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dir"), std::string::npos);
  auto t = open(config(1));
  std::vector<uint8_t> big(2 * kFileBytes);
  EXPECT_EQ(t->put(key(1), 128, big).code(), StatusCode::kResourceExhausted);
  // A foreign LAYOUT marker is refused with a clear message.
  auto c2 = config();
  c2.dir = dir_.sub("other");
  std::filesystem::create_directories(c2.dir);
  std::ofstream(c2.dir + "/LAYOUT") << "something else\n";
  auto r2 = DiskTier::open(c2, PosixIo::instance(), clock_, metrics_);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("LAYOUT"), std::string::npos);
}

}  // namespace
}  // namespace ds41::kvcache
