// Issue 16, encoder/prefill overlap: the engine loop hands the images of a request that misses the
// vision-feature cache to the ImageEncoder worker and keeps stepping the other requests. A gated
// tower (encode_images blocks until the test opens it) proves that another request's decode tokens
// are produced while an image is being encoded, and that the synchronous path (image_encoder_jobs
// 0) cannot do that; errors end only the image request, cancellation and stop while encoding leak
// nothing, a full encoder parks requests (backpressure), busy time comes from the injected clock.
// Run under ThreadSanitizer by scripts/test.sh (the EngineLoop* / ImageEncoder* filters).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "engine/engine_loop.h"
#include "engine/image_encoder.h"
#include "fake_engine.h"
#include "loop_test_util.h"

namespace ds41::engine {
namespace {

using namespace std::chrono_literals;
using looptest::collect;
using looptest::greedy;
using looptest::Outcome;

constexpr int64_t kEncSpanH = 4;  // span row width of these tests

// The text model of FakeEngine; encode_images blocks on a gate (until open() or the timeout) and
// counts the steps that ran while an encode was in progress. Only encode_images runs off the loop
// thread (the Engine contract), so only the gate state is shared.
class GatedTowerEngine final : public Engine {
 public:
  explicit GatedTowerEngine(std::chrono::milliseconds gate_timeout = 20s, Clock* clock = nullptr)
      : text_(64), timeout_(gate_timeout), clock_(clock) {}

  const EngineInfo& info() const override { return text_.info(); }
  Result<SeqId> create_sequence() override { return text_.create_sequence(); }
  Result<SeqId> fork_sequence(SeqId s) override { return text_.fork_sequence(s); }
  Status free_sequence(SeqId s) override { return text_.free_sequence(s); }
  Result<int64_t> sequence_position(SeqId s) const override { return text_.sequence_position(s); }
  Result<int64_t> sequence_bytes(SeqId s) const override { return text_.sequence_bytes(s); }
  int64_t bytes_for_tokens(int64_t n) const override { return text_.bytes_for_tokens(n); }
  int64_t live_sequences() const override { return text_.live_sequences(); }
  Status step(std::span<const StepItem> items, StepOutput* out) override {
    if (in_encode_.load()) ++steps_during_encode_;
    for (const StepItem& it : items) {  // the first value of every fed span row, per sequence
      size_t flagged = 0;
      for (size_t t = 0; t < it.tokens.size(); ++t)
        if (!it.image_span.empty() && it.image_span[t])
          fed_[it.seq].push_back(it.span_embeds[flagged++ * kEncSpanH]);
      if (it.span_embeds.size() != flagged * kEncSpanH) return invalid_argument("span rows do not match the flags");
    }
    return text_.step(items, out);
  }
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override {
    in_encode_.store(true);
    ++entered_;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!cv_.wait_for(lk, timeout_, [&] { return open_; })) ++timeouts_;
    }
    if (clock_) static_cast<FakeClock*>(clock_)->advance_s(2.5);
    std::vector<std::vector<float>> out;
    for (const image::PreparedImage* p : images) {
      const int64_t n = p->plan.n_tokens;  // the image tag is in plan.orig_w
      std::vector<float> rows(n * kEncSpanH);
      for (int64_t r = 0; r < n; ++r) rows[r * kEncSpanH] = static_cast<float>(p->plan.orig_w * 1000 + r);
      out.push_back(std::move(rows));
    }
    ++encoded_;
    in_encode_.store(false);
    if (!fail_with_.empty()) return invalid_argument(fail_with_);
    return out;
  }

  // Each step sleeps this long (set before the loop starts): a text request outlasts an encode.
  void set_step_delay(std::chrono::milliseconds d) { text_.step_delay = d; }
  void open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Waits until `n` encodes have entered the tower.
  bool wait_entered(int n, std::chrono::milliseconds t = 10s) {
    const auto end = std::chrono::steady_clock::now() + t;
    while (entered_.load() < n) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  std::map<SeqId, std::vector<float>> fed_;  // loop thread; read after stop()
  std::string fail_with_;  // set before the loop starts: every encode fails with this message
  std::atomic<int> entered_{0}, encoded_{0}, timeouts_{0}, steps_during_encode_{0};

 private:
  testing::FakeEngine text_;
  std::chrono::milliseconds timeout_;
  Clock* clock_;
  std::atomic<bool> in_encode_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// A 20-token prompt with one image (tag) at [2, 12).
GenerationRequest image_request(int tag, int64_t max_tokens = 3,
                                std::weak_ptr<const image::PreparedImage>* watch = nullptr) {
  GenerationRequest g;
  for (int i = 0; i < 20; ++i) g.prompt.push_back(i >= 2 && i < 12 ? 63 : 1 + i);
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  g.ignore_eos = true;
  auto p = std::make_shared<image::PreparedImage>();
  p->plan.orig_w = tag;
  p->plan.n_tokens = 10;
  if (watch) *watch = p;
  RequestImage im;
  im.prepared = std::move(p);
  im.cache_key = "img" + std::to_string(tag);
  im.span_start = 2;
  im.span_length = 10;
  g.images.push_back(std::move(im));
  return g;
}

GenerationRequest text_request(int64_t max_tokens) { return greedy({1, 2, 3, 4, 5, 6, 7, 8}, max_tokens); }

// Reads s until it has delivered n tokens (or ended, or the timeout); returns the tokens seen.
int64_t read_tokens(RequestStream& s, int64_t n, std::chrono::milliseconds t, Outcome* o) {
  const auto end = std::chrono::steady_clock::now() + t;
  std::vector<TokenEvent> evs;
  do {
    evs.clear();
    if (!s.next(&evs, t.count() > 0 ? 20ms : 0ms)) break;
    for (auto& e : evs) {
      if (e.token >= 0) o->tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) o->last = e;
    }
  } while (static_cast<int64_t>(o->tokens.size()) < n && std::chrono::steady_clock::now() < end);
  return static_cast<int64_t>(o->tokens.size());
}

void append(Outcome* o, const Outcome& rest) {
  o->tokens.insert(o->tokens.end(), rest.tokens.begin(), rest.tokens.end());
  if (rest.last.finish != FinishReason::kNone) o->last = rest.last;
}

LoopConfig small_loop() {
  LoopConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_running = 8;
  return cfg;
}

TEST(EngineLoopImageEncoder, OtherRequestsDecodeWhileAnImageIsEncoded) {
  GatedTowerEngine eng;
  eng.set_step_delay(1ms);
  EngineLoop loop(&eng, small_loop());
  auto img = loop.submit(image_request(7));
  auto txt = loop.submit(text_request(400));
  ASSERT_TRUE(img.ok() && txt.ok());
  ASSERT_TRUE(loop.start().ok());
  ASSERT_TRUE(eng.wait_entered(1));
  // The tower holds the image request; the text request must still decode 10 more tokens.
  Outcome t;
  const int64_t before = read_tokens(**txt, 0, 0ms, &t);
  // 11 tokens: the first may come from a step that began before the encode did.
  EXPECT_GE(read_tokens(**txt, before + 11, 10s, &t), before + 11)
      << "no decode tokens while the image was being encoded";
  EXPECT_GE(eng.steps_during_encode_.load(), 10);
  EXPECT_EQ(eng.encoded_.load(), 0);  // still in the tower
  std::vector<TokenEvent> none;
  (*img)->next(&none, 0ms);
  EXPECT_TRUE(none.empty()) << "the image request produced output before its rows were back";
  eng.open();
  append(&t, collect(**txt));
  const Outcome i = collect(**img);
  EXPECT_EQ(t.tokens.size(), 400u);
  EXPECT_EQ(t.last.finish, FinishReason::kLength) << t.last.error;
  EXPECT_EQ(i.tokens.size(), 3u);
  EXPECT_EQ(i.last.finish, FinishReason::kLength) << i.last.error;
  EXPECT_EQ(eng.timeouts_.load(), 0);
  loop.stop(1000ms);
  const LoopStats st = loop.stats();
  EXPECT_EQ(st.images_encoded, 1);
  EXPECT_EQ(st.image_tokens, 10);
  EXPECT_EQ(st.image_encoder_queued + st.image_encoder_running, 0);
}

// The check above fails on the synchronous path: there the tower runs on the loop thread, so no
// step runs while it encodes (the gate only opens by its timeout).
TEST(EngineLoopImageEncoder, OnTheLoopThreadAnEncodeStallsEveryRequest) {
  GatedTowerEngine eng(300ms);
  LoopConfig cfg = small_loop();
  cfg.image_encoder_jobs = 0;
  EngineLoop loop(&eng, cfg);
  auto img = loop.submit(image_request(7));
  auto txt = loop.submit(text_request(20));
  ASSERT_TRUE(img.ok() && txt.ok());
  ASSERT_TRUE(loop.start().ok());
  const Outcome t = collect(**txt), i = collect(**img);
  EXPECT_EQ(t.tokens.size(), 20u);
  EXPECT_EQ(i.tokens.size(), 3u);
  EXPECT_EQ(eng.timeouts_.load(), 1);
  EXPECT_EQ(eng.steps_during_encode_.load(), 0);
  loop.stop(1000ms);
}

TEST(EngineLoopImageEncoder, AnEncodeErrorEndsOnlyThatRequest) {
  GatedTowerEngine eng;
  eng.fail_with_ = "tower exploded";
  eng.open();
  EngineLoop loop(&eng, small_loop());
  auto img = loop.submit(image_request(7));
  auto txt = loop.submit(text_request(12));
  ASSERT_TRUE(img.ok() && txt.ok());
  ASSERT_TRUE(loop.start().ok());
  const Outcome i = collect(**img), t = collect(**txt);
  EXPECT_EQ(i.last.finish, FinishReason::kError);
  EXPECT_NE(i.last.error.find("image encoding failed"), std::string::npos) << i.last.error;
  EXPECT_NE(i.last.error.find("tower exploded"), std::string::npos) << i.last.error;
  EXPECT_TRUE(i.tokens.empty());
  EXPECT_EQ(t.tokens.size(), 12u);
  EXPECT_EQ(t.last.finish, FinishReason::kLength);
  loop.stop(1000ms);
  EXPECT_EQ(loop.stats().images_encoded, 0);
  EXPECT_EQ(loop.stats().vision_cache_entries, 0);
}

TEST(EngineLoopImageEncoder, CancelWhileEncodingOrQueuedLeaksNothing) {
  GatedTowerEngine eng;
  eng.set_step_delay(1ms);
  EngineLoop loop(&eng, small_loop());
  std::weak_ptr<const image::PreparedImage> w1, w2;
  auto a = loop.submit(image_request(1, 3, &w1));  // in the tower
  auto b = loop.submit(image_request(2, 3, &w2));  // queued behind it
  auto txt = loop.submit(text_request(30));
  ASSERT_TRUE(a.ok() && b.ok() && txt.ok());
  ASSERT_TRUE(loop.start().ok());
  ASSERT_TRUE(eng.wait_entered(1));
  // Both image requests go away (client disconnect) while the tower still runs image 1.
  (*a)->cancel();
  (*b)->cancel();
  const Outcome oa = collect(**a), ob = collect(**b);
  EXPECT_EQ(oa.last.finish, FinishReason::kAbort);
  EXPECT_EQ(ob.last.finish, FinishReason::kAbort);
  Outcome t;
  EXPECT_GE(read_tokens(**txt, 5, 10s, &t), 5);
  eng.open();
  append(&t, collect(**txt));
  EXPECT_EQ(t.tokens.size(), 30u);
  loop.stop(1000ms);
  EXPECT_EQ(eng.encoded_.load(), 1) << "the queued job of a cancelled request ran";
  EXPECT_EQ(loop.stats().vision_cache_entries, 0) << "a cancelled job's rows were kept";
  EXPECT_TRUE(w1.expired());  // no job or request holds the images any more
  EXPECT_TRUE(w2.expired());
}

TEST(EngineLoopImageEncoder, AFullEncoderParksRequestsUntilThereIsRoom) {
  GatedTowerEngine eng;
  eng.set_step_delay(1ms);
  LoopConfig cfg = small_loop();
  cfg.image_encoder_jobs = 1;
  EngineLoop loop(&eng, cfg);
  auto a = loop.submit(image_request(1));
  auto b = loop.submit(image_request(2));
  auto txt = loop.submit(text_request(30));
  ASSERT_TRUE(a.ok() && b.ok() && txt.ok());
  ASSERT_TRUE(loop.start().ok());
  ASSERT_TRUE(eng.wait_entered(1));
  Outcome t;
  EXPECT_GE(read_tokens(**txt, 5, 10s, &t), 5);
  EXPECT_GE(loop.stats().image_encoder_rejected, 1);  // b found the encoder full
  eng.open();
  const Outcome oa = collect(**a), ob = collect(**b);
  append(&t, collect(**txt));
  EXPECT_EQ(oa.tokens.size(), 3u) << oa.last.error;
  EXPECT_EQ(ob.tokens.size(), 3u) << ob.last.error;
  EXPECT_EQ(t.tokens.size(), 30u);
  loop.stop(1000ms);
  EXPECT_EQ(eng.encoded_.load(), 2);
  EXPECT_EQ(loop.stats().images_encoded, 2);
}

TEST(EngineLoopImageEncoder, RowsMatchTheSynchronousPathAndRepeatsHitTheCache) {
  // Same requests, encoder on and off: the same tokens and the same span rows fed per sequence.
  std::vector<std::vector<int32_t>> got;
  std::vector<std::map<SeqId, std::vector<float>>> fed;
  for (int64_t jobs : {int64_t{0}, int64_t{4}}) {
    GatedTowerEngine eng;
    eng.open();
    LoopConfig cfg = small_loop();
    cfg.image_encoder_jobs = jobs;
    LoopStats st;
    auto out =
        looptest::run_requests(eng, cfg, {image_request(3, 6), text_request(6), image_request(3, 6)}, &st);
    std::vector<int32_t> all;
    for (const Outcome& o : out) {
      EXPECT_EQ(o.tokens.size(), 6u) << o.last.error;
      all.insert(all.end(), o.tokens.begin(), o.tokens.end());
    }
    got.push_back(all);
    fed.push_back(eng.fed_);
    ASSERT_EQ(eng.fed_.size(), 2u);  // the two image requests' sequences
    for (const auto& [seq, rows] : eng.fed_) {
      ASSERT_EQ(rows.size(), 10u);
      for (int r = 0; r < 10; ++r) EXPECT_EQ(rows[r], 3000.0f + r);
    }
    EXPECT_GE(st.images_encoded, 1);
    EXPECT_EQ(st.images_encoded + st.vision_cache_hits, 2);
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(fed[0], fed[1]);
}

TEST(EngineLoopImageEncoder, BusySecondsComeFromTheInjectedClock) {
  FakeClock clock;
  GatedTowerEngine eng(20s, &clock);  // every encode advances the clock by 2.5 s
  eng.open();
  EngineLoop loop(&eng, small_loop(), &clock);
  auto a = loop.submit(image_request(1));
  auto b = loop.submit(image_request(2));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(loop.start().ok());
  EXPECT_EQ(collect(**a).tokens.size(), 3u);
  EXPECT_EQ(collect(**b).tokens.size(), 3u);
  loop.stop(1000ms);
  EXPECT_DOUBLE_EQ(loop.stats().image_encoder_busy_seconds, 5.0);
}

TEST(EngineLoopImageEncoder, StopWhileEncodingAbortsAndWaitsForTheTower) {
  GatedTowerEngine eng(200ms);  // the gate never opens: the encode ends by its timeout
  std::weak_ptr<const image::PreparedImage> w;
  {
    EngineLoop loop(&eng, small_loop());
    auto a = loop.submit(image_request(1, 3, &w));
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(loop.start().ok());
    ASSERT_TRUE(eng.wait_entered(1));
    loop.stop(0ms);
    const Outcome o = collect(**a);
    EXPECT_EQ(o.last.finish, FinishReason::kAbort);
    EXPECT_EQ(eng.encoded_.load(), 1);  // stop() returned after the tower did
  }
  EXPECT_TRUE(w.expired());
}

TEST(ImageEncoder, BoundedQueueOrderCancelAndStop) {
  GatedTowerEngine eng;
  ImageEncoder enc(&eng, 2, &SystemClock::instance());
  std::atomic<int> ended{0};
  enc.set_listener([&] { ++ended; });
  auto img = [](int tag) {
    auto p = std::make_shared<image::PreparedImage>();
    p->plan.orig_w = tag;
    p->plan.n_tokens = 2;
    return std::vector<std::shared_ptr<const image::PreparedImage>>{p};
  };
  auto t1 = enc.submit(img(1));
  ASSERT_TRUE(t1.ok());
  ASSERT_TRUE(eng.wait_entered(1));
  auto t2 = enc.submit(img(2));
  ASSERT_TRUE(t2.ok());
  auto t3 = enc.submit(img(3));
  EXPECT_EQ(t3.status().code(), StatusCode::kResourceExhausted) << t3.status().message();
  EXPECT_EQ(enc.submit({nullptr}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(enc.stats().queued, 1);
  EXPECT_EQ(enc.stats().running, 1);
  EXPECT_EQ(enc.stats().rejected, 1);
  (*t2)->cancel();
  eng.open();
  while (ended.load() < 2) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE((*t2)->done());
  ASSERT_TRUE((*t1)->done());
  auto r1 = (*t1)->take();
  ASSERT_TRUE(r1.ok()) << r1.status().message();
  ASSERT_EQ(r1->size(), 1u);
  EXPECT_EQ((*r1)[0][0], 1000.0f);
  EXPECT_EQ((*t1)->take().status().code(), StatusCode::kFailedPrecondition);  // once
  EXPECT_FALSE((*t2)->take().ok());
  EXPECT_EQ(eng.encoded_.load(), 1);  // the cancelled job was skipped
  EXPECT_EQ(ended.load(), 2);
  enc.stop();
  EXPECT_EQ(enc.submit(img(4)).status().code(), StatusCode::kUnavailable);
  const ImageEncoderStats st = enc.stats();
  EXPECT_EQ(st.jobs, 1);
  EXPECT_EQ(st.images, 1);
}

}  // namespace
}  // namespace ds41::engine
