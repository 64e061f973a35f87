// ds41 server: routing, auth and the small routes of ApiService (see api_service.h); the
// generation routes are in generation_routes.cpp.
#include "server/api_service.h"

#include <cctype>
#include <chrono>
#include <cstdio>

#include "core/log.h"
#include "server/chat_page.h"
#include "server/chat_prompt.h"

namespace ds41::server {
namespace {

using Json = nlohmann::ordered_json;

// Compares without an early exit on the first differing byte (the key is a secret).
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

HttpResponse json_response(int status, const Json& j) {
  HttpResponse r;
  r.status = status;
  r.body = json_text(j);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.http_status, error_body(e));
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

ApiService::ApiService(ServiceConfig cfg, ServerMetrics* metrics, Clock* clock)
    : cfg_(std::move(cfg)),
      metrics_(metrics),
      clock_(clock),
      created_unix_s_(clock->now_unix_ns() / 1000000000) {}

ApiService::~ApiService() = default;

void ApiService::set_ready(Generator* gen, const text::Tokenizer* tok, int64_t max_context) {
  if (max_context > 0) cfg_.max_context = max_context;
  gen_ = gen;
  tok_ = tok;
  ready_.store(true);
}

void ApiService::set_draining() { draining_.store(true); }

std::string ApiService::next_id(const char* prefix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%llx%06llx", prefix, static_cast<unsigned long long>(created_unix_s_),
                static_cast<unsigned long long>(counter_.fetch_add(1)));
  return buf;
}

void ApiService::finish_request(const RequestCtx& ctx, int status, const std::string& detail) {
  metrics_->record_request(ctx.route, status);
  const double ms = static_cast<double>(clock_->now_mono_ns() - ctx.arrival_ns) / 1e6;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", ms);
  log_info("server", "request route=" + ctx.route + " status=" + std::to_string(status) + " ms=" + buf +
                         " remote=" + ctx.remote + (detail.empty() ? "" : " " + detail));
}

HttpResponse ApiService::handle(const HttpRequest& req) {
  RequestCtx ctx;
  ctx.route = req.path;
  ctx.remote = req.remote;
  ctx.arrival_ns = clock_->now_mono_ns();
  HttpResponse r;
  try {
    r = route(req, &ctx);
  } catch (const std::exception& e) {
    // Validation runs before any throwing accessor; reaching this is a server bug, not bad input.
    ApiError err;
    err.http_status = 500;
    err.type = "server_error";
    err.message = std::string("internal error: ") + e.what();
    r = error_response(err);
  }
  if (!r.stream && !ctx.logged) finish_request(ctx, r.status, "");
  return r;
}

HttpResponse ApiService::route(const HttpRequest& req, RequestCtx* ctx) {
  struct Route {
    const char* path;
    const char* method;
  };
  static const Route kRoutes[] = {{"/v1/chat/completions", "POST"},
                                  {"/v1/completions", "POST"},
                                  {"/v1/models", "GET"},
                                  {"/tokenize", "POST"},
                                  {"/detokenize", "POST"},
                                  {"/health", "GET"},
                                  {"/", "GET"},
                                  {"/metrics", "GET"}};
  const Route* found = nullptr;
  for (const Route& r : kRoutes)
    if (req.path == r.path) found = &r;
  if (!found) {
    ctx->route = "unknown";
    ApiError e = bad_request("no route " + req.method + " " + req.path, "", "not_found");
    e.http_status = 404;
    return error_response(e);
  }
  // The chat page is public like /health: it holds no data and asks for the key itself, then
  // sends it as Bearer on the API calls. It is served while the model loads.
  if (req.path != "/health" && req.path != "/" && !cfg_.api_key.empty()) {
    const std::string auth = req.header("authorization");
    const std::string want = "Bearer " + cfg_.api_key;
    if (!same_secret(auth, want)) {
      ApiError e = bad_request(
          auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'" : "incorrect API key", "",
          "invalid_api_key");
      e.http_status = 401;
      e.type = "authentication_error";
      return error_response(e);
    }
  }
  if (req.method != found->method && !(req.method == "HEAD" && std::string(found->method) == "GET")) {
    ApiError e =
        bad_request("method " + req.method + " not allowed on " + req.path + "; use " + found->method);
    e.http_status = 405;
    return error_response(e);
  }
  // POST bodies are parsed as JSON whatever the Content-Type says: `curl -d` sends
  // application/x-www-form-urlencoded and fetch() with a string body text/plain (as OpenAI's and
  // vLLM's servers do, a body that is not JSON is a 400 from the parser, naming the problem).
  if (req.path == "/health") {
    if (!ready_.load()) {
      ApiError e = api_error_from_status(unavailable("model is loading"));
      return error_response(e);
    }
    return json_response(200, Json{{"status", draining_.load() ? "draining" : "ok"}});
  }
  if (req.path == "/") {
    HttpResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = std::string(chat_page_html());
    r.headers.emplace_back("Cache-Control", "no-cache");
    return r;
  }
  if (req.path == "/v1/models") return models();
  if (req.path == "/metrics") return metrics();
  if (!ready_.load()) return error_response(api_error_from_status(unavailable("model is loading")));
  if (req.path == "/tokenize") return tokenize(req);
  if (req.path == "/detokenize") return detokenize(req);
  if (draining_.load()) return error_response(api_error_from_status(unavailable("server is shutting down")));
  if (req.path == "/v1/chat/completions") return chat_completions(req, ctx);
  return completions(req, ctx);
}

HttpResponse ApiService::models() const {
  Json m = {{"id", cfg_.served_model_name},
            {"object", "model"},
            {"created", created_unix_s_},
            {"owned_by", "ds41"}};
  if (cfg_.max_context > 0) m["max_model_len"] = cfg_.max_context;
  return json_response(200, Json{{"object", "list"}, {"data", Json::array({m})}});
}

HttpResponse ApiService::metrics() const {
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = metrics_->render(ready_.load() && gen_ ? gen_->stats() : engine::LoopStats{});
  return r;
}

HttpResponse ApiService::tokenize(const HttpRequest& req) {
  ApiResult<Json> jr = parse_json_object(req.body);
  if (!jr.ok()) return error_response(jr.error());
  const Json& j = jr.value();
  std::vector<int32_t> ids;
  if (j.contains("prompt") && j["prompt"].is_string()) {
    bool special = true;
    if (j.contains("add_special_tokens") && j["add_special_tokens"].is_boolean())
      special = j["add_special_tokens"].get<bool>();
    text::EncodeOptions eo;
    eo.split_added_tokens = special;
    ids = tok_->encode(j["prompt"].get<std::string>(), eo);
  } else if (j.contains("messages")) {
    // The same prompt the chat route would build (template, tools, thinking, effort).
    ApiResult<ChatCompletionRequest> cr = parse_chat_request(req.body, cfg_.parse);
    if (!cr.ok()) return error_response(cr.error());
    ApiResult<std::vector<int32_t>> p = build_chat_prompt(cr.value(), *tok_, cfg_.default_thinking, nullptr);
    if (!p.ok()) return error_response(p.error());
    ids = std::move(p.value());
  } else {
    return error_response(bad_request("'prompt' (a string) or 'messages' is required", "prompt"));
  }
  Json out = {{"count", ids.size()}, {"max_model_len", cfg_.max_context}, {"tokens", ids}};
  return json_response(200, out);
}

HttpResponse ApiService::detokenize(const HttpRequest& req) {
  ApiResult<Json> jr = parse_json_object(req.body);
  if (!jr.ok()) return error_response(jr.error());
  const Json& j = jr.value();
  if (!j.contains("tokens") || !j["tokens"].is_array())
    return error_response(bad_request("'tokens' (an array of token ids) is required", "tokens"));
  std::vector<int32_t> ids;
  for (const Json& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX ||
        !tok_->valid_id(static_cast<int32_t>(t.get<int64_t>())))
      return error_response(
          bad_request("'tokens' holds " + t.dump() + ", not a token id of this tokenizer", "tokens"));
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  Result<std::string> text = tok_->decode(ids);
  if (!text.ok()) return error_response(api_error_from_status(text.status(), "tokens"));
  return json_response(200, Json{{"prompt", text.value()}});
}

std::optional<ApiError> ApiService::check_lengths(int64_t prompt_tokens, std::optional<int64_t> requested,
                                                  int64_t* max_tokens) const {
  const int64_t prompt_cap = cfg_.max_prompt_tokens > 0 ? cfg_.max_prompt_tokens : cfg_.max_context;
  if (prompt_tokens == 0) return bad_request("the prompt is empty", "prompt");
  if (prompt_cap > 0 && prompt_tokens > prompt_cap)
    return bad_request("the prompt has " + std::to_string(prompt_tokens) +
                           " tokens; this server accepts at most " + std::to_string(prompt_cap),
                       "messages", "context_length_exceeded");
  if (requested && cfg_.max_tokens_limit > 0 && *requested > cfg_.max_tokens_limit)
    return bad_request("max_tokens is " + std::to_string(*requested) + "; this server allows at most " +
                           std::to_string(cfg_.max_tokens_limit),
                       "max_tokens");
  const int64_t room = cfg_.max_context > 0 ? cfg_.max_context - prompt_tokens : INT64_MAX;
  if (room <= 0 || (requested && *requested > room))
    return bad_request("this model's maximum context length is " + std::to_string(cfg_.max_context) +
                           " tokens; the prompt has " + std::to_string(prompt_tokens) + " tokens and " +
                           std::to_string(requested.value_or(1)) + " were requested for the completion",
                       "max_tokens", "context_length_exceeded");
  int64_t mt = requested.value_or(room);
  if (!requested && cfg_.max_tokens_limit > 0) mt = std::min(mt, cfg_.max_tokens_limit);
  *max_tokens = mt;
  return std::nullopt;
}

}  // namespace ds41::server
