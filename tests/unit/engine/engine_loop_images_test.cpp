// Issue 16: the engine loop's image path over a recording engine. Span rows are computed once per
// image (Engine::encode_images), then served from the vision-feature cache; every prefill chunk
// carries exactly its flags and the span rows of its flagged positions, in order, whatever the
// chunking; an engine without a tower ends the request with an error event.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "engine/engine_loop.h"

namespace ds41::engine {
namespace {

constexpr int64_t kImgSpanH = 4;  // span row width of this test

// Records, per sequence, every fed token with its flag and (for flagged ones) the first value
// of its span row. encode_images gives image k rows whose values encode (image tag, row).
class ImageRecordingEngine final : public Engine {
 public:
  explicit ImageRecordingEngine(bool tower = true) : tower_(tower) {
    info_.model_name = "img";
    info_.device = "cpu";
    info_.vocab_size = 64;
    info_.max_context = 4096;
    info_.eos_token_id = -1;
  }
  const EngineInfo& info() const override { return info_; }
  Result<SeqId> create_sequence() override { return next_++; }
  Result<SeqId> fork_sequence(SeqId) override { return next_++; }
  Status free_sequence(SeqId) override { return ok_status(); }
  Result<int64_t> sequence_position(SeqId s) const override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = fed_.find(s);
    return it == fed_.end() ? 0 : static_cast<int64_t>(it->second.size());
  }
  Result<int64_t> sequence_bytes(SeqId) const override { return 100; }
  int64_t bytes_for_tokens(int64_t n) const override { return 100 + n; }
  int64_t live_sequences() const override { return 1; }
  Status step(std::span<const StepItem> items, StepOutput* out) override {
    std::lock_guard<std::mutex> lk(mu_);
    out->vocab = info_.vocab_size;
    out->logits.clear();
    out->row.assign(items.size(), -1);
    for (size_t i = 0; i < items.size(); ++i) {
      const StepItem& it = items[i];
      size_t flagged = 0;
      for (size_t t = 0; t < it.tokens.size(); ++t) {
        const bool f = !it.image_span.empty() && it.image_span[t];
        fed_[it.seq].push_back({it.tokens[t], f ? it.span_embeds[flagged * kImgSpanH] : -1.0f});
        flagged += f;
      }
      if (it.span_embeds.size() != flagged * kImgSpanH) return invalid_argument("span rows do not match the flags");
      if (!it.want_logits) continue;
      out->row[i] = static_cast<int64_t>(out->logits.size()) / info_.vocab_size;
      std::vector<float> row(info_.vocab_size, 0.0f);
      row[5] = 1.0f;
      out->logits.insert(out->logits.end(), row.begin(), row.end());
    }
    return ok_status();
  }
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override {
    if (!tower_) return unimplemented("no tower here");
    std::vector<std::vector<float>> out;
    for (const image::PreparedImage* p : images) {
      ++encoded_;
      const int64_t n = p->plan.n_tokens;  // the test stores the image tag in plan.orig_w
      std::vector<float> rows(n * kImgSpanH);
      for (int64_t r = 0; r < n; ++r) rows[r * kImgSpanH] = static_cast<float>(p->plan.orig_w * 1000 + r);
      out.push_back(std::move(rows));
    }
    return out;
  }
  std::vector<std::pair<int32_t, float>> fed(SeqId s) {
    std::lock_guard<std::mutex> lk(mu_);
    return fed_[s];
  }
  int encoded_ = 0;

 private:
  bool tower_;
  EngineInfo info_;
  SeqId next_ = 0;
  mutable std::mutex mu_;
  std::map<SeqId, std::vector<std::pair<int32_t, float>>> fed_;
};

RequestImage image_of(int tag, int64_t start, int64_t len) {
  auto p = std::make_shared<image::PreparedImage>();
  p->plan.orig_w = tag;
  p->plan.n_tokens = len;
  RequestImage im;
  im.prepared = p;
  im.cache_key = "img" + std::to_string(tag);
  im.span_start = start;
  im.span_length = len;
  return im;
}

// A 40-token prompt with image 7 at [3, 13) and image 8 at [20, 27).
GenerationRequest image_request() {
  GenerationRequest g;
  for (int i = 0; i < 40; ++i) g.prompt.push_back((i >= 3 && i < 13) || (i >= 20 && i < 27) ? 63 : i % 50);
  g.max_tokens = 2;
  g.sampling.temperature = 0;
  g.images = {image_of(7, 3, 10), image_of(8, 20, 7)};
  return g;
}

void drain(const std::shared_ptr<RequestStream>& s, std::vector<TokenEvent>* ev) {
  while (s->next(ev, std::chrono::milliseconds(5000))) {
  }
}

TEST(EngineLoopImages, ChunksCarryTheirSpanRowsAndTheCacheServesRepeats) {
  ImageRecordingEngine eng;
  LoopConfig cfg;
  cfg.max_batch_tokens = 6;  // prefill in chunks of at most 6: spans cross chunk boundaries
  cfg.max_running = 1;
  EngineLoop loop(&eng, cfg);
  const Status started = loop.start();
  ASSERT_TRUE(started.ok()) << started.message();
  for (int round = 0; round < 2; ++round) {
    auto s = loop.submit(image_request());
    ASSERT_TRUE(s.ok()) << s.status().message();
    std::vector<TokenEvent> ev;
    drain(*s, &ev);
    ASSERT_FALSE(ev.empty());
    EXPECT_NE(ev.back().finish, FinishReason::kError) << ev.back().error;
    const auto fed = eng.fed(round);
    ASSERT_GE(fed.size(), 40u);
    for (int t = 0; t < 40; ++t) {
      float want = -1.0f;
      if (t >= 3 && t < 13) want = 7000.0f + (t - 3);
      if (t >= 20 && t < 27) want = 8000.0f + (t - 20);
      EXPECT_EQ(fed[t].second, want) << "round " << round << " position " << t;
    }
  }
  EXPECT_EQ(eng.encoded_, 2);  // the second request came from the cache
  const LoopStats st = loop.stats();
  EXPECT_EQ(st.images_encoded, 2);
  EXPECT_EQ(st.image_tokens, 34);
  loop.stop(std::chrono::milliseconds(1000));
  EXPECT_EQ(loop.stats().vision_cache_hits, 2);
}

TEST(EngineLoopImages, BadSpansAreRefusedAndAnEngineWithoutATowerEndsTheRequest) {
  ImageRecordingEngine eng(false);
  EngineLoop loop(&eng, LoopConfig{});
  ASSERT_TRUE(loop.start().ok());
  GenerationRequest bad = image_request();
  bad.images[1].span_start = 35;  // runs past the prompt
  EXPECT_EQ(loop.submit(bad).status().code(), StatusCode::kInvalidArgument);
  auto s = loop.submit(image_request());
  ASSERT_TRUE(s.ok());
  std::vector<TokenEvent> ev;
  drain(*s, &ev);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().finish, FinishReason::kError);
  EXPECT_NE(ev.back().error.find("no tower here"), std::string::npos) << ev.back().error;
  loop.stop(std::chrono::milliseconds(1000));
}

}  // namespace
}  // namespace ds41::engine
