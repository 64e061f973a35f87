// BlockPrefetcher (block_prefetcher.h) over a real DiskTier in a scratch directory, reads held at a
// GateIo: blocks come back in order and a read stops at the first miss; the queue is bounded;
// cancel() of a queued, running or finished read leaves nothing behind; the listener runs once
// per delivered read and never after it is cleared; destruction with reads queued and running
// does not wait for the queued ones. Part of the CI TSan job (scripts/test.sh).
#include "engine/block_prefetcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "core/clock.h"
#include "kvcache/disk_tier.h"
#include "kvcache/metrics.h"
#include "unit/engine/gate_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::engine {
namespace {

using kvcache::BlockKey;
using namespace std::chrono_literals;

class BlockPrefetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvcache::DiskTierConfig c;
    c.dir = dir_.str();
    c.capacity_bytes = 16ull << 20;
    c.sync = false;
    c.model_fingerprint = 7;
    auto t = kvcache::DiskTier::open(c, gate_, clock_, metrics_);
    ASSERT_TRUE(t.ok()) << t.status().message();
    tier_ = std::move(*t);
    for (uint64_t i = 0; i < 3; ++i) {
      keys_.push_back(BlockKey{0x1000 + i, 0x2000 + i});
      payloads_.push_back(ds41::testing::make_payload(i, 1000 + 100 * i));
      ASSERT_TRUE(tier_->put(keys_[i], 128, payloads_[i]).ok());
    }
  }
  // Waits for `n` finished reads (or 10 s).
  std::vector<BlockRead> take(BlockPrefetcher& p, size_t n) {
    std::vector<BlockRead> out;
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (out.size() < n && std::chrono::steady_clock::now() < end) {
      for (auto& r : p.take_completed()) out.push_back(std::move(r));
      if (out.size() < n) std::this_thread::sleep_for(1ms);
    }
    return out;
  }

  ds41::testing::ScratchDir dir_{"prefetcher"};
  ds41::testing::GateIo gate_;
  FakeClock clock_;
  kvcache::MetricsRegistry metrics_;
  std::unique_ptr<kvcache::DiskTier> tier_;
  std::vector<BlockKey> keys_;
  std::vector<std::vector<uint8_t>> payloads_;
};

TEST_F(BlockPrefetcherTest, ReadsInOrderAndStopsAtTheFirstMiss) {
  BlockPrefetcher p(*tier_, BlockPrefetcherConfig{});
  std::atomic<int> notified{0};
  p.set_listener([&] { notified.fetch_add(1); });
  auto all = p.submit(keys_);
  ASSERT_TRUE(all.ok());
  auto r = take(p, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].ticket, *all);
  EXPECT_TRUE(r[0].status.ok());
  ASSERT_EQ(r[0].blocks.size(), 3u);
  uint64_t bytes = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(*r[0].blocks[i], payloads_[i]);
    bytes += payloads_[i].size();
  }
  EXPECT_EQ(r[0].bytes, bytes);
  EXPECT_EQ(r[0].keys, keys_);
  // A missing block ends the read: the blocks after it are of no use to a prefix.
  auto gap = p.submit({keys_[0], BlockKey{9, 9}, keys_[2]});
  ASSERT_TRUE(gap.ok());
  r = take(p, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_FALSE(r[0].status.ok());
  ASSERT_EQ(r[0].blocks.size(), 1u);
  EXPECT_EQ(*r[0].blocks[0], payloads_[0]);
  EXPECT_EQ(notified.load(), 2);
  EXPECT_EQ(p.outstanding(), 0u);
  EXPECT_FALSE(p.submit({}).ok());
}

TEST_F(BlockPrefetcherTest, BoundedQueueAndCancelOfQueuedRunningAndFinishedReads) {
  BlockPrefetcherConfig c;
  c.threads = 1;
  c.max_queued = 1;
  BlockPrefetcher p(*tier_, c);
  std::atomic<int> notified{0};
  p.set_listener([&] { notified.fetch_add(1); });
  gate_.hold();
  auto running = p.submit({keys_[0]});
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(gate_.wait_held(1, 10s));  // the one thread is inside the read
  auto queued = p.submit({keys_[1]});
  ASSERT_TRUE(queued.ok());
  auto refused = p.submit({keys_[2]});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  p.cancel(*queued);  // queued: dropped, its room is free again
  auto later = p.submit({keys_[2]});
  ASSERT_TRUE(later.ok());
  p.cancel(*running);  // running: its result is discarded
  EXPECT_EQ(p.outstanding(), 1u);
  gate_.release();
  auto r = take(p, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].ticket, *later);
  EXPECT_EQ(*r[0].blocks.at(0), payloads_[2]);
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(p.take_completed().empty());
  EXPECT_EQ(notified.load(), 1);
  // Finished but not taken: cancel removes it.
  auto done = p.submit({keys_[1]});
  ASSERT_TRUE(done.ok());
  for (int i = 0; i < 1000 && notified.load() < 2; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(notified.load(), 2);
  EXPECT_EQ(p.outstanding(), 1u);
  p.cancel(*done);
  EXPECT_EQ(p.outstanding(), 0u);
  EXPECT_TRUE(p.take_completed().empty());
  p.cancel(12345);  // unknown: ignored
  // A cleared listener is never called again.
  p.set_listener({});
  ASSERT_TRUE(p.submit({keys_[0]}).ok());
  EXPECT_EQ(take(p, 1).size(), 1u);
  EXPECT_EQ(notified.load(), 2);
}

TEST_F(BlockPrefetcherTest, DestructionDropsQueuedReadsAndWaitsOnlyForTheRunningOne) {
  BlockPrefetcherConfig c;
  c.threads = 1;
  auto p = std::make_unique<BlockPrefetcher>(*tier_, c);
  gate_.hold();
  ASSERT_TRUE(p->submit({keys_[0]}).ok());
  ASSERT_TRUE(gate_.wait_held(1, 10s));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p->submit(keys_).ok());
  const int reads_before = gate_.reads();
  auto destroyed = std::async(std::launch::async, [&] { p.reset(); });
  EXPECT_EQ(destroyed.wait_for(300ms), std::future_status::timeout);  // the running read is held
  gate_.release();
  ASSERT_EQ(destroyed.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(gate_.reads(), reads_before + 1);  // only the running read went on; the queued ones never ran
}

}  // namespace
}  // namespace ds41::engine
