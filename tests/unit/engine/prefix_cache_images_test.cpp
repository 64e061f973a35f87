// PrefixCache with image prompts (issues 13 + 16): EngineLoop + CpuEngine on the public golden
// tiny model (block 128, window 8, Engram look-back 3; prompts of 280-330 tokens with image spans
// crossing block boundaries exceed every limit). The tiny model has no vision tower: a test
// engine wraps CpuEngine and gives each image span rows drawn from its tag (the forward pass
// takes span rows from any source). Checks: a repeated image prompt restores exactly; the same
// ids with a different image share nothing past the image's start; a multi-turn conversation
// restores turn 1's end; a restore ending inside an image span feeds the rest of its rows; a
// replay that would read image positions recomputes instead; a preempted image request resumes
// exactly. Outputs are compared token for token with a loop without a cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/cpu_engine.h"
#include "engine/engine_loop.h"
#include "engine/prefix_cache.h"
#include "golden/golden_arrays.h"
#include "unit/engine/loop_test_util.h"

namespace ds41::engine {
namespace {

using namespace std::chrono_literals;
using looptest::collect;
using looptest::Outcome;

constexpr int32_t kImageId = 2047;  // the span positions' id (any id: the rows replace it)

// CpuEngine with a stand-in tower: image `tag` (PreparedImage::plan.orig_w) has plan.n_tokens span
// rows of N(0, 1) values drawn from the tag. Everything else is forwarded.
class StubTowerEngine final : public Engine {
 public:
  explicit StubTowerEngine(Engine& inner, int64_t hidden) : in_(inner), hidden_(hidden) {}
  const EngineInfo& info() const override { return in_.info(); }
  Result<SeqId> create_sequence() override { return in_.create_sequence(); }
  Result<SeqId> fork_sequence(SeqId s) override { return in_.fork_sequence(s); }
  Status free_sequence(SeqId s) override { return in_.free_sequence(s); }
  Result<int64_t> sequence_position(SeqId s) const override { return in_.sequence_position(s); }
  Result<int64_t> sequence_bytes(SeqId s) const override { return in_.sequence_bytes(s); }
  int64_t bytes_for_tokens(int64_t t) const override { return in_.bytes_for_tokens(t); }
  int64_t live_sequences() const override { return in_.live_sequences(); }
  Status step(std::span<const StepItem> items, StepOutput* out) override { return in_.step(items, out); }
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override {
    std::vector<std::vector<float>> out;
    for (const image::PreparedImage* p : images) {
      ++encoded;
      std::mt19937 rng(static_cast<uint32_t>(p->plan.orig_w));
      std::normal_distribution<float> d(0.0f, 1.0f);
      std::vector<float> rows(static_cast<size_t>(p->plan.n_tokens * hidden_));
      for (float& v : rows) v = d(rng);
      out.push_back(std::move(rows));
    }
    return out;
  }
  Result<std::vector<uint8_t>> export_kv_block(SeqId s, int64_t i, int64_t b) const override {
    return in_.export_kv_block(s, i, b);
  }
  Result<std::vector<uint8_t>> export_swa_snapshot(SeqId s, int64_t b, bool approx) const override {
    return in_.export_swa_snapshot(s, b, approx);
  }
  Status import_state(SeqId s, std::span<const std::span<const uint8_t>> blocks,
                      std::span<const uint8_t> snap, int64_t b) override {
    return in_.import_state(s, blocks, snap, b);
  }
  Status replay_window(SeqId s, std::span<const int32_t> prefix) override {
    ++replays;
    return in_.replay_window(s, prefix);
  }
  Status prefill_decoder_replay(SeqId s, std::span<const int32_t> t) override {
    return in_.prefill_decoder_replay(s, t);
  }
  int encoded = 0, replays = 0;

 private:
  Engine& in_;
  int64_t hidden_;
};

std::vector<int32_t> random_ids(int64_t n, uint32_t seed) { return looptest::random_prompt(n, seed, 2000); }

struct Img {
  int tag;  // names the image: its span rows and its content hash
  int64_t start, length;
};

// A greedy request over `ids` with the spans of `imgs` set to the image id.
GenerationRequest image_request(std::vector<int32_t> ids, const std::vector<Img>& imgs, int64_t max_tokens) {
  GenerationRequest g;
  for (const Img& m : imgs) {
    for (int64_t t = m.start; t < m.start + m.length; ++t) ids[t] = kImageId;
    auto p = std::make_shared<image::PreparedImage>();
    p->plan.orig_w = m.tag;
    p->plan.n_tokens = m.length;
    RequestImage im;
    im.prepared = p;
    im.cache_key = "img" + std::to_string(m.tag);
    im.content_hash = ImageContentHash{0x1234000000000000ULL + static_cast<uint64_t>(m.tag), 0x5678};
    im.span_start = m.start;
    im.span_length = m.length;
    g.images.push_back(std::move(im));
  }
  g.prompt = std::move(ids);
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  return g;
}

class PrefixCacheImagesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new ds41::testing::TestModel(ds41::testing::load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  void SetUp() override {
    ASSERT_TRUE(tm_->model);
    cpu_ = std::make_unique<CpuEngine>(tm_->model.get(), "tiny");
    eng_ = std::make_unique<StubTowerEngine>(*cpu_, tm_->model->config().hidden_size);
  }
  void make_cache(SwaMiss miss = SwaMiss::kReplay, int64_t ttl_s = 300) {
    PrefixCacheConfig c;
    c.model_identity = "golden-tiny-images-test";
    c.dram_swa.capacity_bytes = 256ull << 20;
    c.swa_ttl_ns = ttl_s * kvcache::kNsPerSecond;
    c.swa_miss = miss;
    metrics_ = std::make_unique<kvcache::MetricsRegistry>();
    auto pc = PrefixCache::create(c, clock_, *metrics_);
    ASSERT_TRUE(pc.ok()) << pc.status().message();
    pc_ = std::move(*pc);
  }
  // The requests (submitted together) through a loop with the cache, or without one (cold).
  std::vector<Outcome> run(std::vector<GenerationRequest> reqs, bool cached = true, LoopConfig lc = {}) {
    lc.prefix_cache = cached ? pc_.get() : nullptr;
    CpuEngine cold_cpu(tm_->model.get(), "tiny");
    StubTowerEngine cold(cold_cpu, tm_->model->config().hidden_size);
    std::vector<Outcome> out =
        looptest::run_requests(cached ? static_cast<Engine&>(*eng_) : cold, lc, std::move(reqs), &stats_);
    for (const Outcome& o : out) EXPECT_NE(o.last.finish, FinishReason::kError) << o.last.error;
    return out;
  }
  Outcome run1(GenerationRequest r, bool cached = true) { return run({std::move(r)}, cached)[0]; }
  uint64_t swa(const std::string& result) {
    return metrics_->counter_value("ds41_prefix_cache_swa_total", {{"result", result}});
  }

  static ds41::testing::TestModel* tm_;
  std::unique_ptr<CpuEngine> cpu_;
  std::unique_ptr<StubTowerEngine> eng_;
  FakeClock clock_;
  std::unique_ptr<kvcache::MetricsRegistry> metrics_;
  std::unique_ptr<PrefixCache> pc_;
  LoopStats stats_;
};
ds41::testing::TestModel* PrefixCacheImagesTest::tm_ = nullptr;

TEST_F(PrefixCacheImagesTest, SameImageTwiceIsRestoredExactly) {
  make_cache();
  // The image [100, 230) crosses the block boundary at 128.
  const auto ids = random_ids(300, 1);
  const std::vector<Img> img{{7, 100, 130}};
  const Outcome cold = run1(image_request(ids, img, 6), false);
  const Outcome first = run1(image_request(ids, img, 6));
  EXPECT_EQ(first.tokens, cold.tokens);
  EXPECT_EQ(first.last.cached_tokens, 0);
  EXPECT_TRUE(first.last.cache.enabled);
  const int encoded = eng_->encoded;
  const Outcome again = run1(image_request(ids, img, 6));
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(again.last.cached_tokens, 299);
  EXPECT_EQ(again.last.cache.swa, "restored");
  EXPECT_EQ(again.last.cache.engine_tokens, 256);
  EXPECT_EQ(stats_.prefill_tokens_computed, 1);
  EXPECT_EQ(eng_->encoded, encoded);  // every image position was restored: the tower did not run
  EXPECT_EQ(swa("restored"), 1u);
}

// Same token ids (every span position has the image id), a different image at the same place:
// nothing cached under the first image may be used from its start on. Without the image in the
// keys the second request would restore 299 positions of the first image's state.
TEST_F(PrefixCacheImagesTest, DifferentImageAtTheSamePositionsSharesNothingPastItsStart) {
  make_cache(SwaMiss::kRecompute);
  const auto ids = random_ids(300, 2);
  const std::vector<Img> a{{11, 150, 100}}, b{{12, 150, 100}};
  const Outcome cold_a = run1(image_request(ids, a, 8), false);
  const Outcome cold_b = run1(image_request(ids, b, 8), false);
  ASSERT_NE(cold_a.tokens, cold_b.tokens)
      << "the two images must change the output for this test to mean anything";
  EXPECT_EQ(run1(image_request(ids, a, 8)).tokens, cold_a.tokens);
  const Outcome got_b = run1(image_request(ids, b, 8));
  EXPECT_EQ(got_b.tokens, cold_b.tokens);
  EXPECT_LE(got_b.last.cached_tokens, 128);  // the block-aligned start of the span at most
  EXPECT_EQ(got_b.last.cached_tokens, 0);    // block 0 alone has no snapshot: recomputed
  EXPECT_EQ(got_b.last.cache.swa, "recomputed");
  // The text before the image is shared: a text-only prompt of the first 150 ids leaves a
  // snapshot at the end of its output (150 positions) that any image's prompt may restore (the
  // span starts at 150: not part of that prefix).
  run1(image_request(std::vector<int32_t>(ids.begin(), ids.begin() + 150), {}, 1));
  const Outcome c = run1(image_request(ids, {{13, 150, 100}}, 8));
  EXPECT_EQ(c.last.cached_tokens, 150);
  EXPECT_EQ(c.last.cache.swa, "restored");
  EXPECT_EQ(c.tokens, run1(image_request(ids, {{13, 150, 100}}, 8), false).tokens);
  // And image a's own prompt still finds all of its state.
  const Outcome again_a = run1(image_request(ids, a, 8));
  EXPECT_EQ(again_a.last.cached_tokens, 299);
  EXPECT_EQ(again_a.tokens, cold_a.tokens);
}

// The same with the image inside the partial last block (after the last full block): the full
// blocks are shared, the SWA snapshots (unaligned lengths) must not be.
TEST_F(PrefixCacheImagesTest, DifferentImageInThePartialLastBlockDoesNotShareSnapshots) {
  make_cache(SwaMiss::kRecompute);
  const auto ids = random_ids(300, 10);
  const std::vector<Img> a{{14, 262, 30}}, b{{15, 262, 30}};
  const Outcome cold_a = run1(image_request(ids, a, 6), false);
  const Outcome cold_b = run1(image_request(ids, b, 6), false);
  ASSERT_NE(cold_a.tokens, cold_b.tokens)
      << "the two images must change the output for this test to mean anything";
  run1(image_request(ids, a, 6));
  const Outcome got_b = run1(image_request(ids, b, 6));
  EXPECT_LE(got_b.last.cached_tokens, 256);
  EXPECT_EQ(got_b.tokens, cold_b.tokens);
  const Outcome got_a = run1(image_request(ids, a, 6));
  EXPECT_EQ(got_a.last.cached_tokens, 299);
  EXPECT_EQ(got_a.tokens, cold_a.tokens);
}

// Two requests with the same ids and different images at once: the second waits only for the
// blocks before the image (the in-flight keys hold the image), restores them, computes its own.
TEST_F(PrefixCacheImagesTest, ConcurrentRequestsWithDifferentImagesShareOnlyTheTextBlocks) {
  make_cache();
  const auto ids = random_ids(300, 3);
  const std::vector<Img> a{{21, 170, 90}}, b{{22, 170, 90}};
  const auto cold = run({image_request(ids, a, 4), image_request(ids, b, 4)}, false);
  const auto got = run({image_request(ids, a, 4), image_request(ids, b, 4)});
  EXPECT_EQ(got[0].tokens, cold[0].tokens);
  EXPECT_EQ(got[1].tokens, cold[1].tokens);
  EXPECT_EQ(got[1].last.cached_tokens, 128);
  EXPECT_EQ(got[1].last.cache.swa, "restored");
  EXPECT_EQ(metrics_->counter_value("ds41_prefix_cache_shared_prefix_waits_total"), 1u);
}

TEST_F(PrefixCacheImagesTest, MultiTurnWithAnImageRestoresTheEndOfTurnOne) {
  make_cache();
  const auto ids1 = random_ids(280, 4);
  const std::vector<Img> img{{31, 60, 120}};
  const Outcome t1 = run1(image_request(ids1, img, 10));
  // Turn 2 = turn 1's prompt (with the image) + its answer + a new message.
  std::vector<int32_t> ids2 = image_request(ids1, img, 10).prompt;
  ids2.insert(ids2.end(), t1.tokens.begin(), t1.tokens.end());
  const auto extra = random_ids(60, 5);
  ids2.insert(ids2.end(), extra.begin() + 1, extra.end());
  const Outcome t2 = run1(image_request(ids2, img, 10));
  const Outcome cold = run1(image_request(ids2, img, 10), false);
  EXPECT_EQ(t2.tokens, cold.tokens);
  EXPECT_EQ(t2.last.cached_tokens, 280 + 10 - 1);  // everything turn 1 consumed
  EXPECT_EQ(t2.last.cache.swa, "restored");
}

// Restores that end inside an image span must feed the span's remaining rows: (1) a prompt that
// ends with its image, repeated (the snapshot at its last-but-one position is inside the span);
// (2) a request waiting for a shared prefix whose last block boundary (256) is inside the span.
TEST_F(PrefixCacheImagesTest, RestoreEndingInsideAnImageSpanFeedsTheRestOfItsRows) {
  make_cache();
  const auto ids = random_ids(270, 6);
  const std::vector<Img> img{{41, 150, 120}};  // [150, 270): the prompt ends with it
  const Outcome cold = run1(image_request(ids, img, 6), false);
  run1(image_request(ids, img, 6));
  const Outcome again = run1(image_request(ids, img, 6));
  EXPECT_EQ(again.last.cached_tokens, 269);
  EXPECT_EQ(again.last.cache.swa, "restored");
  EXPECT_EQ(again.last.cache.snapshot_tokens, 269 - 256);
  EXPECT_EQ(again.tokens, cold.tokens);

  const auto a = random_ids(300, 8);
  auto b = a;
  const auto tail = random_ids(21, 9);
  std::copy(tail.begin() + 1, tail.end(), b.begin() + 280);  // the same up to 280, then other text
  const std::vector<Img> shared{{42, 200, 80}};              // [200, 280) holds the boundary 256
  const auto cold2 = run({image_request(a, shared, 4), image_request(b, shared, 4)}, false);
  const auto got = run({image_request(a, shared, 4), image_request(b, shared, 4)});
  EXPECT_EQ(got[0].tokens, cold2[0].tokens);
  EXPECT_EQ(got[1].tokens, cold2[1].tokens);
  EXPECT_EQ(got[1].last.cached_tokens, 256);
  EXPECT_EQ(got[1].last.cache.swa, "restored");
}

// A preempted request with an image resumes by an exact restore of its own snapshot; its blocks
// are published under the image keys (a repeat of the same prompt restores them).
TEST_F(PrefixCacheImagesTest, PreemptedImageRequestResumesExactly) {
  make_cache();
  const auto a = random_ids(200, 11), b = random_ids(200, 12);
  const std::vector<Img> ia{{61, 30, 120}}, ib{{62, 90, 100}};
  const auto cold = run({image_request(a, ia, 40), image_request(b, ib, 40)}, false);
  LoopConfig lc;
  // Room for both prompts but not for both to decode 40 tokens: the newest is preempted.
  lc.kv_memory_bytes = cpu_->bytes_for_tokens(200) + cpu_->bytes_for_tokens(215);
  lc.max_batch_tokens = 512;
  const auto got = run({image_request(a, ia, 40), image_request(b, ib, 40)}, true, lc);
  ASSERT_GE(stats_.preemptions, 1);
  EXPECT_EQ(got[0].tokens, cold[0].tokens);
  EXPECT_EQ(got[1].tokens, cold[1].tokens);
  EXPECT_EQ(stats_.prefill_tokens_computed, 400 + stats_.preemptions);
  const Outcome again = run1(image_request(b, ib, 40));
  EXPECT_EQ(again.last.cached_tokens, 199);
  EXPECT_EQ(again.tokens, cold[1].tokens);
}

// --swa-miss replay with images: the bounded replay rebuilds the window from token ids, so a
// restore whose replay would read an image position (the window of 8 or the Engram look-back
// of 3 before it) recomputes exactly instead; an image before those positions allows it.
TEST_F(PrefixCacheImagesTest, ReplayThatWouldReadImagePositionsRecomputesExactly) {
  make_cache(SwaMiss::kReplay, 60);
  const auto ids = random_ids(300, 7);
  // Positions 245 and 246 (the Engram look-back before the replayed window [248, 256)).
  const std::vector<Img> late{{51, 150, 97}};
  const Outcome cold = run1(image_request(ids, late, 5), false);
  run1(image_request(ids, late, 5));
  clock_.advance_s(61);  // every snapshot expired; the blocks stay
  const int replays = eng_->replays;
  const Outcome got = run1(image_request(ids, late, 5));
  EXPECT_EQ(got.last.cache.swa, "recomputed");
  EXPECT_EQ(got.last.cached_tokens, 0);
  EXPECT_EQ(got.tokens, cold.tokens);
  EXPECT_EQ(eng_->replays, replays);
  EXPECT_EQ(swa("recomputed"), 1u);
  EXPECT_EQ(swa("replayed"), 0u);
  // An image ending before the replayed positions: the replay runs (approximate, as for text).
  const std::vector<Img> early{{52, 20, 100}};
  run1(image_request(ids, early, 5));
  clock_.advance_s(61);
  const Outcome rep = run1(image_request(ids, early, 5));
  EXPECT_EQ(rep.last.cache.swa, "replayed");
  EXPECT_EQ(rep.last.cached_tokens, 256);
  EXPECT_EQ(rep.tokens.size(), 5u);
  EXPECT_EQ(eng_->replays, replays + 1);
}

}  // namespace
}  // namespace ds41::engine
