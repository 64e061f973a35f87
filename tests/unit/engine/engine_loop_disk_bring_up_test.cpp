// EngineLoop + PrefixCache with blocks only in the persistent tier (issue 13: "blocks found below
// the top tier are brought up asynchronously; the request waits only for its own blocks"), on the
// public golden tiny model (CpuEngine) with the disk tier's reads going through a GateIo the test
// holds. While request A's block read is held, request B runs to its end (the read is off the
// loop thread, and an idle loop sleeps instead of spinning); released, A's output is
// token-identical to a cold run with its cached tokens reported by tier. A failed or corrupt read
// is a shorter restore (an exact answer); a request aborted while parked, and a loop stopped with
// a read in flight, release everything without waiting for the disk. Named EngineLoop* for the CI
// TSan job (scripts/test.sh).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <future>
#include <random>

#include "engine/cpu_engine.h"
#include "engine/engine_loop.h"
#include "engine/prefix_cache.h"
#include "golden/golden_arrays.h"
#include "unit/engine/loop_test_util.h"
#include "support/kvcache/fault_injecting_io.h"
#include "unit/engine/gate_io.h"
#include "unit/kvcache/test_util.h"

namespace ds41::engine {
namespace {

using namespace std::chrono_literals;
using looptest::greedy;
using looptest::random_prompt;

struct Outcome {
  std::vector<int32_t> tokens;
  TokenEvent last;
  bool done = false;  // the final event arrived
};

// The stream's events until its final one, or until `timeout` passed (0: what is there now).
Outcome collect(RequestStream& s, std::chrono::milliseconds timeout) {
  Outcome o;
  const auto end = std::chrono::steady_clock::now() + timeout;
  std::vector<TokenEvent> evs;
  for (bool first = true; !o.done; first = false) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (!first && left.count() <= 0) break;
    if (!s.next(&evs, std::clamp<std::chrono::milliseconds>(left, 0ms, 100ms))) break;
    for (auto& e : evs) {
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) {
        o.last = e;
        o.done = true;
      }
    }
    evs.clear();
  }
  return o;
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

class EngineLoopDiskBringUp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new ds41::testing::TestModel(ds41::testing::load_golden_model(2)); }
  static void TearDownTestSuite() {
    delete tm_;
    tm_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(tm_->model);
    eng_ = std::make_unique<CpuEngine>(tm_->model.get(), "tiny");
  }
  void TearDown() override {
    gate_.release();  // a failed assertion must not leave a reader thread held
    pc_.reset();
  }
  // Blocks live only in the persistent tier: the memory tiers keep nothing unpinned.
  PrefixCacheConfig config() {
    PrefixCacheConfig c;
    c.model_identity = "golden-tiny-bring-up";
    c.engine_tier_bytes = 0;
    c.dram_tier_bytes = 0;
    c.dram_swa.capacity_bytes = 256ull << 20;
    c.disk.dir = dir_.str();
    c.disk.capacity_bytes = 64ull << 20;
    c.disk.sync = false;
    return c;
  }
  void make_cache(const PrefixCacheConfig& c) {
    pc_.reset();
    metrics_ = std::make_unique<kvcache::MetricsRegistry>();
    auto pc = PrefixCache::create(c, SystemClock::instance(), *metrics_, &faults_);
    ASSERT_TRUE(pc.ok()) << pc.status().message();
    pc_ = std::move(*pc);
  }
  LoopConfig loop_config() {
    LoopConfig lc;
    lc.prefix_cache = pc_.get();
    return lc;
  }
  // One request through a fresh loop over `eng` with `lc`, collected to its end (60 s at most).
  static Outcome serve_one(Engine& eng, const LoopConfig& lc, GenerationRequest r) {
    EngineLoop loop(&eng, lc);
    auto s = loop.submit(std::move(r));
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(loop.start().ok());
    Outcome o = s.ok() ? collect(**s, 60s) : Outcome{};
    loop.stop(1000ms);
    return o;
  }
  // One request through a loop without a cache: the reference output.
  std::vector<int32_t> cold(GenerationRequest r) {
    CpuEngine eng(tm_->model.get(), "tiny");
    const Outcome o = serve_one(eng, LoopConfig{}, std::move(r));
    EXPECT_TRUE(o.done);
    return o.tokens;
  }
  // Runs `r` once through the cache: its blocks are written to the persistent tier (and its
  // snapshots to the SWA pool).
  void warm(GenerationRequest r) {
    EngineLoop loop(eng_.get(), loop_config());
    auto s = loop.submit(std::move(r));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(loop.start().ok());
    ASSERT_TRUE(collect(**s, 60s).done);
    loop.stop(1000ms);
    ASSERT_TRUE(pc_->drain_writes(10000));
    ASSERT_EQ(pc_->disk()->block_count(), 2u);
    ASSERT_EQ(pc_->dram_tier().blocks() + pc_->engine_tier().blocks(), 0u);
  }
  uint64_t counter(const std::string& name, const kvcache::MetricLabels& l = {}) {
    return metrics_->counter_value(name, l);
  }

  static ds41::testing::TestModel* tm_;
  std::unique_ptr<CpuEngine> eng_;
  ds41::testing::ScratchDir dir_{"loop-bring-up"};
  ds41::testing::GateIo gate_;
  kvcache::FaultInjectingIo faults_{gate_};
  std::unique_ptr<kvcache::MetricsRegistry> metrics_;
  std::unique_ptr<PrefixCache> pc_;  // after what it uses: destroyed first
};
ds41::testing::TestModel* EngineLoopDiskBringUp::tm_ = nullptr;

TEST_F(EngineLoopDiskBringUp, OtherRequestsRunWhileABlockReadIsHeld) {
  make_cache(config());
  const auto pa = random_prompt(300, 21), pb = random_prompt(40, 22);
  const auto cold_a = cold(greedy(pa, 6));
  const auto cold_b = cold(greedy(pb, 8));
  warm(greedy(pa, 6));

  gate_.hold();
  EngineLoop loop(eng_.get(), loop_config());
  ASSERT_TRUE(loop.start().ok());
  auto a = loop.submit(greedy(pa, 6));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(gate_.wait_held(1, 10s)) << "A's block read never started";
  // Only A, parked on its read: the loop sleeps (no spinning while it waits).
  const double cpu0 = process_cpu_seconds();
  std::this_thread::sleep_for(400ms);
  const double idle_cpu = process_cpu_seconds() - cpu0;
  const int64_t steps_before_b = loop.stats().steps;
  auto b = loop.submit(greedy(pb, 8));
  ASSERT_TRUE(b.ok());
  // B (no cache hit) prefills and decodes to its end while A's read is still held. On a loop
  // that reads the disk on its own thread, B never gets a step here.
  const Outcome ob = collect(**b, 30s);
  const bool a_still_held = gate_.waiting() >= 1;
  const Outcome a_early = collect(**a, 0ms);
  const int64_t steps_during_hold = loop.stats().steps - steps_before_b;
  gate_.release();
  const Outcome oa = collect(**a, 60s);
  loop.stop(1000ms);

  EXPECT_TRUE(ob.done) << "B made no progress while A's block read was held";
  EXPECT_EQ(ob.tokens, cold_b);
  EXPECT_GE(steps_during_hold, 8);  // B's prefill and its decode steps
  EXPECT_TRUE(a_still_held);
  EXPECT_TRUE(a_early.tokens.empty()) << "A produced tokens before its blocks were read";
  EXPECT_LT(idle_cpu, 0.2) << "the loop spun while A waited for its read";
  ASSERT_TRUE(oa.done);
  EXPECT_EQ(oa.tokens, cold_a);
  EXPECT_EQ(oa.last.finish, FinishReason::kLength);
  EXPECT_EQ(oa.last.cached_tokens, 299);
  EXPECT_EQ(oa.last.cache.disk_tokens, 256);
  EXPECT_EQ(oa.last.cache.snapshot_tokens, 43);
  EXPECT_EQ(oa.last.cache.swa, "restored");
  EXPECT_EQ(ob.last.cached_tokens, 0);
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_total"), 1u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_read_blocks_total"), 2u);
  EXPECT_GT(counter("ds41_prefix_cache_async_read_bytes_total"), 2u * 20000u);
  EXPECT_GE(counter("ds41_prefix_cache_async_wait_microseconds_total"), 400000u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_read_failures_total"), 0u);
  EXPECT_EQ(counter("ds41_prefix_cache_cached_tokens_total", {{"tier", "disk"}}), 256u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, FailedOrCorruptReadsAreAShorterRestoreWithAnExactAnswer) {
  const auto p = random_prompt(300, 23);
  const auto cold_p = cold(greedy(p, 5));
  {  // Every read fails (EIO): nothing is staged, the request recomputes its prompt.
    make_cache(config());
    warm(greedy(p, 5));
    faults_.inject(kvcache::FaultKind::kFailRead, 0, -1);
    const Outcome o = serve_one(*eng_, loop_config(), greedy(p, 5));
    faults_.clear();
    ASSERT_TRUE(o.done);
    EXPECT_EQ(o.tokens, cold_p);
    EXPECT_EQ(o.last.cached_tokens, 0);
    EXPECT_EQ(o.last.cache.disk_tokens, 0);
    EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_total"), 1u);
    EXPECT_EQ(counter("ds41_prefix_cache_async_read_failures_total"), 1u);
    EXPECT_GE(counter("ds41_kv_disk_read_errors_total"), 1u);
    EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  }
  {  // The second block reads corrupt (and is deleted); --swa-miss recompute: exact, nothing
     // restored (the only snapshot needs both blocks).
    ds41::testing::ScratchDir other("loop-bring-up-corrupt");
    PrefixCacheConfig c = config();
    c.disk.dir = other.str();
    c.swa_miss = SwaMiss::kRecompute;
    make_cache(c);
    warm(greedy(p, 5));
    faults_.inject(kvcache::FaultKind::kCorruptRead, 1, 1);  // block 0 reads fine, block 1 corrupt
    const Outcome o = serve_one(*eng_, loop_config(), greedy(p, 5));
    faults_.clear();
    ASSERT_TRUE(o.done);
    EXPECT_EQ(o.tokens, cold_p);
    EXPECT_EQ(o.last.cached_tokens, 0);
    EXPECT_EQ(o.last.cache.swa, "recomputed");
    EXPECT_EQ(counter("ds41_prefix_cache_async_read_failures_total"), 1u);
    EXPECT_EQ(counter("ds41_prefix_cache_async_read_blocks_total"), 1u);
    EXPECT_EQ(counter("ds41_kv_disk_checksum_failures_total"), 1u);
    EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
    pc_.reset();  // before `other` is removed
  }
}

TEST_F(EngineLoopDiskBringUp, AbortWhileParkedOnAReadReleasesCleanly) {
  make_cache(config());
  const auto p = random_prompt(300, 24);
  const auto cold_p = cold(greedy(p, 4));
  warm(greedy(p, 4));
  gate_.hold();
  EngineLoop loop(eng_.get(), loop_config());
  ASSERT_TRUE(loop.start().ok());
  auto a = loop.submit(greedy(p, 4));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(gate_.wait_held(1, 10s));
  (*a)->cancel();
  const Outcome oa = collect(**a, 10s);  // while the read is still held
  EXPECT_TRUE(oa.done);
  EXPECT_EQ(oa.last.finish, FinishReason::kAbort);
  EXPECT_TRUE(oa.tokens.empty());
  EXPECT_EQ(gate_.waiting(), 1);
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_cancelled_total"), 1u);
  // The same prompt again: its own read (the aborted one's result is dropped, never delivered).
  auto c = loop.submit(greedy(p, 4));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(gate_.wait_held(2, 10s));
  gate_.release();
  const Outcome oc = collect(**c, 60s);
  loop.stop(1000ms);
  ASSERT_TRUE(oc.done);
  EXPECT_EQ(oc.tokens, cold_p);
  EXPECT_EQ(oc.last.cache.disk_tokens, 256);
  EXPECT_EQ(oc.last.cached_tokens, 299);
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_total"), 2u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_wait_microseconds_total") > 0, true);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(eng_->live_sequences(), 0);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, StopWithAReadInFlightDoesNotWaitForTheDisk) {
  make_cache(config());
  const auto p = random_prompt(300, 25);
  warm(greedy(p, 4));
  for (auto drain : {0ms, 200ms}) {  // abort at once; and after a drain timeout spent parked
    gate_.hold();
    auto loop = std::make_unique<EngineLoop>(eng_.get(), loop_config());
    ASSERT_TRUE(loop->start().ok());
    auto a = loop->submit(greedy(p, 4));
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(gate_.wait_held(1, 10s));
    auto stopped = std::async(std::launch::async, [&] { loop->stop(drain); });
    const bool returned = stopped.wait_for(10s) == std::future_status::ready;
    const Outcome oa = collect(**a, 1000ms);
    gate_.release();  // lets a loop stuck in the read (the synchronous design) finish
    stopped.wait();
    loop.reset();
    EXPECT_TRUE(returned) << "stop(" << drain.count() << " ms) waited for a held disk read";
    EXPECT_TRUE(oa.done);
    EXPECT_EQ(oa.last.finish, FinishReason::kAbort);
    EXPECT_EQ(eng_->live_sequences(), 0);
  }
  // The reads' results went nowhere; the cache (its reader threads) shuts down cleanly.
  for (int i = 0; i < 1000 && pc_->bring_ups_outstanding() > 0; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_cancelled_total"), 2u);
  pc_.reset();
}

}  // namespace
}  // namespace ds41::engine
