// ds41 server: the OpenAI-compatible API as a function HttpRequest -> HttpResponse (routing,
// auth, limits, the generation routes). Transport-neutral: http_server.h serves it over HTTP.
//
// Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /tokenize,
// POST /detokenize, GET /health (503 while loading), GET /metrics, GET / (the chat page,
// chat_page.h). --api-key (Bearer) guards every route but /health and the page (which asks for
// the key). Thread-safe: called concurrently from connection threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/clock.h"
#include "server/generator.h"
#include "server/http_types.h"
#include "server/image_inputs.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "text/tokenizer.h"

namespace ds41::server {

struct ServiceConfig {
  std::string served_model_name = "ds41";
  std::string api_key;            // empty: no authentication
  int64_t max_context = 0;        // positions a sequence may reach (engine info); 0: unknown
  int64_t max_prompt_tokens = 0;  // 0: max_context
  int64_t max_tokens_limit = 0;   // max_tokens cap (0: none); also the default when unset
  bool default_thinking = text::ChatOptions{}.thinking;  // chat_template_kwargs unset
  ParseLimits parse;
  ImageInputOptions images;  // image_url parts: remote URLs (off by default), byte/pixel limits
};

// One request's context, for logs and metrics.
struct RequestCtx {
  std::string route;
  std::string remote;
  int64_t arrival_ns = 0;
  bool logged = false;  // the request's line was written (generation routes log with token counts)
};

class ApiService {
 public:
  // `metrics` and `clock` must outlive the service.
  ApiService(ServiceConfig cfg, ServerMetrics* metrics, Clock* clock = &SystemClock::instance());
  ~ApiService();

  // Marks the model loaded: generation routes and /health answer from now on. Both must
  // outlive the service. max_context > 0 replaces the configured one (known only after the
  // model loaded). Call once.
  void set_ready(Generator* gen, const text::Tokenizer* tok, int64_t max_context = 0);
  // The served model's vision config (before set_ready); without it image parts are refused.
  void set_vision(VisionModelInfo v) { vision_ = std::move(v); }
  // Shutting down: new generation requests get 503.
  void set_draining();
  bool ready() const { return ready_.load(); }

  HttpResponse handle(const HttpRequest& req);

  const ServiceConfig& config() const { return cfg_; }

 private:
  HttpResponse route(const HttpRequest& req, RequestCtx* ctx);
  HttpResponse chat_completions(const HttpRequest& req, RequestCtx* ctx);
  HttpResponse completions(const HttpRequest& req, RequestCtx* ctx);
  HttpResponse tokenize(const HttpRequest& req);
  HttpResponse detokenize(const HttpRequest& req);
  HttpResponse models() const;
  HttpResponse metrics() const;

  // Limits shared by both generation routes: prompt size, max_tokens, context. Fills *max_tokens.
  std::optional<ApiError> check_lengths(int64_t prompt_tokens, std::optional<int64_t> requested,
                                        int64_t* max_tokens) const;
  std::string next_id(const char* prefix);
  VisionModelInfo vision_;  // set before set_ready, read-only after
  // Per-request log line and request metrics (streams: when the stream closes).
  void finish_request(const RequestCtx& ctx, int status, const std::string& detail);

  ServiceConfig cfg_;
  ServerMetrics* metrics_;
  Clock* clock_;
  std::atomic<bool> ready_{false}, draining_{false};
  Generator* gen_ = nullptr;
  const text::Tokenizer* tok_ = nullptr;
  std::atomic<uint64_t> counter_{0};
  int64_t created_unix_s_ = 0;
};

HttpResponse error_response(const ApiError& e);
HttpResponse json_response(int status, const nlohmann::ordered_json& j);

}  // namespace ds41::server
