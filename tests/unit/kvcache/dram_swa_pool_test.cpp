// Tests for kvcache/dram_swa_pool: capacity from the memory fraction, TTL expiry with immediate
// reclaim (FakeClock, no sleeps), expired-before-LRU, LRU among live entries, oversize refusal.
#include "kvcache/dram_swa_pool.h"

#include <gtest/gtest.h>

#include <thread>

#include "unit/kvcache/test_util.h"

namespace ds41::kvcache {
namespace {

constexpr size_t kSnap = 10000;
constexpr uint64_t kCharge = kSnap + DramSwaPool::kEntryOverheadBytes;

class DramPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<DramSwaPool> make(uint64_t entries, int64_t ttl_s = 300) {
    DramSwaPoolConfig c;
    c.capacity_bytes = entries * kCharge;
    c.ttl_ns = ttl_s * kNsPerSecond;
    auto p = DramSwaPool::create(c, clock_, metrics_);
    EXPECT_TRUE(p.ok());
    return std::move(*p);
  }
  static BlockKey key(uint64_t i) { return BlockKey{i, 99}; }
  static std::vector<uint8_t> snap(uint64_t i) { return testing::make_payload(i, kSnap); }
  bool has(DramSwaPool& p, uint64_t i) {
    SwaBytes b = p.get(key(i));
    if (!b) return false;
    EXPECT_EQ(*b, snap(i));
    return true;
  }
  uint64_t counter(const std::string& n, const MetricLabels& l) { return metrics_.counter_value(n, l); }
  FakeClock clock_;
  MetricsRegistry metrics_;
};

TEST_F(DramPoolTest, CapacityIsAFractionOfHostMemory) {
  DramSwaPoolConfig c;  // defaults: 10 %, 300 s
  auto p = DramSwaPool::create(c, clock_, metrics_, 64ULL << 30);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->capacity_bytes(), static_cast<uint64_t>((64ULL << 30) * 0.10));
  EXPECT_EQ(metrics_.gauge_value("ds41_kv_swa_capacity_bytes", {{"backend", "dram"}}),
            static_cast<int64_t>((*p)->capacity_bytes()));
  c.memory_fraction = 0.0;
  EXPECT_FALSE(DramSwaPool::create(c, clock_, metrics_).ok());
}

TEST_F(DramPoolTest, TtlExpiryIsReclaimedImmediately) {
  auto p = make(10, 300);
  ASSERT_TRUE(p->put(key(1), snap(1)).ok());
  ASSERT_TRUE(p->put(key(2), snap(2), 10 * kNsPerSecond).ok());  // per-entry TTL
  clock_.advance_s(9);
  EXPECT_TRUE(has(*p, 2));
  clock_.advance_s(1);  // exactly at expiry: gone
  EXPECT_FALSE(p->contains(key(2)));
  EXPECT_EQ(p->used_bytes(), kCharge);
  clock_.advance_s(289);
  EXPECT_TRUE(has(*p, 1));  // a get does not extend the TTL
  clock_.advance_s(1);
  p->reclaim_expired();  // no other operation needed
  EXPECT_EQ(p->used_bytes(), 0u);
  EXPECT_EQ(p->entry_count(), 0u);
  EXPECT_EQ(metrics_.gauge_value("ds41_kv_swa_bytes", {{"backend", "dram"}}), 0);
  EXPECT_FALSE(has(*p, 1));
  EXPECT_EQ(counter("ds41_kv_swa_evictions_total", {{"backend", "dram"}, {"reason", "ttl"}}), 2u);
  EXPECT_EQ(counter("ds41_kv_swa_misses_total", {{"backend", "dram"}}), 1u);
}

TEST_F(DramPoolTest, ExpiredEntriesGoBeforeAnyLiveOne) {
  auto p = make(3);
  ASSERT_TRUE(p->put(key(1), snap(1), 10 * kNsPerSecond).ok());
  ASSERT_TRUE(p->put(key(2), snap(2)).ok());
  ASSERT_TRUE(p->put(key(3), snap(3)).ok());
  EXPECT_TRUE(has(*p, 1));  // 1 is now the most recently used, but it will expire
  clock_.advance_s(11);
  ASSERT_TRUE(p->put(key(4), snap(4)).ok());
  EXPECT_TRUE(has(*p, 2));
  EXPECT_TRUE(has(*p, 3));
  EXPECT_TRUE(has(*p, 4));
  EXPECT_EQ(counter("ds41_kv_swa_evictions_total", {{"backend", "dram"}, {"reason", "lru"}}), 0u);
}

TEST_F(DramPoolTest, LruAmongLiveEntriesWhenFull) {
  auto p = make(3);
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(p->put(key(i), snap(i)).ok());
  EXPECT_TRUE(has(*p, 1));
  ASSERT_TRUE(p->put(key(4), snap(4)).ok());  // evicts 2 (least recently used)
  EXPECT_FALSE(p->contains(key(2)));
  EXPECT_TRUE(has(*p, 1));
  EXPECT_TRUE(has(*p, 3));
  EXPECT_LE(p->used_bytes(), p->capacity_bytes());
  // Replacing a key does not double-charge it.
  ASSERT_TRUE(p->put(key(4), snap(4)).ok());
  EXPECT_EQ(p->entry_count(), 3u);
  EXPECT_EQ(p->used_bytes(), 3 * kCharge);
  EXPECT_EQ(counter("ds41_kv_swa_evictions_total", {{"backend", "dram"}, {"reason", "lru"}}), 1u);
  // Held values survive eviction (shared ownership).
  SwaBytes held = p->get(key(1));
  for (uint64_t i = 10; i < 20; ++i) ASSERT_TRUE(p->put(key(i), snap(i)).ok());
  EXPECT_FALSE(p->contains(key(1)));
  EXPECT_EQ(*held, snap(1));
}

TEST_F(DramPoolTest, OversizedSnapshotIsRefused) {
  auto p = make(2);
  std::vector<uint8_t> big(3 * kCharge);
  auto s = p->put(key(1), big);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("exceeds"), std::string::npos);
  EXPECT_EQ(p->entry_count(), 0u);
}

TEST_F(DramPoolTest, ConcurrentUseKeepsAccountingExact) {
  auto p = make(50);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      for (uint64_t i = 0; i < 300; ++i) {
        uint64_t k = (i * 7 + t) % 80;
        if (i % 3 == 0)
          (void)p->put(key(k), snap(k));
        else if (SwaBytes b = p->get(key(k))) {
          EXPECT_EQ(b->size(), kSnap);
        }
        if (i % 50 == 0) clock_.advance_s(30);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_LE(p->used_bytes(), p->capacity_bytes());
  EXPECT_EQ(p->used_bytes(), p->entry_count() * kCharge);
}

// put_owned keeps the caller's buffer (no copy: the stored bytes are the same allocation) and
// charges its capacity, so spare room in an owned buffer cannot hide memory from the cap.
TEST_F(DramPoolTest, PutOwnedStoresTheBufferWithoutCopyAndChargesCapacity) {
  auto p = make(4);
  std::vector<uint8_t> v = snap(1);
  v.reserve(v.size() + 4096);
  const uint8_t* data = v.data();
  const uint64_t cap = v.capacity();
  ASSERT_TRUE(p->put_owned(key(1), std::move(v)).ok());
  SwaBytes b = p->get(key(1));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->data(), data) << "the pool copied the owned buffer";
  EXPECT_EQ(*b, snap(1));
  EXPECT_EQ(metrics_.gauge_value("ds41_kv_swa_bytes", {{"backend", "dram"}}),
            static_cast<int64_t>(cap + DramSwaPool::kEntryOverheadBytes));
  // A value that can never fit is refused before anything is stored (both entry points).
  std::vector<uint8_t> huge(5 * kCharge);
  EXPECT_EQ(p->put_owned(key(2), huge).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p->put(key(3), huge).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(p->get(key(2)));
  EXPECT_TRUE(has(*p, 1));
}

}  // namespace
}  // namespace ds41::kvcache
