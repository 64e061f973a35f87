// PrefixCache in the request path (issue 13): EngineLoop + CpuEngine on the public golden tiny
// model (window 8, top-k 8, candidate pool 6 x 2; prompts of 300+ tokens exceed every limit).
// Greedy outputs with a cache hit are token-identical to a loop without a cache; TTL expiry and
// disk retention run on a FakeClock (no sleeping); tiers engine -> DRAM -> disk; a corrupt disk
// block is a miss and deleted; two requests sharing a prefix compute it once; a preempted
// sequence resumes by an exact restore.
#include "engine/prefix_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/block_tier.h"
#include "engine/cpu_engine.h"
#include "engine/engine_loop.h"
#include "golden/golden_arrays.h"
#include "unit/engine/loop_test_util.h"
#include "unit/kvcache/test_util.h"

namespace ds41::engine {
namespace {

using namespace std::chrono_literals;
using kvcache::BlockKey;
using looptest::collect;
using looptest::greedy;
using looptest::Outcome;
using looptest::random_prompt;

class PrefixCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new ds41::testing::TestModel(ds41::testing::load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  void SetUp() override {
    ASSERT_TRUE(tm_->model);
    eng_ = std::make_unique<CpuEngine>(tm_->model.get(), "tiny");
  }
  PrefixCacheConfig base_config() {
    PrefixCacheConfig c;
    c.model_identity = "golden-tiny-test";
    c.dram_swa.capacity_bytes = 256ull << 20;
    c.swa_ttl_ns = 300 * kvcache::kNsPerSecond;
    return c;
  }
  void make_cache(PrefixCacheConfig c) {
    metrics_ = std::make_unique<kvcache::MetricsRegistry>();
    auto pc = PrefixCache::create(c, clock_, *metrics_);
    ASSERT_TRUE(pc.ok()) << pc.status().message();
    pc_ = std::move(*pc);
  }
  // Runs the requests (submitted together) through a loop with the cache (or without: cold).
  std::vector<Outcome> run(std::vector<GenerationRequest> reqs, bool cached = true, LoopConfig lc = {}) {
    lc.prefix_cache = cached ? pc_.get() : nullptr;
    CpuEngine eng(tm_->model.get(), "tiny");
    return looptest::run_requests(cached ? *eng_ : eng, lc, std::move(reqs), &stats_);
  }
  Outcome run1(GenerationRequest r, bool cached = true) { return run({std::move(r)}, cached)[0]; }
  uint64_t counter(const std::string& name, const kvcache::MetricLabels& l = {}) {
    return metrics_->counter_value(name, l);
  }

  static ds41::testing::TestModel* tm_;
  std::unique_ptr<CpuEngine> eng_;
  FakeClock clock_;
  std::unique_ptr<kvcache::MetricsRegistry> metrics_;
  std::unique_ptr<PrefixCache> pc_;
  LoopStats stats_;
};
ds41::testing::TestModel* PrefixCacheTest::tm_ = nullptr;

TEST_F(PrefixCacheTest, RepeatedPromptRestoresAllButTheLastTokenExactly) {
  make_cache(base_config());
  auto p = random_prompt(300, 1);
  const Outcome cold = run1(greedy(p, 6), false);
  const Outcome first = run1(greedy(p, 6));
  EXPECT_EQ(first.tokens, cold.tokens);
  EXPECT_EQ(first.last.cached_tokens, 0);
  EXPECT_EQ(first.last.cache.swa, "none");
  EXPECT_TRUE(first.last.cache.enabled);
  const Outcome again = run1(greedy(p, 6));
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(again.last.cached_tokens, 299);
  EXPECT_EQ(again.last.cache.swa, "restored");
  EXPECT_EQ(again.last.cache.engine_tokens, 256);
  EXPECT_EQ(again.last.cache.snapshot_tokens, 43);
  EXPECT_EQ(stats_.prefill_tokens_computed, 1);
  EXPECT_EQ(counter("ds41_prefix_cache_swa_total", {{"result", "restored"}}), 1u);
}

TEST_F(PrefixCacheTest, MultiTurnRestoresTheEndOfTheOutputExactly) {
  make_cache(base_config());
  auto p1 = random_prompt(280, 2);
  const Outcome t1 = run1(greedy(p1, 10));
  // Turn 2 = turn 1's prompt + its answer + a new message.
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  auto extra = random_prompt(60, 3);
  p2.insert(p2.end(), extra.begin() + 1, extra.end());
  const Outcome t2 = run1(greedy(p2, 10));
  const Outcome cold = run1(greedy(p2, 10), false);
  EXPECT_EQ(t2.tokens, cold.tokens);
  // Everything turn 1 consumed: its prompt and all answer tokens but the last.
  EXPECT_EQ(t2.last.cached_tokens, 280 + 10 - 1);
  EXPECT_EQ(t2.last.cache.swa, "restored");
  EXPECT_GE(t2.last.cached_tokens * 10, (280 + 10) * 9);
}

TEST_F(PrefixCacheTest, SnapshotPastItsTtlIsNotUsedReplayOrRecompute) {
  PrefixCacheConfig c = base_config();
  c.swa_ttl_ns = 60 * kvcache::kNsPerSecond;
  make_cache(c);
  auto p = random_prompt(300, 4);
  const Outcome cold = run1(greedy(p, 5), false);
  run1(greedy(p, 5));
  clock_.advance_s(61);  // every snapshot expired; the blocks stay
  const Outcome replayed = run1(greedy(p, 5));
  EXPECT_EQ(replayed.last.cache.swa, "replayed");
  EXPECT_EQ(replayed.last.cached_tokens, 256);
  EXPECT_EQ(counter("ds41_prefix_cache_swa_total", {{"result", "replayed"}}), 1u);
  // --swa-miss recompute: exact, nothing restored (a new cache over the same blocks is not
  // needed: recompute only changes the miss policy).
  c.swa_miss = SwaMiss::kRecompute;
  make_cache(c);
  run1(greedy(p, 5));
  clock_.advance_s(61);
  const Outcome recomputed = run1(greedy(p, 5));
  EXPECT_EQ(recomputed.tokens, cold.tokens);
  EXPECT_EQ(recomputed.last.cache.swa, "recomputed");
  EXPECT_EQ(recomputed.last.cached_tokens, 0);
  // Within the TTL the snapshot is used.
  const Outcome hit = run1(greedy(p, 5));
  EXPECT_EQ(hit.last.cache.swa, "restored");
  EXPECT_EQ(hit.tokens, cold.tokens);
}

TEST_F(PrefixCacheTest, BlocksComeUpFromDramAndDiskTiers) {
  ds41::testing::ScratchDir dir("prefix-tiers");
  PrefixCacheConfig c = base_config();
  c.engine_tier_bytes = 0;  // unpinned blocks leave the engine tier at once
  make_cache(c);
  auto p = random_prompt(300, 5);
  const Outcome cold = run1(greedy(p, 4), false);
  run1(greedy(p, 4));
  EXPECT_EQ(pc_->engine_tier().blocks(), 0u);
  EXPECT_EQ(pc_->dram_tier().blocks(), 2u);
  const Outcome from_dram = run1(greedy(p, 4));
  EXPECT_EQ(from_dram.tokens, cold.tokens);
  EXPECT_EQ(from_dram.last.cache.dram_tokens, 256);
  // No memory tiers: the persistent tier serves.
  c.dram_tier_bytes = 0;
  c.disk.dir = dir.str();
  c.disk.capacity_bytes = 64ull << 20;
  c.disk.sync = false;
  make_cache(c);
  run1(greedy(p, 4));
  ASSERT_TRUE(pc_->drain_writes(10000));
  EXPECT_EQ(pc_->disk()->block_count(), 2u);
  const Outcome from_disk = run1(greedy(p, 4));
  EXPECT_EQ(from_disk.tokens, cold.tokens);
  EXPECT_EQ(from_disk.last.cache.disk_tokens, 256);
  EXPECT_EQ(from_disk.last.cached_tokens, 299);
}

TEST_F(PrefixCacheTest, CorruptDiskBlockIsAMissDeletedAndTheAnswerStaysExact) {
  ds41::testing::ScratchDir dir("prefix-corrupt");
  PrefixCacheConfig c = base_config();
  c.engine_tier_bytes = 0;
  c.dram_tier_bytes = 0;
  c.disk.dir = dir.str();
  c.disk.capacity_bytes = 64ull << 20;
  c.disk.sync = false;
  c.swa_miss = SwaMiss::kRecompute;
  make_cache(c);
  auto p = random_prompt(300, 6);
  const Outcome cold = run1(greedy(p, 4), false);
  run1(greedy(p, 4));
  ASSERT_TRUE(pc_->drain_writes(10000));
  // Flip one payload byte of the second block.
  auto keys = kvcache::BlockChainHasher::create("golden-tiny-test", 128)
                  ->chain_keys(std::span<const int32_t>(p).first(256));
  const std::string path = pc_->disk()->block_path(keys[1]);
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(1000);
    char b = 0;
    f.read(&b, 1);
    b ^= 0x20;
    f.seekp(1000);
    f.write(&b, 1);
  }
  const Outcome after = run1(greedy(p, 4));
  EXPECT_EQ(after.tokens, cold.tokens);
  EXPECT_EQ(metrics_->counter_value("ds41_kv_disk_checksum_failures_total"), 1u);
  EXPECT_EQ(metrics_->counter_value("ds41_kv_disk_evictions_total", {{"reason", "corrupt"}}), 1u);
  // The corrupt file was deleted; the request recomputed the block and wrote a good copy.
  ASSERT_TRUE(pc_->drain_writes(10000));
  EXPECT_EQ(pc_->disk()->verify_block(keys[1], std::nullopt, true).result,
            kvcache::DiskTier::VerifyResult::kOk);
  // The snapshot at 299 needs both blocks: not usable; recompute mode recomputes.
  EXPECT_LT(after.last.cached_tokens, 256);
}

TEST_F(PrefixCacheTest, DiskRetentionNeverEvictsYoungBlocksFakeClock) {
  ds41::testing::ScratchDir dir("prefix-retention");
  PrefixCacheConfig c = base_config();
  c.engine_tier_bytes = 0;
  c.dram_tier_bytes = 0;
  c.disk.dir = dir.str();
  c.disk.capacity_bytes = 2 * (26880 + 64);  // two blocks of the tiny model
  c.disk.sync = false;
  make_cache(c);
  auto a = random_prompt(260, 7), b = random_prompt(260, 8), d = random_prompt(260, 9);
  run1(greedy(a, 2));
  ASSERT_TRUE(pc_->drain_writes(10000));
  EXPECT_EQ(pc_->disk()->block_count(), 2u);
  run1(greedy(b, 2));  // no room: a's blocks are under retention, b's writes are refused
  ASSERT_TRUE(pc_->drain_writes(10000));
  EXPECT_EQ(pc_->disk()->block_count(), 2u);
  EXPECT_GE(metrics_->counter_value("ds41_kv_disk_writes_refused_total"), 1u);
  EXPECT_EQ(run1(greedy(a, 2)).last.cache.disk_tokens, 256);
  clock_.advance_s(73 * 3600.0);  // past the 72 h retention: LRU eviction may take them
  run1(greedy(d, 2));
  ASSERT_TRUE(pc_->drain_writes(10000));
  EXPECT_EQ(pc_->disk()->block_count(), 2u);
  EXPECT_GE(metrics_->counter_value("ds41_kv_disk_evictions_total", {{"reason", "lru"}}), 1u);
  auto dk = kvcache::BlockChainHasher::create("golden-tiny-test", 128)
                ->chain_keys(std::span<const int32_t>(d).first(128));
  EXPECT_TRUE(pc_->disk()->contains(dk[0]));
}

TEST_F(PrefixCacheTest, TwoRequestsSharingAPrefixComputeItOnce) {
  make_cache(base_config());
  auto shared = random_prompt(300, 10);
  auto a = shared, b = shared;
  auto ta = random_prompt(40, 11), tb = random_prompt(50, 12);
  a.insert(a.end(), ta.begin() + 1, ta.end());
  b.insert(b.end(), tb.begin() + 1, tb.end());
  const auto cold = run({greedy(a, 4), greedy(b, 4)}, false);
  const int64_t cold_prefill = stats_.prefill_tokens_computed;
  const auto both = run({greedy(a, 4), greedy(b, 4)});
  EXPECT_EQ(both[0].tokens, cold[0].tokens);
  EXPECT_EQ(both[1].tokens, cold[1].tokens);
  EXPECT_EQ(both[1].last.cached_tokens, 256);  // the shared full blocks
  EXPECT_EQ(both[1].last.cache.swa, "restored");
  EXPECT_EQ(stats_.prefill_tokens_computed, cold_prefill - 256);
  EXPECT_EQ(counter("ds41_prefix_cache_shared_prefix_waits_total"), 1u);
}

TEST_F(PrefixCacheTest, PreemptedSequenceResumesByAnExactRestore) {
  make_cache(base_config());
  auto a = random_prompt(200, 13), b = random_prompt(200, 14);
  const auto cold = run({greedy(a, 40), greedy(b, 40)}, false);
  LoopConfig lc;
  // Room for both prompts but not for both to decode 40 tokens: the newest is preempted.
  lc.kv_memory_bytes = eng_->bytes_for_tokens(200) + eng_->bytes_for_tokens(215);
  lc.max_batch_tokens = 512;
  const auto got = run({greedy(a, 40), greedy(b, 40)}, true, lc);
  ASSERT_GE(stats_.preemptions, 1);
  EXPECT_EQ(got[0].tokens, cold[0].tokens);
  EXPECT_EQ(got[1].tokens, cold[1].tokens);
  // Resuming restored instead of recomputing: besides the prompts only the one token each resume
  // feeds (the last sampled one, a decode step without the preemption) was computed.
  EXPECT_EQ(stats_.prefill_tokens_computed, 400 + stats_.preemptions);
}

TEST_F(PrefixCacheTest, DecoderReplayPrefillPublishesApproximateSnapshotsAndExactBlocks) {
  PrefixCacheConfig c = base_config();
  c.decoder_replay_prefill = true;
  make_cache(c);
  auto p = random_prompt(300, 15);
  LoopConfig lc;
  lc.decoder_replay_prefill = true;
  const Outcome first = run({greedy(p, 4)}, true, lc)[0];
  EXPECT_EQ(first.tokens.size(), 4u);
  EXPECT_EQ(stats_.prefill_tokens_computed, 300);
  const std::span<const int32_t> P(p);
  auto exact = kvcache::BlockChainHasher::create("golden-tiny-test", 128);
  auto approx = kvcache::BlockChainHasher::create("golden-tiny-test+approx", 128);
  // MODEL_SPEC 4.4 changes only the layers after the last KV source: the snapshot is approximate
  // (an exact consumer never sees it), the global-KV blocks are exact.
  EXPECT_FALSE(pc_->swa_pool().contains(exact->prefix_key(P.first(299))));
  EXPECT_TRUE(pc_->swa_pool().contains(approx->prefix_key(P.first(299))));
  EXPECT_TRUE(pc_->engine_tier().contains(exact->chain_keys(P.first(256))[1]));
  // A repeat restores the approximate state exactly: the same tokens as the first run.
  const Outcome again = run({greedy(p, 4)}, true, lc)[0];
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.last.cache.swa, "restored");
  EXPECT_EQ(again.last.cached_tokens, 299);
}

// The served path's replay drift (README "Prefix cache"): greedy continuations after an
// Encoder SWA Bounded Replay vs the exact ones, tiny model (window 8: the replayed window is a
// large share of every query's keys, an upper-range figure). Prints the agreement; asserts only
// that the machinery ran (replayed, a continuation of the right length).
TEST_F(PrefixCacheTest, ReplayDriftOnTheServedPath) {
  PrefixCacheConfig c = base_config();
  c.swa_ttl_ns = kvcache::kNsPerSecond;
  make_cache(c);
  int64_t same = 0, total = 0, prefix_same = 0;
  for (uint32_t k = 0; k < 4; ++k) {
    auto p = random_prompt(300 + 100 * k, 40 + k);
    const Outcome cold = run1(greedy(p, 16), false);
    run1(greedy(p, 16));
    clock_.advance_s(2);
    const Outcome rep = run1(greedy(p, 16));
    ASSERT_EQ(rep.last.cache.swa, "replayed");
    ASSERT_EQ(rep.tokens.size(), cold.tokens.size());
    size_t first_diff = rep.tokens.size();
    for (size_t i = 0; i < rep.tokens.size(); ++i) {
      same += rep.tokens[i] == cold.tokens[i];
      if (rep.tokens[i] != cold.tokens[i] && first_diff == rep.tokens.size()) first_diff = i;
    }
    total += static_cast<int64_t>(rep.tokens.size());
    prefix_same += static_cast<int64_t>(first_diff);
    std::printf("[ replay drift ] prompt %zu tokens, replayed at %lld: %zu of 16 greedy tokens identical before "
                "the first difference\n",
                p.size(), static_cast<long long>(rep.last.cached_tokens), first_diff);
  }
  std::printf("[ replay drift ] position-wise agreement %lld / %lld, identical prefix %lld / %lld\n",
              static_cast<long long>(same), static_cast<long long>(total), static_cast<long long>(prefix_same),
              static_cast<long long>(total));
  RecordProperty("replay_token_agreement", std::to_string(same) + "/" + std::to_string(total));
}

TEST(BlockTier, PinnedBlocksStayLruAmongUnpinnedAndEvictionsDemote) {
  std::vector<BlockKey> demoted;
  BlockTier t(250, [&](const BlockKey& k, BlockBytes) { demoted.push_back(k); });
  auto bytes = [](size_t n) { return std::make_shared<const std::vector<uint8_t>>(n, uint8_t{1}); };
  const BlockKey k1{1, 1}, k2{2, 2}, k3{3, 3};
  t.put(k1, bytes(100));
  t.put(k2, bytes(100));
  ASSERT_TRUE(t.pin(k1));
  ASSERT_NE(t.get(k2), nullptr);  // k2 most recent
  t.put(k3, bytes(100));          // over 250: the LRU unpinned block is k2 (k1 is pinned)
  EXPECT_TRUE(t.contains(k1));
  EXPECT_FALSE(t.contains(k2));
  EXPECT_TRUE(t.contains(k3));
  EXPECT_EQ(demoted, std::vector<BlockKey>{k2});
  t.unpin(k1);
  EXPECT_EQ(t.bytes(), 200u);
  BlockTier none(0);
  none.put(k1, bytes(10));
  EXPECT_FALSE(none.contains(k1));  // capacity 0 keeps pinned blocks only
  EXPECT_FALSE(t.pin(k2));
}

}  // namespace
}  // namespace ds41::engine
