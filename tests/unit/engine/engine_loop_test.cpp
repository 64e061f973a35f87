// EngineLoop + RequestStream over FakeEngine (engine_loop.h): event order and exactly one final
// event, greedy tokens equal the model's own greedy continuation, seeded sampling independent of
// batch composition, cancel mid-prefill frees the sequence, stop(timeout) aborts, full queue,
// submit validation, preemption with exact recompute.
#include "engine/engine_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>

#include "engine/logits_processing.h"
#include "engine/sampler.h"
#include "unit/engine/fake_engine.h"

namespace ds41::engine {
namespace {

using ds41::testing::FakeEngine;
using namespace std::chrono_literals;

struct Collected {
  std::vector<int32_t> tokens;
  std::vector<TokenEvent> events;
  FinishReason finish = FinishReason::kNone;
  int finals = 0;
};

Collected drain(RequestStream& s) {
  Collected c;
  std::vector<TokenEvent> evs;
  while (s.next(&evs, 5000ms)) {
    for (auto& e : evs) {
      EXPECT_EQ(c.finals, 0) << "an event after the final one";
      if (e.token >= 0) c.tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) {
        ++c.finals;
        c.finish = e.finish;
      }
      c.events.push_back(e);
    }
    evs.clear();
  }
  return c;
}

// What a sequence alone produces with the seam sampler (the reference for the loop's output).
std::vector<int32_t> reference(std::vector<int32_t> prompt, int64_t n, const SamplingParams& p,
                               int64_t vocab) {
  auto sampler = Sampler::create(sampler_params(p, p.seed.value_or(0)));
  EXPECT_TRUE(sampler.ok());
  PenaltyState pen(p, prompt, vocab);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    auto row = FakeEngine::logits_for(prompt, vocab);
    pen.apply(row.data(), vocab);
    int32_t t = *sampler->sample(row);
    pen.add(t);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

std::vector<int32_t> prompt_of(int64_t n, int32_t salt, int64_t vocab = 64) {
  std::vector<int32_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 7 + salt * 13 + 3) % vocab);
  return p;
}

GenerationRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// Greedy draws by the engine (StepItem::greedy_only, StepOutput::token: the GPU engine's argmax on
// the device): a batch mixing pure greedy requests (drawn by the engine), greedy ones with a penalty or
// logprobs and sampled ones (drawn from rows by the loop) gives every request the tokens, logprobs and
// finish it gets when the engine returns rows only; only the pure greedy items were drawn by the engine.
TEST(EngineLoop, EngineDrawnGreedyTokensEqualTheLoopsDraws) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r = greedy_request(prompt_of(7 + i * 9, i), 4 + i % 5);
    if (i % 4 == 1) r.sampling.presence_penalty = 0.5;  // greedy, but the row is changed first
    if (i % 4 == 2) r.sampling.top_logprobs = 2;        // greedy, but logprobs are read from the row
    if (i % 4 == 3) {                                   // sampled
      r.sampling.temperature = 0.8;
      r.sampling.seed = 900 + i;
    }
    reqs.push_back(r);
  }
  auto run = [&](bool engine_draws, int64_t* drawn) {
    FakeEngine eng;
    eng.draws_greedy = engine_draws;
    LoopConfig cfg;
    cfg.max_batch_tokens = 64;
    cfg.max_running = 12;
    EngineLoop loop(&eng, cfg);
    EXPECT_TRUE(loop.start().ok());
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const GenerationRequest& r : reqs) {
      auto s = loop.submit(r);
      EXPECT_TRUE(s.ok()) << s.status().message();
      streams.push_back(*s);
    }
    std::vector<Collected> got;
    for (auto& s : streams) got.push_back(drain(*s));
    loop.stop(1000ms);
    *drawn = eng.greedy_drawn.load();
    return got;
  };
  int64_t drawn_rows = 0, drawn_engine = 0;
  const std::vector<Collected> rows = run(false, &drawn_rows), engine = run(true, &drawn_engine);
  EXPECT_EQ(drawn_rows, 0);
  int64_t pure_greedy_tokens = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(engine[i].tokens, rows[i].tokens) << "request " << i;
    EXPECT_EQ(engine[i].tokens, reference(reqs[i].prompt, reqs[i].max_tokens, reqs[i].sampling, 64)) << i;
    EXPECT_EQ(engine[i].finish, FinishReason::kLength) << i;
    ASSERT_EQ(engine[i].events.size(), rows[i].events.size()) << i;
    for (size_t e = 0; e < engine[i].events.size(); ++e) {
      EXPECT_EQ(engine[i].events[e].logprob, rows[i].events[e].logprob) << i;
      EXPECT_EQ(engine[i].events[e].top.size(), rows[i].events[e].top.size()) << i;
    }
    if (i % 4 == 0) pure_greedy_tokens += reqs[i].max_tokens;
  }
  // Every token of a pure greedy request, and no other, was the engine's draw.
  EXPECT_EQ(drawn_engine, pure_greedy_tokens);
}

// A row the sampler refuses (a NaN logit), found by the engine's greedy draw: that request ends with an
// error naming the problem, the others in the batch go on, and the loop keeps serving.
TEST(EngineLoop, EngineDrawnInvalidRowEndsOnlyThatRequest) {
  FakeEngine eng;
  eng.draws_greedy = true;
  const std::vector<int32_t> poisoned = prompt_of(20, 3), fine = prompt_of(33, 4);
  eng.nan_at_length = static_cast<int64_t>(poisoned.size()) + 2;  // the third draw of `poisoned`
  LoopConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_running = 4;
  EngineLoop loop(&eng, cfg);
  ASSERT_TRUE(loop.start().ok());
  auto a = loop.submit(greedy_request(poisoned, 6));
  auto b = loop.submit(greedy_request(fine, 6));
  ASSERT_TRUE(a.ok() && b.ok());
  const Collected ca = drain(**a), cb = drain(**b);
  EXPECT_EQ(ca.finish, FinishReason::kError);
  EXPECT_EQ(ca.tokens.size(), 2u);
  EXPECT_NE(ca.events.back().error.find("NaN"), std::string::npos) << ca.events.back().error;
  EXPECT_EQ(cb.finish, FinishReason::kLength);
  EXPECT_EQ(cb.tokens, reference(fine, 6, greedy_request(fine, 6).sampling, 64));
  auto c = loop.submit(greedy_request(prompt_of(9, 5), 3));  // still serving
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(drain(**c).finish, FinishReason::kLength);
  loop.stop(1000ms);
}

TEST(EngineLoop, GreedyTokensInOrderWithExactlyOneFinalEvent) {
  FakeEngine eng;
  LoopConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_running = 8;
  EngineLoop loop(&eng, cfg);
  ASSERT_TRUE(loop.start().ok());
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(greedy_request(prompt_of(5 + i * 11, i), 3 + i));
    auto s = loop.submit(reqs.back());
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(*s);
  }
  for (int i = 0; i < 12; ++i) {
    Collected c = drain(*streams[i]);
    EXPECT_EQ(c.finals, 1);
    EXPECT_EQ(c.finish, FinishReason::kLength);
    EXPECT_EQ(c.tokens, reference(reqs[i].prompt, reqs[i].max_tokens, reqs[i].sampling, 64))
        << "request " << i;
    EXPECT_EQ(c.events.back().prompt_tokens, static_cast<int64_t>(reqs[i].prompt.size()));
  }
  loop.stop(1000ms);
  EXPECT_EQ(eng.live_sequences(), 0);
  LoopStats st = loop.stats();
  EXPECT_GT(st.steps, 0);
  EXPECT_EQ(st.running, 0);
  for (const auto& step : eng.steps()) {
    int64_t tokens = 0;
    for (const auto& [seq, n] : step) tokens += n;
    EXPECT_LE(tokens, 64);
  }
}

TEST(EngineLoop, SeededSamplingIsIndependentOfBatchComposition) {
  GenerationRequest target;
  target.prompt = prompt_of(40, 99);
  target.max_tokens = 30;
  target.sampling.temperature = 0.9;
  target.sampling.top_p = 0.95;
  target.sampling.seed = 4242;
  target.sampling.presence_penalty = 0.3;
  const auto expect = reference(target.prompt, 30, target.sampling, 64);
  for (int others : {0, 9}) {
    FakeEngine eng;
    LoopConfig cfg;
    cfg.max_batch_tokens = 32;  // the target's prefill is chunked beside the others
    cfg.max_running = 16;
    EngineLoop loop(&eng, cfg);
    std::vector<std::shared_ptr<RequestStream>> bg;
    for (int i = 0; i < others; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(3 + 5 * i, i);
      r.max_tokens = 25;
      r.sampling.temperature = 1.2;  // seeds drawn from the loop's seed source
      bg.push_back(*loop.submit(r));
    }
    auto s = loop.submit(target);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(loop.start().ok());
    Collected c = drain(**s);
    EXPECT_EQ(c.tokens, expect) << "with " << others << " other requests";
    for (auto& b : bg) EXPECT_EQ(drain(*b).finals, 1);
  }
}

// With a sample pool the rows of a step are drawn on several threads at once; every request must
// still get exactly its own seeded stream (a shared scratch buffer, a sampler used for another
// request's row or a misordered result would change tokens), logprobs included.
TEST(EngineLoop, ParallelSamplingGivesEachRequestItsOwnStream) {
  ThreadPool pool(4);
  FakeEngine eng;
  LoopConfig cfg;
  cfg.max_batch_tokens = 256;
  cfg.max_running = 24;
  cfg.sample_pool = &pool;
  EngineLoop loop(&eng, cfg);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 24; ++i) {
    GenerationRequest r;
    r.prompt = prompt_of(4 + 3 * i, i);
    r.max_tokens = 20;
    r.sampling.temperature = 0.5 + 0.05 * i;
    r.sampling.top_p = i % 3 == 0 ? 0.9 : 1.0;
    r.sampling.top_k = i % 4 == 1 ? 10 : 0;
    r.sampling.seed = 1000 + i;
    r.sampling.frequency_penalty = i % 2 ? 0.4 : 0.0;
    r.sampling.top_logprobs = i % 5 == 0 ? 3 : -1;
    reqs.push_back(r);
    streams.push_back(*loop.submit(r));
  }
  ASSERT_TRUE(loop.start().ok());
  for (int i = 0; i < 24; ++i) {
    Collected c = drain(*streams[i]);
    EXPECT_EQ(c.tokens, reference(reqs[i].prompt, 20, reqs[i].sampling, 64)) << "request " << i;
    if (reqs[i].sampling.top_logprobs >= 0) {
      for (const TokenEvent& e : c.events) {
        if (e.token >= 0) {
          EXPECT_EQ(e.top.size(), 3u) << "request " << i;
        }
      }
    }
  }
  loop.stop(1000ms);
}

TEST(EngineLoop, StopTokenIdsFinishWithStop) {
  FakeEngine eng;
  EngineLoop loop(&eng, LoopConfig{});
  ASSERT_TRUE(loop.start().ok());
  auto r = greedy_request(prompt_of(10, 1), 50);
  const auto ref = reference(r.prompt, 50, r.sampling, 64);
  r.stop_token_ids = {ref[3]};
  const int64_t first = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  Collected c = drain(**loop.submit(r));
  EXPECT_EQ(c.finish, FinishReason::kStop);
  EXPECT_EQ(static_cast<int64_t>(c.tokens.size()), first + 1);  // the stop token is reported
}

TEST(EngineLoop, EosStopsUnlessIgnored) {
  FakeEngine eng;
  auto r = greedy_request(prompt_of(10, 2), 40);
  const auto ref = reference(r.prompt, 40, r.sampling, 64);
  eng.mutable_info().eos_token_id = ref[5];
  const int64_t first = std::find(ref.begin(), ref.end(), ref[5]) - ref.begin();
  EngineLoop loop(&eng, LoopConfig{});
  ASSERT_TRUE(loop.start().ok());
  Collected c = drain(**loop.submit(r));
  EXPECT_EQ(c.finish, FinishReason::kStop);
  EXPECT_EQ(static_cast<int64_t>(c.tokens.size()), first + 1);
  r.ignore_eos = true;
  c = drain(**loop.submit(r));
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 40u);
}

TEST(EngineLoop, LogprobsComeWithEachToken) {
  FakeEngine eng;
  EngineLoop loop(&eng, LoopConfig{});
  ASSERT_TRUE(loop.start().ok());
  auto r = greedy_request(prompt_of(10, 3), 4);
  r.sampling.top_logprobs = 5;
  Collected c = drain(**loop.submit(r));
  ASSERT_EQ(c.events.size(), 4u);
  for (const auto& e : c.events) {
    ASSERT_EQ(e.top.size(), 5u);
    EXPECT_EQ(e.top[0].token, e.token);  // greedy: the sampled token is the top one
    EXPECT_FLOAT_EQ(e.top[0].logprob, e.logprob);
    EXPECT_LT(e.logprob, 0.0f);
  }
}

TEST(EngineLoop, CancelMidPrefillFreesTheSequence) {
  FakeEngine eng;
  LoopConfig cfg;
  cfg.max_batch_tokens = 64;
  cfg.max_running = 4;
  EngineLoop loop(&eng, cfg);
  std::shared_ptr<RequestStream> victim;
  std::atomic<int> steps{0};
  std::atomic<int64_t> live_after_cancel{-1};
  loop.on_step = [&](int64_t, int64_t, double) {
    const int n = ++steps;
    if (n == 3) victim->cancel();                          // after 3 of its ~32 prefill chunks
    if (n == 4) live_after_cancel = eng.live_sequences();  // loop thread: no race
  };
  auto s = loop.submit(greedy_request(prompt_of(2000, 5), 5));
  ASSERT_TRUE(s.ok());
  victim = *s;
  ASSERT_TRUE(loop.start().ok());
  Collected c = drain(*victim);
  EXPECT_EQ(c.finish, FinishReason::kAbort);
  EXPECT_EQ(c.finals, 1);
  EXPECT_TRUE(c.tokens.empty());
  // Another request runs after it: the cancelled one's sequence was freed at the next step.
  Collected d = drain(**loop.submit(greedy_request(prompt_of(10, 6), 2)));
  EXPECT_EQ(d.finish, FinishReason::kLength);
  loop.stop(1000ms);
  EXPECT_EQ(live_after_cancel.load(), 1);  // at step 4 only the new request's sequence lives
  EXPECT_EQ(eng.live_sequences(), 0);
  const auto all = eng.steps();
  int64_t victim_tokens = 0;
  for (size_t i = 0; i < all.size(); ++i)
    for (const auto& [seq, n] : all[i])
      if (seq == 1) victim_tokens += n;
  EXPECT_EQ(victim_tokens, 3 * 64);  // nothing ran for it after the cancel
}

TEST(EngineLoop, StopWithTimeoutAbortsWhatIsLeft) {
  FakeEngine eng;
  eng.step_delay = 2ms;
  EngineLoop loop(&eng, LoopConfig{});
  ASSERT_TRUE(loop.start().ok());
  auto r = greedy_request(prompt_of(10, 7), 1'000'000);
  r.ignore_eos = true;
  auto s = *loop.submit(r);
  auto quick = *loop.submit(greedy_request(prompt_of(10, 8), 2));
  std::vector<TokenEvent> evs;
  ASSERT_TRUE(s->next(&evs, 5000ms));  // it is running
  const auto t0 = std::chrono::steady_clock::now();
  loop.stop(50ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3000ms);
  Collected c = drain(*s);
  EXPECT_EQ(c.finish, FinishReason::kAbort);
  EXPECT_EQ(drain(*quick).finish, FinishReason::kLength);  // finished within the drain time
  EXPECT_EQ(eng.live_sequences(), 0);
  auto after = loop.submit(greedy_request(prompt_of(3, 1), 1));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
}

TEST(EngineLoop, FullQueueIsResourceExhausted) {
  FakeEngine eng;
  LoopConfig cfg;
  cfg.max_queue = 2;
  EngineLoop loop(&eng, cfg);  // not started: requests stay queued
  auto a = loop.submit(greedy_request(prompt_of(3, 1), 1));
  auto b = loop.submit(greedy_request(prompt_of(3, 2), 1));
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = loop.submit(greedy_request(prompt_of(3, 3), 1));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("max_queue 2"), std::string::npos) << c.status().message();
  EXPECT_EQ(loop.stats().waiting, 2);
  loop.stop(0ms);
  EXPECT_EQ(drain(**a).finish, FinishReason::kAbort);
  EXPECT_EQ(drain(**b).finish, FinishReason::kAbort);
}

TEST(EngineLoop, SubmitRefusesWhatCanNeverRunWithTheNumbers) {
  FakeEngine eng(64, 100);
  LoopConfig cfg;
  cfg.kv_memory_bytes = 1000 + 10 * 80;  // 80 tokens of state
  EngineLoop loop(&eng, cfg);
  auto expect_invalid = [&](GenerationRequest r, const std::string& needle) {
    auto s = loop.submit(std::move(r));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
  };
  expect_invalid(greedy_request(prompt_of(70, 1), 20), "90 tokens");       // state: 1900 > 1800 bytes
  expect_invalid(greedy_request(prompt_of(70, 1), 31), "context of 100");  // 101 positions
  expect_invalid(greedy_request({}, 1), "no tokens");
  expect_invalid(greedy_request({1, 64}, 1), "id 64");
  expect_invalid(greedy_request({1}, 0), "max_tokens");
  auto r = greedy_request({1}, 1);
  r.sampling.top_p = 0;
  expect_invalid(r, "top_p");
  r = greedy_request({1}, 1);
  r.sampling.top_logprobs = 21;
  expect_invalid(r, "top_logprobs");
  EXPECT_TRUE(loop.submit(greedy_request(prompt_of(70, 1), 10)).ok());
}

TEST(EngineLoop, PreemptionRecomputesExactly) {
  FakeEngine eng;
  LoopConfig cfg;
  cfg.max_batch_tokens = 256;
  cfg.max_running = 8;
  cfg.kv_memory_bytes = 4 * 1000 + 10 * 4 * 60;  // four sequences of ~60 tokens; they grow to 100
  EngineLoop loop(&eng, cfg);
  std::vector<GenerationRequest> reqs;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 6; ++i) {
    reqs.push_back(greedy_request(prompt_of(30 + i, 10 + i), 70));
    streams.push_back(*loop.submit(reqs.back()));
  }
  ASSERT_TRUE(loop.start().ok());
  for (int i = 0; i < 6; ++i) {
    Collected c = drain(*streams[i]);
    EXPECT_EQ(c.tokens, reference(reqs[i].prompt, 70, reqs[i].sampling, 64)) << "request " << i;
  }
  loop.stop(1000ms);
  EXPECT_GT(loop.stats().preemptions, 0);
  EXPECT_EQ(eng.live_sequences(), 0);
}

}  // namespace
}  // namespace ds41::engine
