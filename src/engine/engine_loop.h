// ds41 engine: EngineLoop — the one thread that drives an Engine. Clients (the server's handler
// threads, `ds41 chat`, the bench) submit GenerationRequests into a bounded queue and read
// TokenEvents from their RequestStream; the loop runs Scheduler::plan() -> Engine::step() ->
// Sampler per step, and never waits on a client (a slow reader only grows its own event buffer;
// a cancelled stream's sequence is freed at the next step).
//
// Contract with the server:
//   - submit() validates what only the engine knows (prompt + max_tokens within max_context,
//     token ids within the vocabulary, state larger than the whole --kv-memory) and returns
//     kInvalidArgument with the numbers; a full queue returns kResourceExhausted (HTTP 429/503).
//   - events arrive in order; exactly one final event (finish != kNone) ends every stream.
//   - cancel() (client gone, stop string matched on the consumer side) is idempotent and thread-safe.
//   - stop(timeout): stops accepting, lets running requests finish until timeout, aborts the rest.
//
// Prefix cache (LoopConfig::prefix_cache, prefix_cache.h): at admission a request restores the
// longest cached prefix of its tokens (all but the last) and prefills only the rest; or, when
// another running request is computing the same prefix blocks, it is parked until that producer
// reaches the shared boundary (the producer stops a chunk there and publishes a snapshot). After
// each step the full blocks a sequence completed are published; SWA snapshots are published at
// the prompt's last-but-one position (a chunk stops there, so a repeat of the prompt restores
// everything but the token whose logits it needs) and at the end of the output. A preempted
// sequence keeps its blocks pinned and its snapshot, and resumes by an exact restore. Blocks
// found only in the persistent tier are read off the loop thread (PrefixCache::start_bring_up):
// the request is parked (in `running`, no tokens planned) until its reads are back (a read may be
// shared by the requests needing the same blocks), drained at the start of a step; a loop with
// nothing else to do sleeps until a read, a submit or stop wakes it.
//
// Images (MODEL_SPEC 3.11): a request's span rows come from the vision-feature cache or, for the
// misses, from the ImageEncoder worker (LoopConfig::image_encoder_jobs), which runs
// Engine::encode_images concurrently with this loop's step() calls (engine.h "Thread model"). The
// request is parked like one waiting for a read until its job is back (the encoder wakes a
// sleeping loop); an encode error ends only that request ("image encoding failed: ..."); a
// cancelled or aborted request cancels its job (a queued job is skipped, a running one's rows are
// dropped). stop() stops the encoder after the loop thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/image_encoder.h"
#include "engine/request.h"
#include "engine/vision_feature_cache.h"

namespace ds41::engine {
class PrefixCache;
}

namespace ds41::engine {

struct LoopConfig {
  int64_t max_batch_tokens = 2048;             // tokens per step (prefill chunks + decodes)
  int64_t max_running = 64;                    // sequences in flight
  int64_t kv_memory_bytes = int64_t{8} << 30;  // state capacity for admission
  int64_t max_queue = 1024;                    // waiting requests before submit() refuses
  bool decode_first = true;                    // decodes before prefill chunks in a step
  uint64_t seed = 0;                           // seed source for requests without a seed
  // Samples the rows of a step in parallel (penalties, draw, logprobs of each row are independent:
  // every request owns its sampler and penalty state). Null: on the loop thread. Not owned; the
  // CPU engine's pool is idle between forwards, so the CLI passes it.
  ThreadPool* sample_pool = nullptr;
  // Host memory for the vision-feature cache (image span embeddings by image hash; 0 = off).
  int64_t vision_cache_bytes = int64_t{256} << 20;
  // Image encoding off the loop thread (image_encoder.h): the images of a request that miss the
  // feature cache go to the encoder worker, the request stays parked (no tokens planned) while the
  // loop steps the others, and its prefill starts once its span rows are back. At most this many
  // encoder jobs queued or running; a request finding the encoder full stays parked and submits
  // again at the next step (backpressure). 0: Engine::encode_images on the loop thread right
  // before the request's first prefill chunk (every other request waits for the tower).
  int64_t image_encoder_jobs = 8;
  // Prefix cache (issue 13; not owned, must outlive the loop): null serves without one.
  PrefixCache* prefix_cache = nullptr;
  // MODEL_SPEC 4.4 decoder SWA bounded replay for cold prompts (--prefill-mode decoder-replay):
  // the prompt but its last token runs through Engine::prefill_decoder_replay in one call (not
  // chunked), the last token in the batch. An approximation; off by default.
  bool decoder_replay_prefill = false;
  // DSpark speculative decoding (MODEL_SPEC 3.10) for decode steps of greedy requests without
  // penalties or logprobs, through Engine::speculative_step (when the engine offers it). Greedy
  // outputs are unchanged; sampled requests decode plainly (their sampler's stream stays the same).
  bool speculative = false;
  // MODEL_SPEC 3.10.9 confidence scheduling: candidates verified per engine step over all the
  // step's speculative sequences (SpecBatchOptions::verify_budget; serve
  // --speculative-token-budget). -1: no budget (every sequence verifies its whole block).
  int64_t speculative_token_budget = -1;
};

// The consumer side of one request. Thread-safe.
class RequestStream {
 public:
  // Moves the events available now into *out (appending); waits up to `timeout` for the first.
  // Returns false once the final event has been delivered and nothing remains.
  bool next(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout);
  void cancel();
  bool cancelled() const;
  // Optional: called (from the loop thread, must not block) whenever events are added.
  void set_notify(std::function<void()> fn);

  // --- loop side ---
  void push(TokenEvent ev);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  bool finished_ = false, delivered_final_ = false, cancelled_ = false;
  std::function<void()> notify_;
};

struct LoopStats {
  int64_t running = 0, waiting = 0;
  int64_t kv_used_bytes = 0, kv_capacity_bytes = 0;
  int64_t steps = 0, preemptions = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  // Images (MODEL_SPEC 3.11): encoded by the tower, and the feature cache's counters.
  int64_t images_encoded = 0, image_tokens = 0;
  int64_t vision_cache_hits = 0, vision_cache_misses = 0, vision_cache_entries = 0, vision_cache_bytes = 0;
  // The image encoder: jobs queued / running now, seconds spent encoding, submits refused because
  // it was full (the request waited a step).
  int64_t image_encoder_queued = 0, image_encoder_running = 0, image_encoder_rejected = 0;
  double image_encoder_busy_seconds = 0;
  int64_t prefill_tokens_computed = 0;  // prompt positions run through the model (not restored)
  int64_t cached_tokens = 0;            // prompt positions restored from the prefix cache
  // Speculative steps: spec_accepted[a] = steps that accepted a candidates (a = 0..block).
  int64_t spec_steps = 0;
  std::vector<int64_t> spec_accepted;
  // Candidates verified by those steps, and candidates the batch token budget took off the
  // sequences' blocks (LoopConfig::speculative_token_budget).
  int64_t spec_verified = 0, spec_budget_cut = 0;
};

class EngineLoop {
 public:
  EngineLoop(Engine* engine, LoopConfig cfg, Clock* clock = &SystemClock::instance());
  ~EngineLoop();  // stop(0)
  Status start();
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest req);
  void stop(std::chrono::milliseconds drain_timeout);
  LoopStats stats() const;
  // Per-step observations for metrics (batch size, tokens, step seconds): set before start().
  std::function<void(int64_t seqs, int64_t tokens, double seconds)> on_step;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds41::engine
