// Helpers of the engine-loop tests that drive whole requests (prefix cache, images, disk
// bring-up): random prompts of token ids, greedy requests, and a stream collected to its end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <memory>
#include <vector>

#include "engine/engine_loop.h"

namespace ds41::engine::looptest {

// BOS then n - 1 ids drawn uniformly from [3, max_id] (the tiny vocabulary is 2048).
inline std::vector<int32_t> random_prompt(int64_t n, uint32_t seed, int32_t max_id = 2047) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, max_id);
  std::vector<int32_t> v{0};
  while (static_cast<int64_t>(v.size()) < n) v.push_back(d(rng));
  return v;
}

// As random_prompt, with spans of 6 earlier ids repeated now and then (Engram n-grams recur).
inline std::vector<int32_t> random_prompt_with_repeats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, 2047);
  std::vector<int32_t> v{0};
  while (static_cast<int64_t>(v.size()) < n) {
    if (v.size() > 20 && rng() % 5 == 0) {
      size_t b = rng() % (v.size() - 10);
      for (size_t i = 0; i < 6 && static_cast<int64_t>(v.size()) < n; ++i) v.push_back(v[b + i]);
    } else {
      v.push_back(d(rng));
    }
  }
  return v;
}

// Greedy, ignore_eos: exactly max_tokens tokens, comparable token for token.
inline GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.ignore_eos = true;
  return r;
}

struct Outcome {
  std::vector<int32_t> tokens;
  TokenEvent last;  // the final event (finish reason, usage)
};

// Every event until the stream ends (each wait up to 20 s).
inline Outcome collect(RequestStream& s) {
  Outcome o;
  std::vector<TokenEvent> evs;
  while (s.next(&evs, std::chrono::milliseconds(20000))) {
    for (auto& e : evs) {
      if (e.token >= 0) o.tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) o.last = e;
    }
    evs.clear();
  }
  return o;
}

// Submits the requests together to a fresh loop over `engine` (lc as given), starts it, collects
// every stream to its end and stops it; *stats gets the loop's counters when given.
inline std::vector<Outcome> run_requests(Engine& engine, const LoopConfig& lc, std::vector<GenerationRequest> reqs,
                                         LoopStats* stats = nullptr) {
  EngineLoop loop(&engine, lc);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (auto& r : reqs) {
    auto s = loop.submit(std::move(r));
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (s.ok()) streams.push_back(*s);
  }
  EXPECT_TRUE(loop.start().ok());
  std::vector<Outcome> out;
  for (auto& s : streams) out.push_back(collect(*s));
  if (stats) *stats = loop.stats();
  loop.stop(std::chrono::milliseconds(1000));
  return out;
}

}  // namespace ds41::engine::looptest
