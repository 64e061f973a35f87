// Tests for kvcache/kv_store + prefix_lookup: longest cached prefix over the chain, SWA snapshot
// at exactly that length, restore stopping at the first miss, SWA verification.
#include "kvcache/kv_store.h"

#include <gtest/gtest.h>

#include "kvcache/dram_swa_pool.h"
#include "kvcache/posix_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KvStoreConfig c;
    c.model_identity = "ds41-test-model";
    c.model_fingerprint = 0xabc;
    c.block_tokens = 128;
    c.disk.dir = dir_.sub("store");
    c.disk.capacity_bytes = 1ULL << 30;
    c.disk.sync = false;
    c.dram.capacity_bytes = 64 << 20;
    auto s = KvStore::open(c, PosixIo::instance(), clock_, metrics_);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    store_ = std::move(*s);
  }
  // Writes the first n blocks of `toks` through the async writer and waits for them.
  void write_blocks(const std::vector<int32_t>& toks, size_t n) {
    auto keys = store_->hasher().chain_keys(toks);
    for (size_t i = 0; i < n; ++i)
      ASSERT_TRUE(
          store_->write_block(keys[i], 128, testing::make_payload(keys[i].lo, 890 * 128), SubmitMode::kBlock)
              .ok());
    store_->writer().drain();
  }
  testing::ScratchDir dir_{"store"};
  FakeClock clock_;
  MetricsRegistry metrics_;
  std::unique_ptr<KvStore> store_;
};

TEST_F(KvStoreTest, LongestPrefixAndSwaAtExactlyThatLength) {
  auto toks = testing::make_tokens(5, 128 * 10 + 50);
  EXPECT_EQ(store_->lookup(toks).cached_tokens, 0u);
  write_blocks(toks, 6);
  auto r = store_->lookup(toks);
  EXPECT_EQ(r.cached_blocks, 6u);
  EXPECT_EQ(r.cached_tokens, 768u);
  EXPECT_FALSE(r.swa_snapshot);
  // Snapshots at other lengths do not count.
  ASSERT_TRUE(store_->put_swa(std::span(toks).first(767), testing::make_payload(1, 5000)).ok());
  ASSERT_TRUE(store_->put_swa(std::span(toks).first(896), testing::make_payload(2, 5000)).ok());
  EXPECT_FALSE(store_->lookup(toks).swa_snapshot);
  ASSERT_TRUE(store_->put_swa(std::span(toks).first(768), testing::make_payload(3, 5000)).ok());
  r = store_->lookup(toks);
  EXPECT_TRUE(r.swa_snapshot);
  EXPECT_EQ(r.swa_key, store_->hasher().prefix_key(std::span(toks).first(768)));
  auto snap = store_->get_swa(std::span(toks).first(768));
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->token_count, 768u);
  auto want = testing::make_payload(3, 5000);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), snap->payload().begin(), snap->payload().end()));
  // max_tokens caps the walk.
  EXPECT_EQ(store_->lookup(toks, 600).cached_blocks, 4u);
  // A hole in the chain ends the prefix even though later blocks exist.
  ASSERT_TRUE(store_->disk().erase(r.block_keys[3]).ok());
  EXPECT_EQ(store_->lookup(toks).cached_blocks, 3u);
  // A sequence diverging inside block 4 shares exactly 4 blocks... minus the hole: 3.
  auto other = toks;
  other[4 * 128 + 1] += 1;
  write_blocks(toks, 4);  // repair the hole
  EXPECT_EQ(store_->lookup(other).cached_blocks, 4u);
  EXPECT_EQ(store_->lookup(toks).cached_blocks, 6u);
}

TEST_F(KvStoreTest, RestoreReturnsExactBytesAndStopsAtFirstMiss) {
  auto toks = testing::make_tokens(6, 128 * 8);
  write_blocks(toks, 8);
  auto r = store_->lookup(toks);
  ASSERT_EQ(r.cached_blocks, 8u);
  ThreadPool pool(2);
  auto blocks = store_->restore(r.block_keys, &pool);
  ASSERT_EQ(blocks.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    auto want = testing::make_payload(r.block_keys[i].lo, 890 * 128);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), blocks[i].payload().begin(), blocks[i].payload().end()));
    EXPECT_EQ(blocks[i].meta.key, r.block_keys[i]);
  }
  // Evicted between lookup and restore (another process): restore is shorter, never wrong.
  ASSERT_TRUE(store_->disk().erase(r.block_keys[5]).ok());
  EXPECT_EQ(store_->restore(r.block_keys).size(), 5u);
}

// The parallel restore (dynamic in-order assignment + read-ahead window): a long chain comes back
// complete and in order; with a hole, exactly the prefix before it comes back and the readers
// stop soon after the miss (at most one block in flight per other thread is read past it).
TEST_F(KvStoreTest, ParallelRestoreOfLongChainIsOrderedAndStopsNearTheHole) {
  constexpr size_t kBlocks = 64;
  auto toks = testing::make_tokens(16, 128 * kBlocks);
  write_blocks(toks, kBlocks);
  auto r = store_->lookup(toks);
  ASSERT_EQ(r.cached_blocks, kBlocks);
  ThreadPool pool(4);
  auto check = [&](const std::vector<StoredBlock>& blocks) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      ASSERT_EQ(blocks[i].meta.key, r.block_keys[i]) << i;
      auto want = testing::make_payload(r.block_keys[i].lo, 890 * 128);
      ASSERT_TRUE(
          std::equal(want.begin(), want.end(), blocks[i].payload().begin(), blocks[i].payload().end()))
          << i;
    }
  };
  auto all = store_->restore(r.block_keys, &pool);
  ASSERT_EQ(all.size(), kBlocks);
  check(all);
  ASSERT_TRUE(store_->disk().erase(r.block_keys[37]).ok());
  const uint64_t hits0 = metrics_.counter_value("ds41_kv_disk_hits_total");
  auto part = store_->restore(r.block_keys, &pool);
  ASSERT_EQ(part.size(), 37u);
  check(part);
  EXPECT_LE(metrics_.counter_value("ds41_kv_disk_hits_total") - hits0, 37u + 3u);
}

TEST_F(KvStoreTest, CorruptSwaSnapshotIsAMissAndErased) {
  auto toks = testing::make_tokens(7, 300);
  BlockKey k = store_->hasher().prefix_key(toks);
  ASSERT_TRUE(store_->put_swa(toks, testing::make_payload(9, 4000)).ok());
  SwaBytes raw = store_->swa().get(k);
  ASSERT_TRUE(raw);
  auto bad = *raw;
  bad[bad.size() - 10] ^= 4;
  ASSERT_TRUE(store_->swa().put(k, bad).ok());
  EXPECT_FALSE(store_->get_swa(toks).has_value());
  EXPECT_FALSE(store_->swa().contains(k));
  EXPECT_EQ(metrics_.counter_value("ds41_kv_swa_checksum_failures_total"), 1u);
  // A snapshot stored under another prefix's key is rejected too.
  auto toks2 = testing::make_tokens(8, 300);
  ASSERT_TRUE(store_->put_swa(toks2, testing::make_payload(10, 100)).ok());
  ASSERT_TRUE(store_->swa().put(k, *store_->swa().get(store_->hasher().prefix_key(toks2))).ok());
  EXPECT_FALSE(store_->get_swa(toks).has_value());
  // Expiry through the store's clock.
  ASSERT_TRUE(store_->put_swa(toks, testing::make_payload(9, 4000)).ok());
  clock_.advance_s(301);
  EXPECT_FALSE(store_->get_swa(toks).has_value());
}

TEST_F(KvStoreTest, MetricsExportCoversBothTiers) {
  auto toks = testing::make_tokens(11, 256);
  write_blocks(toks, 2);
  (void)store_->restore(store_->lookup(toks).block_keys);
  std::string text = metrics_.prometheus_text();
  for (const char* name :
       {"ds41_kv_disk_hits_total 2", "ds41_kv_disk_used_bytes", "ds41_kv_write_queue_depth 0",
        "ds41_kv_swa_bytes{backend=\"dram\"}", "ds41_kv_disk_evictions_total{reason=\"lru\"} 0",
        "ds41_kv_disk_checksum_failures_total 0", "ds41_kv_disk_writes_refused_total 0"})
    EXPECT_NE(text.find(name), std::string::npos) << name << "\n" << text;
}

}  // namespace
}  // namespace ds41::kvcache
