// ds41 server: Prometheus metrics (see metrics.h).
#include "server/metrics.h"

#include <cstdio>

namespace ds41::server {
namespace {

const std::vector<double>& kLatencyBounds = kvcache::latency_bounds_seconds();  // shared with the cache's
const std::vector<double> kCountBounds = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};

}  // namespace

ServerMetrics::ServerMetrics()
    : ttft_(kLatencyBounds),
      itl_(kLatencyBounds),
      e2e_(kLatencyBounds),
      step_seqs_(kCountBounds),
      step_tokens_(kCountBounds),
      step_seconds_(kLatencyBounds) {}

void ServerMetrics::record_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{route, status}];
}
void ServerMetrics::record_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += prompt;
  generation_tokens_ += generated;
}
void ServerMetrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}
void ServerMetrics::observe_inter_token(double s) {
  std::lock_guard<std::mutex> l(mu_);
  itl_.observe(s);
}
void ServerMetrics::observe_e2e(double s) {
  std::lock_guard<std::mutex> l(mu_);
  e2e_.observe(s);
}
void ServerMetrics::observe_step(int64_t seqs, int64_t tokens, double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  step_seqs_.observe(static_cast<double>(seqs));
  step_tokens_.observe(static_cast<double>(tokens));
  step_seconds_.observe(seconds);
}

std::string ServerMetrics::render(const engine::LoopStats& st) const {
  std::lock_guard<std::mutex> l(mu_);
  std::string o;
  auto gauge = [&](const char* name, const char* help, const char* type, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(v) + "\n";
  };
  o += "# HELP ds41_requests_total HTTP requests by route and status.\n# TYPE ds41_requests_total counter\n";
  for (const auto& [k, v] : requests_)
    o += "ds41_requests_total{route=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
         std::to_string(v) + "\n";
  gauge("ds41_prompt_tokens_total", "Prompt tokens of finished requests.", "counter", prompt_tokens_);
  gauge("ds41_generation_tokens_total", "Generated tokens of finished requests.", "counter",
        generation_tokens_);
  gauge("ds41_running_sequences", "Sequences in the running batch.", "gauge", st.running);
  gauge("ds41_waiting_requests", "Requests waiting for admission.", "gauge", st.waiting);
  gauge("ds41_state_memory_used_bytes", "Sequence state bytes in use.", "gauge", st.kv_used_bytes);
  gauge("ds41_state_memory_free_bytes", "Sequence state bytes free (--kv-memory minus used).", "gauge",
        st.kv_capacity_bytes > st.kv_used_bytes ? st.kv_capacity_bytes - st.kv_used_bytes : 0);
  gauge("ds41_preemptions_total", "Sequences preempted (state dropped, recomputed later).", "counter",
        st.preemptions);
  gauge("ds41_engine_steps_total", "Engine steps run.", "counter", st.steps);
  gauge("ds41_images_encoded_total", "Images run through the vision tower (feature-cache misses).", "counter",
        st.images_encoded);
  gauge("ds41_image_tokens_total", "Image span positions of prefilled requests.", "counter", st.image_tokens);
  gauge("ds41_vision_cache_hits_total", "Vision-feature cache hits (image encoded before).", "counter",
        st.vision_cache_hits);
  gauge("ds41_vision_cache_misses_total", "Vision-feature cache misses.", "counter", st.vision_cache_misses);
  gauge("ds41_vision_cache_entries", "Images held by the vision-feature cache.", "gauge",
        st.vision_cache_entries);
  gauge("ds41_vision_cache_bytes", "Bytes held by the vision-feature cache.", "gauge", st.vision_cache_bytes);
  // The image encoder (engine/image_encoder.h): images of cache misses encoded off the loop thread.
  gauge("ds41_image_encoder_queue_depth", "Image encoder jobs queued or running (one per request with misses).",
        "gauge", st.image_encoder_queued + st.image_encoder_running);
  gauge("ds41_image_encoder_rejected_total",
        "Image encoder submits refused because it was full (the request waited a step).", "counter",
        st.image_encoder_rejected);
  {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6f", st.image_encoder_busy_seconds);
    o += "# HELP ds41_image_encoder_busy_seconds_total Seconds the image encoder spent in the vision tower.\n"
         "# TYPE ds41_image_encoder_busy_seconds_total counter\nds41_image_encoder_busy_seconds_total " +
         std::string(buf) + "\n";
  }
  gauge("ds41_prefill_tokens_computed_total",
        "Prompt positions run through the model (not restored from the cache).", "counter",
        st.prefill_tokens_computed);
  gauge("ds41_prompt_cached_tokens_total", "Prompt positions restored from the prefix cache.", "counter",
        st.cached_tokens);
  // DSpark speculative decoding (MODEL_SPEC 3.10): accepted candidates per sequence step.
  gauge("ds41_spec_decode_steps_total", "Speculative (DSpark) sequence steps.", "counter", st.spec_steps);
  // MODEL_SPEC 3.10.9: candidates verified, and those the batch token budget
  // (--speculative-token-budget) took off the sequences' blocks.
  gauge("ds41_spec_decode_verified_tokens_total", "Draft candidates verified by speculative steps.",
        "counter", st.spec_verified);
  gauge("ds41_spec_decode_budget_cut_tokens_total",
        "Draft candidates not verified because of the batch token budget.", "counter", st.spec_budget_cut);
  o += "# HELP ds41_spec_decode_accepted_total Speculative sequence steps by accepted candidates.\n"
       "# TYPE ds41_spec_decode_accepted_total counter\n";
  int64_t accepted_sum = 0;
  for (size_t a = 0; a < st.spec_accepted.size(); ++a) {
    o += "ds41_spec_decode_accepted_total{accepted=\"" + std::to_string(a) + "\"} " +
         std::to_string(st.spec_accepted[a]) + "\n";
    accepted_sum += static_cast<int64_t>(a) * st.spec_accepted[a];
  }
  {
    char buf[64];
    std::snprintf(
        buf, sizeof buf, "%.6g",
        st.spec_steps > 0 ? static_cast<double>(accepted_sum) / static_cast<double>(st.spec_steps) : 0.0);
    o += "# HELP ds41_spec_decode_mean_accepted_length Mean accepted candidates per speculative step.\n"
         "# TYPE ds41_spec_decode_mean_accepted_length gauge\nds41_spec_decode_mean_accepted_length " +
         std::string(buf) + "\n";
  }
  kvcache::render_histogram(step_seqs_, "ds41_step_batch_size", "Sequences per engine step.", &o);
  kvcache::render_histogram(step_tokens_, "ds41_step_tokens", "Tokens per engine step (prefill chunks + decodes).",
                            &o);
  kvcache::render_histogram(step_seconds_, "ds41_step_seconds", "Engine step duration.", &o);
  kvcache::render_histogram(ttft_, "ds41_time_to_first_token_seconds",
                            "Time from request arrival to the first token.", &o);
  kvcache::render_histogram(itl_, "ds41_inter_token_latency_seconds",
                            "Time between consecutive tokens of a request.", &o);
  kvcache::render_histogram(e2e_, "ds41_e2e_request_latency_seconds",
                            "Time from request arrival to its last token.", &o);
  if (cache_) o += cache_->prometheus_text();
  return o;
}

}  // namespace ds41::server
