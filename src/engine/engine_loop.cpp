// ds41 engine: EngineLoop and RequestStream (engine_loop.h). One thread owns the waiting queue,
// the running set and the Engine; clients touch only the bounded `incoming_` queue (under mu_)
// and their RequestStream. Per step: take new requests, drop cancelled ones (their sequences are
// freed), plan_step(), preempt / admit, Engine::step(), then per returned row penalties ->
// sample_token() -> logprobs -> TokenEvent, finishing on EOS / stop ids / max_tokens / context end.
#include "engine/engine_loop.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "engine/cache_key_input.h"
#include "engine/logits_processing.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

namespace ds41::engine {

// ---------------------------------------------------------------- RequestStream

bool RequestStream::next(std::vector<TokenEvent>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (delivered_final_ && events_.empty()) return false;
  cv_.wait_for(lk, timeout, [&] { return !events_.empty(); });
  while (!events_.empty()) {
    if (events_.front().finish != FinishReason::kNone) delivered_final_ = true;
    out->push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return true;
}

void RequestStream::cancel() {
  std::lock_guard<std::mutex> lk(mu_);
  cancelled_ = true;
}

bool RequestStream::cancelled() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cancelled_;
}

void RequestStream::set_notify(std::function<void()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  notify_ = std::move(fn);
}

void RequestStream::push(TokenEvent ev) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_) return;  // exactly one final event
    finished_ = ev.finish != FinishReason::kNone;
    events_.push_back(std::move(ev));
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

// ---------------------------------------------------------------- EngineLoop

namespace {

struct Req {
  int64_t id = 0;
  GenerationRequest req;
  std::shared_ptr<RequestStream> stream;
  std::optional<Sampler> sampler;  // the request's own RNG stream (seeded at submit)
  PenaltyState penalties;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t generated = 0;
  int64_t prefill_target = 0;  // prefill up to here before decoding (all tokens after a preemption)
  int64_t computed = 0;        // tokens in the engine state
  SeqId seq = -1;
  // Image spans (MODEL_SPEC 3.11): one flag per token (grown with zeros as tokens are appended),
  // the span rows of the flagged prompt positions once encoded, and how many rows precede each
  // prompt position.
  std::vector<uint8_t> span_flags;
  std::vector<float> span_embeds;
  std::vector<int64_t> rows_before;  // [prompt + 1]
  bool images_ready = false;
  // Per image its span rows once found in the feature cache or encoded (sized at the first look).
  std::vector<SpanEmbeds> image_rows;
  std::shared_ptr<EncodeTicket> encoding;  // the encoder's job for the cache misses, in flight
  std::vector<size_t> encoding_index;      // the images of that job
  bool encode_blocked = false;             // the encoder was full: submit again at the next step
  // Prefix cache.
  std::vector<kvcache::ImageSpanKey> image_keys;  // the images' key spans (cache_key_input.h)
  bool cacheable = true;                          // false: an image has no content hash
  CacheSession cache;
  bool restored_once = false;  // usage reports the first admission's restore
  int64_t snap_at = -1;        // publish an SWA snapshot when computed reaches this (P - 1)
};

Status validate_sampling(const SamplingParams& p) {
  auto bad = [](const std::string& f, double v, const std::string& want) {
    return invalid_argument(f + " is " + std::to_string(v) + "; it must be " + want);
  };
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    return bad("temperature", p.temperature, ">= 0");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", p.top_p, "in (0, 1]");
  if (p.top_k < 0) return bad("top_k", static_cast<double>(p.top_k), ">= 0");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", p.min_p, "in [0, 1]");
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    return bad("presence_penalty", p.presence_penalty, "in [-2, 2]");
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    return bad("frequency_penalty", p.frequency_penalty, "in [-2, 2]");
  if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
    return bad("repetition_penalty", p.repetition_penalty, "> 0");
  if (p.top_logprobs < -1 || p.top_logprobs > kMaxTopLogprobs)
    return bad("top_logprobs", p.top_logprobs,
               "in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1: off)");
  return ok_status();
}

}  // namespace

struct EngineLoop::Impl {
  Impl(EngineLoop* o, Engine* e, LoopConfig c, Clock* k)
      : owner(o), engine(e), cfg(c), clock(k), seed_source(c.seed) {
    sc.max_batch_tokens = cfg.max_batch_tokens;
    sc.max_running = cfg.max_running;
    sc.kv_memory_bytes = cfg.kv_memory_bytes;
    sc.decode_first = cfg.decode_first;
    sc.bytes_for_tokens = [e](int64_t n) { return e->bytes_for_tokens(n); };
  }

  EngineLoop* owner;
  Engine* engine;
  const LoopConfig cfg;
  Clock* clock;
  SchedulerConfig sc;

  // Guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Req>> incoming;
  bool started = false, stopping = false;
  bool bring_up_ready = false;  // the prefix cache finished an async read (its listener sets this)
  bool encode_ready = false;    // the image encoder ended a job (its listener sets this)
  int64_t deadline_ns = 0;
  LoopStats stats;
  std::mt19937_64 seed_source;
  int64_t next_id = 1;

  std::mutex join_mu;  // serializes stop()'s join
  std::thread thread;

  // Loop thread only.
  std::deque<std::unique_ptr<Req>> waiting;
  std::vector<std::unique_ptr<Req>> running;  // admission order
  std::vector<float> scratch;
  // The step's outputs, kept across steps: its logits rows (33 MB at batch 64 with the released
  // vocabulary) reuse the same pages instead of faulting in fresh ones every step.
  StepOutput step_out;
  VisionFeatureCache vision_cache{cfg.vision_cache_bytes};
  // Null with image_encoder_jobs 0 (encode on this thread). Its worker starts on the first job.
  std::unique_ptr<ImageEncoder> encoder;

  void run();
  // Span rows of r's images (sets images_ready once all are there): the feature cache, else the
  // misses go to the encoder as one job (r is parked until poll_encodes() takes it back) or, without
  // an encoder, to Engine::encode_images on this thread. Errors end the request.
  Status start_images(Req& r);
  // Rows of the images `which` of r from one encode (into the feature cache).
  Status store_rows(Req& r, const std::vector<size_t>& which, std::vector<std::vector<float>> enc);
  // span_embeds / rows_before from image_rows; sets images_ready.
  Status assemble_images(Req& r);
  // Start of a step: requests whose encoder job ended take its rows (or end with its error);
  // running requests that found the encoder full submit again.
  void poll_encodes();
  static bool encode_parked(const Req& r) { return r.encoding != nullptr || r.encode_blocked; }
  void step_once();
  // Prefix cache: restore at admission (recreates the sequence if a failed restore left it
  // partly filled); unparks requests whose producer reached the shared boundary or is gone.
  void restore(Req& r);
  // At admission / when a shared-prefix wait ends: restore now, or park the request (it stays in
  // `running`, no tokens planned) while the prefix cache reads its blocks found only in the
  // persistent tier off this thread; unpark_ready() restores it when the read is back.
  void restore_or_park(Req& r);
  static bool parked(const Req& r) {
    return r.cache.wait_boundary > 0 || r.cache.reading() || encode_parked(r);
  }
  // The prefix cache for this request (none for a request with an image without a content hash),
  // and the key input of its first n tokens (ids + image spans: prefix_cache.h "Prompts with
  // images").
  PrefixCache* cache_for(const Req& r) const { return r.cacheable ? cfg.prefix_cache : nullptr; }
  static CacheKeyInput key_input(const Req& r, int64_t n) {
    return CacheKeyInput(std::span<const int32_t>(r.tokens).first(static_cast<size_t>(n)), r.image_keys);
  }
  static CacheKeyInput key_input(const Req& r) { return key_input(r, static_cast<int64_t>(r.tokens.size())); }
  // Another request waits for an SWA snapshot of r at a length in (computed, computed + n]: a
  // speculative step could pass it, so r decodes plainly until it is published.
  bool wants_boundary_within(const Req& r, int64_t n) const {
    const PrefixCache* pc = cache_for(r);
    if (pc == nullptr) return false;
    const int64_t wb = pc->next_wanted_boundary(r.id, r.computed);
    return wb > r.computed && wb <= r.computed + n;
  }
  void unpark_ready();
  // Whether r ends after appending `tok` (already in r.tokens and counted in r.generated): EOS
  // (unless ignore_eos) or a stop id, else max_tokens or the context.
  FinishReason finish_after(const Req& r, int32_t tok) const {
    const auto& stops = r.req.stop_token_ids;
    if ((!r.req.ignore_eos && tok == engine->info().eos_token_id) ||
        std::find(stops.begin(), stops.end(), tok) != stops.end())
      return FinishReason::kStop;
    if (r.generated >= r.req.max_tokens || static_cast<int64_t>(r.tokens.size()) >= engine->info().max_context)
      return FinishReason::kLength;
    return FinishReason::kNone;
  }
  void finish(Req& r, FinishReason why, const std::string& error, int32_t token = -1, float lp = 0,
              std::vector<TopLogprob> top = {});
  void drop_cancelled();
  void abort_all(const std::string& why);
  void publish_stats();
};

void EngineLoop::Impl::finish(Req& r, FinishReason why, const std::string& error, int32_t token, float lp,
                              std::vector<TopLogprob> top) {
  if (r.seq >= 0) {
    (void)engine->free_sequence(r.seq);  // a sequence the loop created; freeing cannot fail
    r.seq = -1;
  }
  if (r.encoding) {  // the encoder skips the job, or drops its rows; it keeps the images alive
    r.encoding->cancel();
    r.encoding.reset();
  }
  r.encode_blocked = false;
  TokenEvent ev;
  ev.token = token;
  ev.logprob = lp;
  ev.top = std::move(top);
  ev.finish = why;
  ev.error = error;
  ev.prompt_tokens = static_cast<int64_t>(r.req.prompt.size());
  if (cache_for(r)) {
    cfg.prefix_cache->release(r.cache);
    const RestoreResult& rr = r.cache.restored;
    ev.cached_tokens = rr.tokens;
    ev.cache.enabled = true;
    ev.cache.engine_tokens = rr.engine_tokens;
    ev.cache.dram_tokens = rr.dram_tokens;
    ev.cache.disk_tokens = rr.disk_tokens;
    ev.cache.snapshot_tokens = rr.snapshot_tokens;
    ev.cache.swa = swa_outcome_name(rr.swa);
  }
  r.stream->push(std::move(ev));
}

void EngineLoop::Impl::drop_cancelled() {
  auto drop = [&](auto& q) {
    for (auto it = q.begin(); it != q.end();) {
      if ((*it)->stream->cancelled()) {
        finish(**it, FinishReason::kAbort, "");
        it = q.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop(waiting);
  drop(running);
}

void EngineLoop::Impl::abort_all(const std::string& why) {
  for (auto& r : running) finish(*r, FinishReason::kAbort, why);
  for (auto& r : waiting) finish(*r, FinishReason::kAbort, why);
  running.clear();
  waiting.clear();
  std::deque<std::unique_ptr<Req>> rest;
  {
    std::lock_guard<std::mutex> lk(mu);
    rest.swap(incoming);
  }
  for (auto& r : rest) finish(*r, FinishReason::kAbort, why);
}

Status EngineLoop::Impl::start_images(Req& r) {
  if (r.images_ready || r.encoding || r.req.images.empty()) return ok_status();
  const auto& imgs = r.req.images;
  if (r.image_rows.size() != imgs.size()) {  // the first look: the feature cache
    r.image_rows.assign(imgs.size(), nullptr);
    for (size_t i = 0; i < imgs.size(); ++i)
      if (cfg.vision_cache_bytes > 0 && !imgs[i].cache_key.empty())
        r.image_rows[i] = vision_cache.find(imgs[i].cache_key);
  }
  std::vector<size_t> todo;
  std::vector<std::shared_ptr<const image::PreparedImage>> prepared;
  for (size_t i = 0; i < imgs.size(); ++i) {
    if (r.image_rows[i]) continue;
    if (!imgs[i].prepared)
      return failed_precondition("image " + std::to_string(i) + " is neither in the vision-feature cache nor given");
    todo.push_back(i);
    prepared.push_back(imgs[i].prepared);
  }
  if (todo.empty()) return assemble_images(r);
  if (!encoder) {  // on this thread: every other request waits for the tower
    std::vector<const image::PreparedImage*> ptrs;
    for (const auto& p : prepared) ptrs.push_back(p.get());
    DS41_ASSIGN_OR_RETURN(auto enc, engine->encode_images(ptrs));
    DS41_RETURN_IF_ERROR(store_rows(r, todo, std::move(enc)));
    return assemble_images(r);
  }
  auto t = encoder->submit(std::move(prepared));
  if (!t.ok()) {
    if (t.status().code() != StatusCode::kResourceExhausted) return t.status();
    r.encode_blocked = true;  // parked; poll_encodes() submits again
    return ok_status();
  }
  r.encode_blocked = false;
  r.encoding = std::move(t).value();
  r.encoding_index = std::move(todo);
  return ok_status();
}

Status EngineLoop::Impl::store_rows(Req& r, const std::vector<size_t>& which,
                                    std::vector<std::vector<float>> enc) {
  if (enc.size() != which.size())
    return internal_error("the engine encoded " + std::to_string(enc.size()) + " of " +
                          std::to_string(which.size()) + " images");
  const auto& imgs = r.req.images;
  for (size_t j = 0; j < which.size(); ++j) {
    auto v = std::make_shared<const std::vector<float>>(std::move(enc[j]));
    const size_t i = which[j];
    if (cfg.vision_cache_bytes > 0 && !imgs[i].cache_key.empty()) vision_cache.insert(imgs[i].cache_key, v);
    r.image_rows[i] = std::move(v);
  }
  std::lock_guard<std::mutex> lk(mu);
  stats.images_encoded += static_cast<int64_t>(which.size());
  return ok_status();
}

Status EngineLoop::Impl::assemble_images(Req& r) {
  const auto& imgs = r.req.images;
  const int64_t P = static_cast<int64_t>(r.req.prompt.size());
  int64_t image_tokens = 0;
  r.span_embeds.clear();
  for (size_t i = 0; i < imgs.size(); ++i) {
    const int64_t want = imgs[i].span_length;
    if (!r.image_rows[i] || want <= 0 || r.image_rows[i]->size() % static_cast<size_t>(want) != 0)
      return internal_error("image " + std::to_string(i) + ": span rows do not match its span length");
    r.span_embeds.insert(r.span_embeds.end(), r.image_rows[i]->begin(), r.image_rows[i]->end());
    image_tokens += want;
  }
  r.image_rows.clear();  // span_embeds holds them now
  r.rows_before.assign(P + 1, 0);
  for (int64_t t = 0; t < P; ++t) r.rows_before[t + 1] = r.rows_before[t] + r.span_flags[t];
  r.images_ready = true;
  std::lock_guard<std::mutex> lk(mu);
  stats.image_tokens += image_tokens;
  return ok_status();
}

void EngineLoop::Impl::poll_encodes() {
  if (!encoder) return;
  auto poll = [&](auto& q, bool resubmit) {
    for (auto it = q.begin(); it != q.end();) {
      Req& r = **it;
      Status st = ok_status();
      if (r.encoding && r.encoding->done()) {
        std::shared_ptr<EncodeTicket> t = std::move(r.encoding);
        r.encoding.reset();
        auto enc = t->take();
        st = enc.ok() ? store_rows(r, r.encoding_index, std::move(enc).value()) : enc.status();
        if (st.ok()) st = assemble_images(r);
      } else if (resubmit && r.encode_blocked) {
        st = start_images(r);
      }
      if (!st.ok()) {
        finish(r, FinishReason::kError, "image encoding failed: " + st.message());
        it = q.erase(it);
      } else {
        ++it;
      }
    }
  };
  poll(running, true);
  poll(waiting, false);  // preempted while encoding: the rows wait for the readmission
}

void EngineLoop::Impl::publish_stats() {
  int64_t used = 0;
  for (const auto& r : running) {
    auto b = engine->sequence_bytes(r->seq);
    if (b.ok()) used += *b;
  }
  std::lock_guard<std::mutex> lk(mu);
  stats.running = static_cast<int64_t>(running.size());
  stats.waiting = static_cast<int64_t>(waiting.size());
  stats.kv_used_bytes = used;
  stats.kv_capacity_bytes = cfg.kv_memory_bytes;
  if (encoder) {
    const ImageEncoderStats es = encoder->stats();
    stats.image_encoder_queued = es.queued;
    stats.image_encoder_running = es.running;
    stats.image_encoder_rejected = es.rejected;
    stats.image_encoder_busy_seconds = static_cast<double>(es.busy_ns) * 1e-9;
  }
  const VisionCacheStats vc = vision_cache.stats();
  stats.vision_cache_hits = vc.hits;
  stats.vision_cache_misses = vc.misses;
  stats.vision_cache_entries = vc.entries;
  stats.vision_cache_bytes = vc.bytes;
}

void EngineLoop::Impl::run() {
  if (cfg.prefix_cache) {
    cfg.prefix_cache->set_bring_up_listener([this] {
      {
        std::lock_guard<std::mutex> lk(mu);
        bring_up_ready = true;
      }
      cv.notify_all();
    });
  }
  if (encoder) {
    encoder->set_listener([this] {
      {
        std::lock_guard<std::mutex> lk(mu);
        encode_ready = true;
      }
      cv.notify_all();
    });
  }
  int64_t steps_seen = 0;
  // A running request waits for an async read of its cached blocks, or for its images.
  bool reads_parked = false;
  for (;;) {
    bool stop_now = false, drained = false;
    {
      std::unique_lock<std::mutex> lk(mu);
      if (incoming.empty() && waiting.empty() && running.empty() && !stopping) {
        cv.wait(lk, [&] { return !incoming.empty() || stopping; });
      } else if (reads_parked && stats.steps == steps_seen) {
        // Nothing ran last time and requests wait for their reads: sleep until a read is back or
        // a request arrives, instead of spinning. Bounded, to notice cancelled streams (they do
        // not wake the loop) and, when stopping, the drain deadline on the injectable clock.
        cv.wait_for(lk, stopping ? std::chrono::milliseconds(5) : std::chrono::milliseconds(20), [&] {
          return !incoming.empty() || bring_up_ready || encode_ready ||
                 (stopping && clock->now_mono_ns() >= deadline_ns);
        });
      }
      bring_up_ready = false;
      encode_ready = false;
      steps_seen = stats.steps;
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
      stats.waiting = static_cast<int64_t>(waiting.size());  // submit()'s queue bound stays exact
      stop_now = stopping && clock->now_mono_ns() >= deadline_ns;
      drained = stopping && waiting.empty() && running.empty();
    }
    if (drained) break;
    if (stop_now) {
      abort_all("the engine loop stopped before the request finished");
      break;
    }
    drop_cancelled();
    if (!waiting.empty() || !running.empty()) step_once();
    publish_stats();
    reads_parked = std::any_of(running.begin(), running.end(),
                               [](const auto& r) { return r->cache.reading() || encode_parked(*r); });
  }
  publish_stats();
  if (cfg.prefix_cache) cfg.prefix_cache->set_bring_up_listener({});
}

void EngineLoop::Impl::restore(Req& r) {
  PrefixCache* pc = cache_for(r);
  const int64_t size = static_cast<int64_t>(r.tokens.size());
  RestoreResult rr = pc->restore(*engine, r.seq, key_input(r), size - 1, r.prefill_target, r.cache);
  if (rr.tokens == 0) {
    auto pos = engine->sequence_position(r.seq);
    if (pos.ok() && *pos != 0) {  // a failed restore left part of an import: start fresh
      (void)engine->free_sequence(r.seq);
      auto seq = engine->create_sequence();
      r.seq = seq.ok() ? *seq : -1;
    }
  }
  r.computed = rr.tokens;
  if (r.snap_at >= 0 && r.computed >= r.snap_at) r.snap_at = -1;  // restored from that very snapshot
  if (!r.restored_once) {
    r.cache.restored = rr;
    r.restored_once = true;
    std::lock_guard<std::mutex> lk(mu);
    stats.cached_tokens += rr.tokens;
  }
}

void EngineLoop::Impl::restore_or_park(Req& r) {
  const int64_t size = static_cast<int64_t>(r.tokens.size());
  if (cache_for(r)->start_bring_up(*engine, key_input(r), size - 1, r.cache)) return;
  restore(r);
}

void EngineLoop::Impl::unpark_ready() {
  PrefixCache* pc = cfg.prefix_cache;
  if (!pc) return;
  // Async reads that are back: their blocks are in the DRAM tier; each goes to every request
  // waiting for it (a read may be shared), and a request with all its reads back restores.
  std::vector<Req*> ready;
  for (const BlockRead& rd : pc->take_bring_ups())
    for (auto& r : running)
      if (r->cache.reading() && pc->accept_bring_up(rd, r->cache)) ready.push_back(r.get());
  for (auto& rp : running) {  // in admission order
    Req* r = rp.get();
    if (std::find(ready.begin(), ready.end(), r) == ready.end()) continue;
    restore(*r);
    if (r->seq < 0) finish(*r, FinishReason::kError, "could not recreate the sequence after a failed restore");
  }
  for (auto& r : running) {
    if (r->cache.wait_boundary == 0) continue;
    const Req* producer = nullptr;
    for (const auto& p : running)
      if (p->id == r->cache.wait_producer) producer = p.get();
    const bool waiting_on =
        producer && producer->computed < r->cache.wait_boundary && pc->producer_active(producer->id);
    if (waiting_on) continue;
    r->cache.wait_boundary = 0;
    r->cache.wait_producer = -1;
    restore_or_park(*r);
    if (r->seq < 0)
      finish(*r, FinishReason::kError, "could not recreate the sequence after a failed restore");
  }
  std::erase_if(running, [](const auto& r) { return r->seq < 0; });
}

void EngineLoop::Impl::step_once() {
  unpark_ready();
  poll_encodes();
  std::vector<WaitingEntry> w;
  w.reserve(waiting.size());
  for (const auto& r : waiting) w.push_back({r->id, static_cast<int64_t>(r->tokens.size())});
  std::vector<RunningEntry> rn;
  rn.reserve(running.size());
  // A parked request (waiting for a shared prefix or an async read) is counted at its whole
  // prefill target and looks like a decoding sequence to the planner; its planned token is skipped.
  for (const auto& r : running)
    rn.push_back({r->id, r->prefill_target, parked(*r) ? r->prefill_target : r->computed});
  const StepPlan plan = plan_step(sc, w, rn);

  // Preempt (newest first): drop the state; back to the waiting front with every token so far as
  // its prompt, so the recompute is exact.
  for (int64_t id : plan.preempt) {
    auto it = std::find_if(running.begin(), running.end(), [&](const auto& r) { return r->id == id; });
    DS41_CHECK(it != running.end(), "preempted id is not running");
    if (cache_for(**it)) {
      Req& pr = **it;
      if (pr.computed > 0 && pr.cache.wait_boundary == 0)
        cfg.prefix_cache->preempt(*engine, pr.seq, key_input(pr), pr.computed, pr.cache);
      cfg.prefix_cache->cancel_bring_up(pr.cache);  // parked on a read: read again when readmitted
      pr.cache.wait_boundary = 0;
      pr.cache.wait_producer = -1;
    }
    (void)engine->free_sequence((*it)->seq);
    (*it)->seq = -1;
    (*it)->computed = 0;
    (*it)->prefill_target = static_cast<int64_t>((*it)->tokens.size());
    waiting.push_front(std::move(*it));
    running.erase(it);
    std::lock_guard<std::mutex> lk(mu);
    ++stats.preemptions;
  }
  for (int64_t id : plan.admit) {
    DS41_CHECK(!waiting.empty() && waiting.front()->id == id, "admission is not FCFS head of line");
    std::unique_ptr<Req> r = std::move(waiting.front());
    waiting.pop_front();
    auto seq = engine->create_sequence();
    if (!seq.ok()) {
      finish(*r, FinishReason::kError, seq.status().message());
      continue;
    }
    r->seq = *seq;
    r->computed = 0;
    if (PrefixCache* pc = cache_for(*r)) {
      std::pair<int64_t, int64_t> wait{0, -1};
      if (r->cache.resume_snapshot.empty())
        wait = pc->shared_prefix_wait(key_input(*r), static_cast<int64_t>(r->tokens.size()) - 1, r->id);
      if (wait.first > 0) {
        pc->reset_for_admission(r->cache);
        r->cache.wait_boundary = wait.first;
        r->cache.wait_producer = wait.second;
        pc->want_boundary(wait.second, wait.first);
      } else {
        restore_or_park(*r);
        if (r->seq < 0) {
          finish(*r, FinishReason::kError, "could not recreate the sequence after a failed restore");
          continue;
        }
      }
    }
    running.push_back(std::move(r));
  }
  if (plan.items.empty()) {
    // Cannot happen while submit() refuses what never fits; fail the head rather than spin.
    if (running.empty() && !waiting.empty()) {
      finish(*waiting.front(), FinishReason::kError, "the request cannot be scheduled");
      waiting.pop_front();
    }
    return;
  }

  std::unordered_map<int64_t, Req*> by_id;
  for (auto& r : running) by_id[r->id] = r.get();
  std::vector<StepItem> items;
  std::vector<Req*> reqs;
  for (const PlanItem& p : plan.items) {
    auto it = by_id.find(p.id);
    if (it == by_id.end()) continue;  // admission failed above
    Req* r = it->second;
    if (parked(*r)) continue;  // its producer computes the shared prefix, or its blocks are being read
    const int64_t size = static_cast<int64_t>(r->tokens.size());
    // A restore at admission may have covered part of the planned chunk.
    int64_t n = std::min(p.tokens, size - r->computed);
    if (n <= 0) continue;
    // The span rows are needed while an image position is left to compute (a prefix-cache
    // restore may have covered every image: then the tower does not run).
    if (!r->req.images.empty() &&
        r->computed < r->req.images.back().span_start + r->req.images.back().span_length) {
      if (Status is = start_images(*r); !is.ok()) {
        finish(*r, FinishReason::kError, "image encoding failed: " + is.message());
        std::erase_if(running, [&](const auto& q) { return q.get() == r; });
        continue;
      }
      if (!r->images_ready) continue;  // parked from the next step on: its job is in the encoder
    }
    if (cfg.decoder_replay_prefill && r->req.images.empty() && r->computed == 0 && size >= 2 &&
        r->generated == 0 && !r->cache.approximate && r->prefill_target == size) {
      // MODEL_SPEC 4.4: all but the last prompt token in one decoder-replay prefill.
      Status st = engine->prefill_decoder_replay(r->seq, std::span<const int32_t>(r->tokens).first(size - 1));
      if (!st.ok()) {
        finish(*r, FinishReason::kError, st.message());
        std::erase_if(running, [&](const auto& q) { return q.get() == r; });
        by_id.erase(p.id);
        continue;
      }
      r->computed = size - 1;
      r->cache.approximate = true;
      {
        std::lock_guard<std::mutex> lk(mu);
        stats.prefill_tokens_computed += size - 1;
      }
      if (PrefixCache* pc = cache_for(*r)) {
        pc->publish_blocks(*engine, r->seq, key_input(*r), r->computed, r->cache);
        if (r->snap_at == r->computed) {
          pc->publish_snapshot(*engine, r->seq, key_input(*r, r->computed), r->cache);
          r->snap_at = -1;
        }
      }
      n = 1;
    }
    if (PrefixCache* pc = cache_for(*r)) {
      // Stop the chunk where a snapshot is due: the prompt's last-but-one position, or a
      // boundary another request waits for.
      if (r->snap_at > r->computed && r->snap_at < r->computed + n) n = r->snap_at - r->computed;
      const int64_t wb = pc->next_wanted_boundary(r->id, r->computed);
      if (wb > 0 && wb < r->computed + n) n = wb - r->computed;
    }
    StepItem s;
    s.seq = r->seq;
    s.tokens = std::span<const int32_t>(r->tokens).subspan(r->computed, n);
    s.want_logits = r->computed + n == size;
    // Drawn greedily from the raw row (the speculative eligibility below, less the length checks):
    // the engine may draw it itself (engine.h StepItem::greedy_only).
    s.greedy_only = s.want_logits && r->req.sampling.temperature == 0 && !r->penalties.active() &&
                    r->req.sampling.top_logprobs < 0;
    if (!r->req.images.empty()) {
      // The flags of this slice, and the span rows of its flagged prompt positions (positions
      // after the prompt, re-prefilled after a preemption, carry no image). After a restore the
      // slice starts at the restored length, possibly inside a span: its rows start at
      // rows_before[computed].
      r->span_flags.resize(r->tokens.size(), 0);
      s.image_span = std::span<const uint8_t>(r->span_flags).subspan(r->computed, n);
      if (r->images_ready) {  // else no image position is left (no row to feed)
        const int64_t P = static_cast<int64_t>(r->req.prompt.size());
        const int64_t b = std::min(r->computed, P), e = std::min(r->computed + n, P);
        const int64_t H =
            r->rows_before[P] > 0 ? static_cast<int64_t>(r->span_embeds.size()) / r->rows_before[P] : 0;
        s.span_embeds = std::span<const float>(r->span_embeds)
                            .subspan(r->rows_before[b] * H, (r->rows_before[e] - r->rows_before[b]) * H);
      }
    }
    items.push_back(s);
    reqs.push_back(r);
  }
  // Decodes of greedy requests go through a speculative step instead (MODEL_SPEC 3.10).
  std::vector<SpecStepItem> spec_items;
  std::vector<Req*> spec_reqs;
  const int64_t spec_block = cfg.speculative ? engine->speculative_block() : 0;
  if (spec_block > 0) {
    size_t keep = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Req* r = reqs[i];
      const bool eligible =
          items[i].tokens.size() == 1 && items[i].want_logits && r->generated >= 1 &&
          r->req.sampling.temperature == 0 && !r->penalties.active() && r->req.sampling.top_logprobs < 0 &&
          static_cast<int64_t>(r->tokens.size()) + spec_block + 1 <= engine->info().max_context &&
          !wants_boundary_within(*r, spec_block + 1);
      if (eligible) {
        SpecStepItem s;
        s.seq = r->seq;
        s.anchor = r->tokens.back();
        spec_items.push_back(s);
        spec_reqs.push_back(r);
      } else {
        items[keep] = items[i];
        reqs[keep] = r;
        ++keep;
      }
    }
    items.resize(keep);
    reqs.resize(keep);
  }
  if (items.empty() && spec_items.empty()) return;
  const int64_t t0 = clock->now_mono_ns();
  StepOutput& out = step_out;
  out.logits.clear();
  out.row.clear();
  out.token.clear();
  Status st = items.empty() ? ok_status() : engine->step(items, &out);
  std::vector<SpecStepResult> spec_out;
  Status spec_st =
      spec_items.empty()
          ? ok_status()
          : engine->speculative_step(spec_items, SpecBatchOptions{cfg.speculative_token_budget}, &spec_out);
  const double seconds = static_cast<double>(clock->now_mono_ns() - t0) * 1e-9;
  std::vector<Req*> done;
  if (!spec_st.ok()) {
    for (Req* r : spec_reqs) {
      finish(*r, FinishReason::kError, spec_st.message());
      done.push_back(r);
    }
  } else if (!spec_items.empty()) {
    int64_t new_gen = 0, verified = 0, budget_cut = 0;
    std::vector<int64_t> hist(spec_block + 1, 0);
    for (size_t i = 0; i < spec_reqs.size(); ++i) {
      Req* r = spec_reqs[i];
      const SpecStepResult& res = spec_out[i];
      ++hist[std::clamp<int64_t>(res.accepted, 0, spec_block)];
      verified += res.verified;
      budget_cut += res.budget_cut;
      r->computed += 1 + res.accepted;  // the anchor and the accepted candidates are in the state
      bool finished = false;
      FinishReason fin_why = FinishReason::kNone;
      for (const int32_t tok : res.tokens) {
        r->tokens.push_back(tok);
        r->penalties.add(tok);
        ++r->generated;
        ++new_gen;
        const FinishReason why = finish_after(*r, tok);
        if (why != FinishReason::kNone) {
          finished = true;
          fin_why = why;
          break;
        }
        TokenEvent ev;
        ev.token = tok;
        r->stream->push(std::move(ev));
      }
      // The prefix cache sees what the state holds. A stop inside the accepted candidates leaves
      // the state past the kept tokens: then nothing is published (it would not match them).
      PrefixCache* pc = cache_for(*r);
      if (pc != nullptr && r->computed <= static_cast<int64_t>(r->tokens.size())) {
        pc->publish_blocks(*engine, r->seq, key_input(*r), r->computed, r->cache);
        if (finished)  // end of the output: the next turn extends it
          pc->publish_snapshot(*engine, r->seq, key_input(*r, r->computed), r->cache);
      }
      if (finished) {
        finish(*r, fin_why, "", r->tokens.back(), 0, {});
        done.push_back(r);
      }
    }
    std::lock_guard<std::mutex> lk(mu);
    stats.generation_tokens += new_gen;
    stats.spec_steps += static_cast<int64_t>(spec_reqs.size());
    stats.spec_verified += verified;
    stats.spec_budget_cut += budget_cut;
    if (stats.spec_accepted.size() < hist.size()) stats.spec_accepted.resize(hist.size(), 0);
    for (size_t a = 0; a < hist.size(); ++a) stats.spec_accepted[a] += hist[a];
  }
  if (!st.ok()) {
    for (Req* r : reqs) {
      finish(*r, FinishReason::kError, st.message());
      done.push_back(r);
    }
  } else {
    const int64_t V = out.vocab;
    int64_t new_prompt = 0, new_gen = 0;
    // Draw every row first (in parallel when a pool is given: each row touches only its own
    // request's sampler and penalty state), then advance the requests in item order.
    struct Drawn {
      Status status;
      int32_t tok = -1;
      float lp = 0;
      std::vector<TopLogprob> top;
    };
    std::vector<Drawn> drawn(items.size());
    // An item's token: drawn by the engine (StepOutput::token, greedy_only items), or from its row.
    const auto engine_token = [&](size_t i) { return i < out.token.size() ? out.token[i] : -1; };
    const auto has_draw = [&](size_t i) { return out.row[i] >= 0 || engine_token(i) != -1; };
    const auto draw_rows = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (const int32_t et = engine_token(static_cast<size_t>(i)); et != -1) {
          if (et == StepOutput::kInvalidRow)  // the sampler's refusal, found on the device
            drawn[i].status = invalid_argument(
                "sampler: the logits row holds NaN or +inf, or every logit is -inf (not valid logits)");
          else
            drawn[i].tok = et;
          continue;
        }
        if (out.row[i] < 0) continue;
        Req* r = reqs[i];
        float* row = out.logits.data() + out.row[i] * V;
        if (r->penalties.active()) r->penalties.apply(row, V);
        Result<int32_t> t = r->sampler->sample(std::span<const float>(row, static_cast<size_t>(V)));
        if (!t.ok()) {
          drawn[i].status = t.status();
          continue;
        }
        drawn[i].tok = *t;
        if (r->req.sampling.top_logprobs >= 0)
          drawn[i].lp = token_logprob(row, V, *t, r->req.sampling.top_logprobs, &drawn[i].top);
      }
    };
    const int64_t n_items = static_cast<int64_t>(items.size());
    if (cfg.sample_pool != nullptr && n_items > 1)
      cfg.sample_pool->parallel_for(n_items, draw_rows);
    else
      draw_rows(0, n_items);
    int64_t prefill_computed = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      Req* r = reqs[i];
      const int64_t n = static_cast<int64_t>(items[i].tokens.size());
      if (r->computed < r->prefill_target) prefill_computed += std::min(n, r->prefill_target - r->computed);
      r->computed += n;
      if (PrefixCache* pc = cache_for(*r)) {
        pc->publish_blocks(*engine, r->seq, key_input(*r), r->computed, r->cache);
        const bool wanted = pc->next_wanted_boundary(r->id, r->computed - 1) == r->computed;
        if (r->computed == r->snap_at || wanted) {
          pc->publish_snapshot(*engine, r->seq, key_input(*r, r->computed), r->cache);
          if (r->computed == r->snap_at) r->snap_at = -1;
        }
      }
      if (!has_draw(i)) continue;
      if (!drawn[i].status.ok()) {  // a NaN/inf row: this request ends with an error, the others go on
        finish(*r, FinishReason::kError, drawn[i].status.message());
        done.push_back(r);
        continue;
      }
      const int32_t tok = drawn[i].tok;
      const float lp = drawn[i].lp;
      std::vector<TopLogprob> top = std::move(drawn[i].top);
      r->tokens.push_back(tok);
      r->penalties.add(tok);
      if (++r->generated == 1) new_prompt += static_cast<int64_t>(r->req.prompt.size());
      ++new_gen;
      const FinishReason why = finish_after(*r, tok);
      if (why != FinishReason::kNone) {
        if (PrefixCache* pc = cache_for(*r))  // end of the output: the next turn extends it
          pc->publish_snapshot(*engine, r->seq, key_input(*r, r->computed), r->cache);
        finish(*r, why, "", tok, lp, std::move(top));
        done.push_back(r);
      } else {
        TokenEvent ev;
        ev.token = tok;
        ev.logprob = lp;
        ev.top = std::move(top);
        r->stream->push(std::move(ev));
      }
    }
    std::lock_guard<std::mutex> lk(mu);
    stats.prompt_tokens += new_prompt;
    stats.generation_tokens += new_gen;
    stats.prefill_tokens_computed += prefill_computed;
  }
  if (!done.empty())
    std::erase_if(running,
                  [&](const auto& r) { return std::find(done.begin(), done.end(), r.get()) != done.end(); });
  {
    std::lock_guard<std::mutex> lk(mu);
    ++stats.steps;
  }
  if (owner->on_step)
    owner->on_step(static_cast<int64_t>(items.size() + spec_items.size()), plan.tokens, seconds);
}

EngineLoop::EngineLoop(Engine* engine, LoopConfig cfg, Clock* clock)
    : impl_(std::make_unique<Impl>(this, engine, cfg, clock)) {
  if (cfg.image_encoder_jobs > 0)
    impl_->encoder = std::make_unique<ImageEncoder>(engine, cfg.image_encoder_jobs, clock);
}

EngineLoop::~EngineLoop() { stop(std::chrono::milliseconds(0)); }

Status EngineLoop::start() {
  DS41_RETURN_IF_ERROR(validate(impl_->sc));
  if (impl_->cfg.max_queue < 1)
    return invalid_argument("max_queue must be >= 1 (got " + std::to_string(impl_->cfg.max_queue) + ")");
  if (impl_->cfg.image_encoder_jobs < 0)
    return invalid_argument("image_encoder_jobs must be >= 0 (got " +
                            std::to_string(impl_->cfg.image_encoder_jobs) + ")");
  if (impl_->cfg.speculative_token_budget < -1)
    return invalid_argument("speculative_token_budget must be >= 0, or -1 for none (got " +
                            std::to_string(impl_->cfg.speculative_token_budget) + ")");
  std::lock_guard<std::mutex> lk(impl_->mu);
  if (impl_->started) return failed_precondition("the engine loop was already started");
  if (impl_->stopping) return failed_precondition("the engine loop was stopped");
  impl_->started = true;
  impl_->thread = std::thread([this] { impl_->run(); });
  return ok_status();
}

Result<std::shared_ptr<RequestStream>> EngineLoop::submit(GenerationRequest req) {
  Impl& m = *impl_;
  const EngineInfo& info = m.engine->info();
  const int64_t P = static_cast<int64_t>(req.prompt.size());
  if (P == 0) return invalid_argument("the prompt has no tokens");
  if (req.max_tokens < 1)
    return invalid_argument("max_tokens is " + std::to_string(req.max_tokens) + "; it must be >= 1");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    if (req.prompt[i] < 0 || req.prompt[i] >= info.vocab_size)
      return invalid_argument("prompt token " + std::to_string(i) + " has id " +
                              std::to_string(req.prompt[i]) + ", outside the vocabulary [0, " +
                              std::to_string(info.vocab_size) + ")");
  if (P + req.max_tokens > info.max_context)
    return invalid_argument("the prompt (" + std::to_string(P) + " tokens) plus max_tokens (" +
                            std::to_string(req.max_tokens) + ") is " + std::to_string(P + req.max_tokens) +
                            " tokens, more than the model's context of " + std::to_string(info.max_context));
  DS41_RETURN_IF_ERROR(check_fits(m.sc, P + req.max_tokens));
  DS41_RETURN_IF_ERROR(validate_sampling(req.sampling));

  auto r = std::make_unique<Req>();
  r->req = std::move(req);
  r->stream = std::make_shared<RequestStream>();
  r->tokens = r->req.prompt;
  r->prefill_target = P;
  if (!r->req.images.empty()) {
    // Spans inside the prompt, disjoint, in order, each all image tokens (MODEL_SPEC 3.11).
    r->span_flags.assign(P, 0);
    int64_t prev_end = 0;
    for (size_t i = 0; i < r->req.images.size(); ++i) {
      const RequestImage& im = r->req.images[i];
      if ((!im.prepared && im.cache_key.empty()) || im.span_length <= 0 || im.span_start < prev_end ||
          im.span_start + im.span_length > P)
        return invalid_argument("image " + std::to_string(i) + ": its span [" +
                                std::to_string(im.span_start) + ", +" + std::to_string(im.span_length) +
                                ") is not a free range of the " + std::to_string(P) + "-token prompt");
      for (int64_t t = im.span_start; t < im.span_start + im.span_length; ++t) r->span_flags[t] = 1;
      prev_end = im.span_start + im.span_length;
    }
    auto keys = image_span_keys(r->req.images);
    r->cacheable = keys.has_value();
    if (keys) r->image_keys = std::move(*keys);
  }
  r->snap_at = P >= 2 ? P - 1 : -1;
  r->penalties = PenaltyState(r->req.sampling, r->req.prompt, info.vocab_size);
  auto stream = r->stream;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    if (m.stopping) return unavailable("the engine loop is stopping; no new requests");
    const int64_t queued = static_cast<int64_t>(m.incoming.size()) + m.stats.waiting;
    if (queued >= m.cfg.max_queue)
      return resource_exhausted("the request queue is full (" + std::to_string(queued) +
                                " waiting, max_queue " + std::to_string(m.cfg.max_queue) + ")");
    r->id = m.next_id++;
    r->cache.request_id = r->id;
    const uint64_t seed = r->req.sampling.seed ? *r->req.sampling.seed : m.seed_source();
    auto sampler = Sampler::create(sampler_params(r->req.sampling, seed));
    if (!sampler.ok()) return sampler.status();
    r->sampler.emplace(std::move(sampler).value());
    m.incoming.push_back(std::move(r));
  }
  m.cv.notify_all();
  return stream;
}

void EngineLoop::stop(std::chrono::milliseconds drain_timeout) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> join_lk(m.join_mu);
  {
    std::lock_guard<std::mutex> lk(m.mu);
    const int64_t d = m.clock->now_mono_ns() + std::chrono::nanoseconds(drain_timeout).count();
    m.deadline_ns = m.stopping ? std::min(m.deadline_ns, d) : d;
    m.stopping = true;
  }
  m.cv.notify_all();
  if (m.thread.joinable()) {
    m.thread.join();
  } else {
    m.abort_all("the engine loop stopped before the request ran");  // never started
  }
  // After the loop thread: every request ended (their jobs cancelled); waits for a job in progress.
  if (m.encoder) m.encoder->stop();
}

LoopStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  LoopStats s = impl_->stats;
  s.waiting += static_cast<int64_t>(impl_->incoming.size());
  return s;
}

}  // namespace ds41::engine
