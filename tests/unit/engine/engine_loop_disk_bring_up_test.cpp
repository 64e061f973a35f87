// EngineLoop + PrefixCache with blocks only in the persistent tier (issue 13: "blocks found below
// the top tier are brought up asynchronously; the request waits only for its own blocks"), on the
// public golden tiny model (CpuEngine) with the disk tier's reads going through a GateIo the test
// holds. While request A's block read is held, request B runs to its end (the read is off the
// loop thread, and an idle loop sleeps instead of spinning); released, A's output is
// token-identical to a cold run with its cached tokens reported by tier. A failed or corrupt read
// is a shorter restore (an exact answer); a request aborted while parked, and a loop stopped with
// a read in flight, release everything without waiting for the disk. Two requests that need the
// same disk-only blocks share one read (an abort of one leaves the read to the other; a failed
// shared read is a shorter restore for both); the time parked is a histogram (FakeClock). Named
// EngineLoop* for the CI TSan job (scripts/test.sh).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <functional>
#include <future>
#include <random>
#include <thread>

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

struct BringUpOutcome {
  std::vector<int32_t> tokens;
  TokenEvent last;
  bool done = false;  // the final event arrived
};

// The stream's events until its final one, or until `timeout` passed (0: what is there now).
BringUpOutcome collect_until(RequestStream& s, std::chrono::milliseconds timeout) {
  BringUpOutcome o;
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
  // `clock`: the cache's (and its persistent tier's) clock; null: the system clock.
  void make_cache(const PrefixCacheConfig& c, Clock* clock = nullptr) {
    pc_.reset();
    metrics_ = std::make_unique<kvcache::MetricsRegistry>();
    auto pc = PrefixCache::create(c, clock ? *clock : SystemClock::instance(), *metrics_, &faults_);
    ASSERT_TRUE(pc.ok()) << pc.status().message();
    pc_ = std::move(*pc);
  }
  LoopConfig loop_config() {
    LoopConfig lc;
    lc.prefix_cache = pc_.get();
    return lc;
  }
  // One request through a fresh loop over `eng` with `lc`, collected to its end (60 s at most).
  static BringUpOutcome serve_one(Engine& eng, const LoopConfig& lc, GenerationRequest r) {
    EngineLoop loop(&eng, lc);
    auto s = loop.submit(std::move(r));
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(loop.start().ok());
    BringUpOutcome o = s.ok() ? collect_until(**s, 60s) : BringUpOutcome{};
    loop.stop(1000ms);
    return o;
  }
  // One request through a loop without a cache: the reference output.
  std::vector<int32_t> cold(GenerationRequest r) {
    CpuEngine eng(tm_->model.get(), "tiny");
    const BringUpOutcome o = serve_one(eng, LoopConfig{}, std::move(r));
    EXPECT_TRUE(o.done);
    return o.tokens;
  }
  // Runs `r` once through the cache: its blocks are written to the persistent tier (and its
  // snapshots to the SWA pool).
  void warm(GenerationRequest r, size_t disk_blocks = 2) {
    EngineLoop loop(eng_.get(), loop_config());
    auto s = loop.submit(std::move(r));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(loop.start().ok());
    ASSERT_TRUE(collect_until(**s, 60s).done);
    loop.stop(1000ms);
    ASSERT_TRUE(pc_->drain_writes(10000));
    ASSERT_EQ(pc_->disk()->block_count(), disk_blocks);
    ASSERT_EQ(pc_->dram_tier().blocks() + pc_->engine_tier().blocks(), 0u);
  }
  uint64_t counter(const std::string& name, const kvcache::MetricLabels& l = {}) {
    return metrics_->counter_value(name, l);
  }
  // The value of the exposition line that starts with `series` ("name{labels}" as rendered), or -1
  // when there is none.
  double exposed(const std::string& series) {
    const std::string text = metrics_->prometheus_text();
    for (size_t at = 0; (at = text.find(series + " ", at)) != std::string::npos; ++at)
      if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    return -1;
  }
  // Submits `reqs` before the loop starts (they are admitted in its first step) and holds the
  // persistent tier's reads until release_after() returned; the outcomes in submission order.
  std::vector<BringUpOutcome> together(std::vector<GenerationRequest> reqs, const std::function<void(
                                                                         std::vector<RequestStream*>&)>& held) {
    gate_.hold();
    EngineLoop loop(eng_.get(), loop_config());
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<RequestStream*> raw;
    for (auto& r : reqs) {
      auto s = loop.submit(std::move(r));
      EXPECT_TRUE(s.ok());
      if (!s.ok()) return {};
      raw.push_back(s->get());
      streams.push_back(std::move(*s));
    }
    EXPECT_TRUE(loop.start().ok());
    EXPECT_TRUE(gate_.wait_held(1, 10s)) << "no block read started";
    held(raw);
    gate_.release();
    std::vector<BringUpOutcome> out;
    for (auto& s : streams) out.push_back(collect_until(*s, 60s));
    loop.stop(1000ms);
    return out;
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
  const BringUpOutcome ob = collect_until(**b, 30s);
  const bool a_still_held = gate_.waiting() >= 1;
  const BringUpOutcome a_early = collect_until(**a, 0ms);
  const int64_t steps_during_hold = loop.stats().steps - steps_before_b;
  gate_.release();
  const BringUpOutcome oa = collect_until(**a, 60s);
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
    const BringUpOutcome o = serve_one(*eng_, loop_config(), greedy(p, 5));
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
    const BringUpOutcome o = serve_one(*eng_, loop_config(), greedy(p, 5));
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
  const BringUpOutcome oa = collect_until(**a, 10s);  // while the read is still held
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
  const BringUpOutcome oc = collect_until(**c, 60s);
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
    const BringUpOutcome oa = collect_until(**a, 1000ms);
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

TEST_F(EngineLoopDiskBringUp, SameDiskOnlyPrefixAdmittedTogetherIsReadOnce) {
  make_cache(config());
  const auto p = random_prompt(300, 26);
  const auto cold_p = cold(greedy(p, 5));
  warm(greedy(p, 5));
  const uint64_t hits0 = counter("ds41_kv_disk_hits_total");
  bool second_reader = true;
  const auto out = together({greedy(p, 5), greedy(p, 5)}, [&](std::vector<RequestStream*>&) {
    // Two reader threads: a duplicate read of the same blocks would wait at the gate too.
    second_reader = gate_.wait_held(2, 500ms);
  });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_FALSE(second_reader) << "the second request started its own read of the same blocks";
  for (const BringUpOutcome& o : out) {
    ASSERT_TRUE(o.done);
    EXPECT_EQ(o.tokens, cold_p);
    EXPECT_EQ(o.last.cached_tokens, 299);
    EXPECT_EQ(o.last.cache.disk_tokens, 256);  // both waited for the persistent tier's read
    EXPECT_EQ(o.last.cache.snapshot_tokens, 43);
  }
  EXPECT_EQ(counter("ds41_kv_disk_hits_total") - hits0, 2u) << "the two blocks were read more than once";
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_total"), 2u);  // both parked
  EXPECT_EQ(counter("ds41_prefix_cache_async_reads_joined_total"), 1u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_read_blocks_total"), 2u);
  EXPECT_EQ(counter("ds41_prefix_cache_cached_tokens_total", {{"tier", "disk"}}), 512u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, LongerPromptWaitsForTheSharedBlocksAndReadsOnlyTheRest) {
  make_cache(config());
  const auto pa = random_prompt(300, 27);
  auto pb = pa;
  const auto tail = random_prompt(300, 28);
  pb.insert(pb.end(), tail.begin(), tail.end());  // 600 tokens: blocks 0-1 shared, 2-3 its own
  const auto cold_a = cold(greedy(pa, 4));
  const auto cold_b = cold(greedy(pb, 4));
  warm(greedy(pa, 4), 2);
  warm(greedy(pb, 4), 4);
  const uint64_t hits0 = counter("ds41_kv_disk_hits_total");
  const auto out = together({greedy(pa, 4), greedy(pb, 4)}, [](std::vector<RequestStream*>&) {});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].done);
  ASSERT_TRUE(out[1].done);
  EXPECT_EQ(out[0].tokens, cold_a);
  EXPECT_EQ(out[1].tokens, cold_b);
  EXPECT_EQ(out[0].last.cache.disk_tokens, 256);
  EXPECT_EQ(out[0].last.cached_tokens, 299);
  EXPECT_EQ(out[1].last.cache.disk_tokens, 512);
  EXPECT_EQ(out[1].last.cached_tokens, 599);
  EXPECT_EQ(counter("ds41_kv_disk_hits_total") - hits0, 4u) << "a shared block was read twice";
  EXPECT_EQ(counter("ds41_prefix_cache_async_reads_joined_total"), 1u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, AbortOfTheFirstLeavesTheSharedReadToTheSecond) {
  make_cache(config());
  const auto p = random_prompt(300, 29);
  const auto cold_p = cold(greedy(p, 4));
  warm(greedy(p, 4));
  const uint64_t hits0 = counter("ds41_kv_disk_hits_total");
  BringUpOutcome aborted;
  bool reread = true;
  const auto out = together({greedy(p, 4), greedy(p, 4)}, [&](std::vector<RequestStream*>& s) {
    s[0]->cancel();
    aborted = collect_until(*s[0], 10s);  // while the read is still held
    reread = gate_.wait_held(2, 500ms);
  });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(aborted.done);
  EXPECT_EQ(aborted.last.finish, FinishReason::kAbort);
  EXPECT_TRUE(aborted.tokens.empty());
  EXPECT_FALSE(reread) << "the waiter read the blocks again";
  ASSERT_TRUE(out[1].done);
  EXPECT_EQ(out[1].tokens, cold_p);
  EXPECT_EQ(out[1].last.cached_tokens, 299);
  EXPECT_EQ(out[1].last.cache.disk_tokens, 256);
  EXPECT_EQ(counter("ds41_kv_disk_hits_total") - hits0, 2u);
  EXPECT_EQ(counter("ds41_prefix_cache_async_bring_ups_cancelled_total"), 1u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(eng_->live_sequences(), 0);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, AFailedSharedReadIsAShorterRestoreForBoth) {
  make_cache(config());
  const auto p = random_prompt(300, 30);
  const auto cold_p = cold(greedy(p, 4));
  warm(greedy(p, 4));
  faults_.inject(kvcache::FaultKind::kCorruptRead, 0, -1);  // through the gate, then corrupt
  const auto out = together({greedy(p, 4), greedy(p, 4)}, [](std::vector<RequestStream*>&) {});
  faults_.clear();
  ASSERT_EQ(out.size(), 2u);
  for (const BringUpOutcome& o : out) {
    ASSERT_TRUE(o.done);
    EXPECT_EQ(o.tokens, cold_p);
    EXPECT_EQ(o.last.cached_tokens, 0);
    EXPECT_EQ(o.last.cache.disk_tokens, 0);
  }
  EXPECT_EQ(counter("ds41_prefix_cache_async_read_failures_total"), 1u) << "the blocks were read twice";
  EXPECT_EQ(counter("ds41_kv_disk_checksum_failures_total"), 1u);
  EXPECT_EQ(pc_->engine_tier().pinned_blocks(), 0u);
  EXPECT_EQ(pc_->bring_ups_outstanding(), 0u);
}

TEST_F(EngineLoopDiskBringUp, TimeParkedIsAHistogramOnTheInjectedClock) {
  FakeClock clock;
  make_cache(config(), &clock);
  const auto p = random_prompt(300, 31);
  warm(greedy(p, 3));
  // Two requests parked 0.3 s on one read, then one parked 3 s (time moves only while held, and
  // once every request parked: it counts as parked after its start time was taken).
  auto parked_then = [&](uint64_t parked, double seconds) {
    return [&, parked, seconds](std::vector<RequestStream*>&) {
      for (int i = 0; i < 10000 && counter("ds41_prefix_cache_async_bring_ups_total") < parked; ++i)
        std::this_thread::sleep_for(1ms);
      ASSERT_EQ(counter("ds41_prefix_cache_async_bring_ups_total"), parked);
      clock.advance_s(seconds);
    };
  };
  auto out = together({greedy(p, 3), greedy(p, 3)}, parked_then(2, 0.3));
  ASSERT_EQ(out.size(), 2u);
  out = together({greedy(p, 3)}, parked_then(3, 3));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].done);
  const std::string h = "ds41_prefix_cache_async_wait_seconds";
  EXPECT_EQ(exposed(h + "_bucket{le=\"0.25\"}"), 0);
  EXPECT_EQ(exposed(h + "_bucket{le=\"0.5\"}"), 2);
  EXPECT_EQ(exposed(h + "_bucket{le=\"2.5\"}"), 2);
  EXPECT_EQ(exposed(h + "_bucket{le=\"5\"}"), 3);
  EXPECT_EQ(exposed(h + "_bucket{le=\"+Inf\"}"), 3);
  EXPECT_EQ(exposed(h + "_count"), 3);
  EXPECT_NEAR(exposed(h + "_sum"), 3.6, 1e-9);
  EXPECT_NE(metrics_->prometheus_text().find("# TYPE " + h + " histogram\n"), std::string::npos);
}

}  // namespace
}  // namespace ds41::engine
