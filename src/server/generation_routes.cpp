// ds41 server: POST /v1/chat/completions and POST /v1/completions (ApiService, see
// api_service.h): prompt -> GenerationRequest -> Generator, then the events of each request are
// turned into one JSON response or a Server-Sent-Event stream (sse.h) on the client's thread.
#include <chrono>
#include <functional>

#include "server/api_service.h"
#include "server/chat_prompt.h"
#include "server/completion_consumer.h"
#include "server/sse.h"

namespace ds41::server {
namespace {

using Json = nlohmann::ordered_json;
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr int64_t kHeartbeatNs = 2'000'000'000;  // idle SSE comment: detects a gone client

// One generation (one choice) and what the client has been sent of it.
struct Gen {
  std::shared_ptr<engine::RequestStream> stream;
  std::unique_ptr<CompletionConsumer> consumer;
  // Accumulated for a non-streamed response.
  std::string reasoning, content;
  std::vector<text::ToolCall> tool_calls;
  std::vector<TokenLogprobText> logprobs;
  std::string finish_reason, error;
  std::string echo;  // completions with echo: the prompt text
};

// The request-wide part: timing, metrics and the log line.
struct Session {
  bool chat = true;
  std::string id, model;
  int64_t created = 0;
  bool include_usage = false, thinking = false;
  int next_tool_index = 0;
  std::vector<Gen> gens;
  ServerMetrics* metrics = nullptr;
  Clock* clock = nullptr;
  int64_t arrival_ns = 0, last_token_ns = 0, last_write_ns = 0;
  bool first_token = true, started = false, finished = false;
  std::function<void(int status, const std::string& detail)> on_finish;

  // Reads what gen `g` has now (waiting up to `wait`) and feeds its consumer.
  ConsumerUpdate pump(Gen& g, std::chrono::milliseconds wait) {
    std::vector<engine::TokenEvent> events;
    if (!g.stream->next(&events, wait)) {
      // The stream ended without a final event reaching the consumer (cannot happen with a
      // well-behaved loop); end it as an error rather than spin.
      if (!g.consumer->done()) {
        engine::TokenEvent ev;
        ev.finish = engine::FinishReason::kError;
        ev.error = "the request stream ended without a final event";
        events.push_back(ev);
      }
    }
    const int64_t now = clock->now_mono_ns();
    for (const engine::TokenEvent& ev : events) {
      if (ev.token < 0) continue;
      if (first_token)
        metrics->observe_ttft(static_cast<double>(now - arrival_ns) / 1e9);
      else
        metrics->observe_inter_token(static_cast<double>(now - last_token_ns) / 1e9);
      first_token = false;
      last_token_ns = now;
    }
    ConsumerUpdate u = g.consumer->consume(events);
    if (g.consumer->stop_matched()) g.stream->cancel();  // the loop frees it at its next step
    if (u.done) {
      g.finish_reason = u.finish_reason;
      g.error = u.error;
      metrics->record_tokens(g.consumer->prompt_tokens(), g.consumer->completion_tokens());
    }
    return u;
  }

  bool all_done() const {
    for (const Gen& g : gens)
      if (!g.consumer->done()) return false;
    return true;
  }

  void finish(int status, const std::string& detail) {
    if (finished) return;
    finished = true;
    metrics->observe_e2e(static_cast<double>(clock->now_mono_ns() - arrival_ns) / 1e9);
    int64_t p = 0, c = 0;
    for (const Gen& g : gens) {
      p += g.consumer->prompt_tokens();
      c += g.consumer->completion_tokens();
    }
    std::string d =
        "id=" + id + " prompt_tokens=" + std::to_string(p) + " completion_tokens=" + std::to_string(c);
    if (!gens.empty()) d += " finish=" + (gens[0].finish_reason.empty() ? "none" : gens[0].finish_reason);
    if (!detail.empty()) d += " " + detail;
    on_finish(status, d);
  }

  Json usage() const {
    int64_t p = 0, c = 0, r = 0, cached = 0;
    for (const Gen& g : gens) {
      p += g.consumer->prompt_tokens();
      c += g.consumer->completion_tokens();
      r += g.consumer->reasoning_tokens();
      cached += g.consumer->cached_tokens();
    }
    Json u = {{"prompt_tokens", p}, {"completion_tokens", c}, {"total_tokens", p + c}};
    u["prompt_tokens_details"] = {{"cached_tokens", cached}};
    // ds41-specific (README "Prefix cache"): where the cached tokens came from and what
    // happened to the SWA state (the first choice's, for n > 1).
    if (!gens.empty() && gens[0].consumer->cache_usage().enabled) {
      int64_t te = 0, td = 0, tk = 0, ts = 0;
      for (const Gen& g : gens) {
        const engine::CacheUsage& cu = g.consumer->cache_usage();
        te += cu.engine_tokens;
        td += cu.dram_tokens;
        tk += cu.disk_tokens;
        ts += cu.snapshot_tokens;
      }
      u["ds41"] = {
          {"cached_tokens_by_tier", {{"engine", te}, {"dram", td}, {"disk", tk}, {"swa_snapshot", ts}}},
          {"swa", gens[0].consumer->cache_usage().swa}};
    }
    if (chat) u["completion_tokens_details"] = {{"reasoning_tokens", r}};
    return u;
  }

  Json envelope(const char* object) const {
    return Json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
  }

  Json tool_calls_json(const std::vector<text::ToolCall>& calls, bool streaming) {
    Json arr = Json::array();
    for (const text::ToolCall& c : calls) {
      Json t;
      if (streaming) t["index"] = next_tool_index;
      t["id"] = "call_" + id.substr(id.find('-') + 1) + "_" + std::to_string(next_tool_index++);
      t["type"] = "function";
      t["function"] = {{"name", c.name}, {"arguments", c.arguments}};
      arr.push_back(std::move(t));
    }
    return arr;
  }
};

Json chat_logprobs(const std::vector<TokenLogprobText>& lps) {
  Json content = Json::array();
  for (const TokenLogprobText& lp : lps) {
    Json top = Json::array();
    for (const auto& [t, v] : lp.top)
      top.push_back({{"token", t}, {"logprob", v}, {"bytes", std::vector<uint8_t>(t.begin(), t.end())}});
    content.push_back({{"token", lp.text},
                       {"logprob", lp.logprob},
                       {"bytes", std::vector<uint8_t>(lp.text.begin(), lp.text.end())},
                       {"top_logprobs", top}});
  }
  return Json{{"content", content}};
}

Json completion_logprobs(const std::vector<TokenLogprobText>& lps, size_t text_offset) {
  Json tokens = Json::array(), values = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const TokenLogprobText& lp : lps) {
    tokens.push_back(lp.text);
    values.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [t, v] : lp.top) top[t] = v;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += lp.text.size();
  }
  return Json{
      {"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

ApiError generation_error(const std::string& message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = message;
  return e;
}

// Non-streamed: waits for every gen to finish (they run concurrently in the engine).
void run_to_end(Session& s) {
  for (Gen& g : s.gens) {
    while (!g.consumer->done()) {
      ConsumerUpdate u = s.pump(g, kPoll);
      g.reasoning += u.delta.reasoning;
      g.content += u.delta.content;
      for (auto& c : u.delta.tool_calls) g.tool_calls.push_back(std::move(c));
      for (auto& lp : u.logprobs) g.logprobs.push_back(std::move(lp));
    }
  }
}

// The SSE body of a streamed request (one gen).
std::shared_ptr<BodyStream> sse_body(std::shared_ptr<Session> s) {
  auto body = std::make_shared<BodyStream>();
  body->next = [s](std::string* out) -> bool {
    if (s->finished) return false;
    Gen& g = s->gens[0];
    const int64_t now = s->clock->now_mono_ns();
    if (!s->started) {
      s->started = true;
      s->last_write_ns = now;
      if (s->chat) {
        Json c = s->envelope("chat.completion.chunk");
        c["choices"] = Json::array({{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
        if (s->include_usage) c["usage"] = nullptr;
        *out += sse_event(c);
      } else if (!g.echo.empty()) {
        Json c = s->envelope("text_completion");
        c["choices"] = Json::array(
            {{{"index", 0}, {"text", g.echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
        *out += sse_event(c);
      }
      return true;
    }
    ConsumerUpdate u = s->pump(g, kPoll);
    const bool has_delta = !u.delta.empty() || !u.logprobs.empty();
    if (has_delta) {
      Json choice = {{"index", 0}};
      Json c = s->envelope(s->chat ? "chat.completion.chunk" : "text_completion");
      if (s->chat) {
        Json delta = Json::object();
        if (!u.delta.reasoning.empty()) delta["reasoning_content"] = u.delta.reasoning;
        if (!u.delta.content.empty()) delta["content"] = u.delta.content;
        if (!u.delta.tool_calls.empty()) delta["tool_calls"] = s->tool_calls_json(u.delta.tool_calls, true);
        choice["delta"] = delta;
        choice["logprobs"] = u.logprobs.empty() ? Json() : chat_logprobs(u.logprobs);
      } else {
        choice["text"] = u.delta.content;
        choice["logprobs"] = u.logprobs.empty() ? Json() : completion_logprobs(u.logprobs, 0);
      }
      choice["finish_reason"] = nullptr;
      c["choices"] = Json::array({choice});
      if (s->include_usage) c["usage"] = nullptr;
      *out += sse_event(c);
      s->last_write_ns = now;
    }
    if (u.done) {
      if (u.finish_reason == "error") {
        *out += sse_event(error_body(generation_error(u.error)));
      } else {
        Json c = s->envelope(s->chat ? "chat.completion.chunk" : "text_completion");
        Json choice = {{"index", 0}};
        if (s->chat)
          choice["delta"] = Json::object();
        else
          choice["text"] = "";
        choice["logprobs"] = nullptr;
        choice["finish_reason"] = u.finish_reason;
        c["choices"] = Json::array({choice});
        if (s->include_usage) c["usage"] = nullptr;
        *out += sse_event(c);
        if (s->include_usage) {
          Json uc = s->envelope(s->chat ? "chat.completion.chunk" : "text_completion");
          uc["choices"] = Json::array();
          uc["usage"] = s->usage();
          *out += sse_event(uc);
        }
      }
      *out += sse_done();
      s->finish(200, "stream=1");
      return true;
    }
    if (!has_delta && now - s->last_write_ns > kHeartbeatNs) {
      *out += sse_comment("keep-alive");
      s->last_write_ns = now;
    }
    return true;
  };
  body->close = [s](bool completed) {
    if (completed && s->finished) return;
    for (Gen& g : s->gens) g.stream->cancel();  // client gone: the loop frees its sequence
    s->finish(200, "stream=1 client_disconnected=1");
  };
  return body;
}

}  // namespace

HttpResponse ApiService::chat_completions(const HttpRequest& req, RequestCtx* ctx) {
  ApiResult<ChatCompletionRequest> pr = parse_chat_request(req.body, cfg_.parse);
  if (!pr.ok()) return error_response(pr.error());
  ChatCompletionRequest& cr = pr.value();
  bool thinking = cfg_.default_thinking;
  std::vector<std::string> image_sources;
  ApiResult<std::vector<int32_t>> ids =
      build_chat_prompt(cr, *tok_, cfg_.default_thinking, &thinking, &image_sources);
  if (!ids.ok()) return error_response(ids.error());
  engine::GenerationRequest g;
  // Images: resolved, decoded and preprocessed here; their placeholders expand to span
  // positions (counted in usage.prompt_tokens); the tower runs in the engine loop.
  int64_t image_tokens = 0;
  ApiResult<std::vector<engine::RequestImage>> imgs =
      resolve_request_images(image_sources, vision_, cfg_.images, &ids.value(), &image_tokens);
  if (!imgs.ok()) return error_response(imgs.error());
  g.images = std::move(imgs.value());
  if (auto e = check_lengths(static_cast<int64_t>(ids.value().size()), cr.common.max_tokens, &g.max_tokens))
    return error_response(*e);
  g.prompt = std::move(ids.value());
  const int64_t prompt_len = static_cast<int64_t>(g.prompt.size());
  g.sampling = cr.common.sampling;
  g.stop_token_ids = cr.common.stop_token_ids;
  g.ignore_eos = cr.common.ignore_eos;

  auto s = std::make_shared<Session>();
  s->chat = true;
  s->id = next_id("chatcmpl");
  g.request_id = s->id;
  s->model = cfg_.served_model_name;
  s->created = clock_->now_unix_ns() / 1000000000;
  s->include_usage = cr.common.include_usage;
  s->thinking = thinking;
  s->metrics = metrics_;
  s->clock = clock_;
  s->arrival_ns = ctx->arrival_ns;
  RequestCtx c = *ctx;
  s->on_finish = [this, c](int status, const std::string& d) { finish_request(c, status, d); };

  Result<std::shared_ptr<engine::RequestStream>> st = gen_->submit(std::move(g));
  if (!st.ok()) return error_response(api_error_from_status(st.status()));
  ConsumerOptions co;
  co.prompt_tokens = prompt_len;
  co.thinking = thinking;
  co.stop = cr.common.stop;
  co.stop_token_ids = cr.common.stop_token_ids;
  co.logprobs = cr.common.sampling.top_logprobs >= 0;
  Gen gen0;
  gen0.stream = st.value();
  gen0.consumer = std::make_unique<CompletionConsumer>(*tok_, co);
  s->gens.push_back(std::move(gen0));

  if (cr.common.stream) {
    HttpResponse r;
    r.content_type = "text/event-stream";
    r.headers.emplace_back("Cache-Control", "no-cache");
    r.stream = sse_body(s);
    return r;
  }
  run_to_end(*s);
  Gen& gen = s->gens[0];
  if (gen.finish_reason == "error") {
    s->finish(500, "error=1");
    ctx->logged = true;
    return error_response(generation_error(gen.error));
  }
  Json msg = {{"role", "assistant"}};
  msg["content"] = gen.content.empty() && !gen.tool_calls.empty() ? Json() : Json(gen.content);
  if (thinking) msg["reasoning_content"] = gen.reasoning;
  if (!gen.tool_calls.empty()) msg["tool_calls"] = s->tool_calls_json(gen.tool_calls, false);
  Json out = s->envelope("chat.completion");
  out["choices"] = Json::array({{{"index", 0},
                                 {"message", msg},
                                 {"logprobs", co.logprobs ? chat_logprobs(gen.logprobs) : Json()},
                                 {"finish_reason", gen.finish_reason}}});
  out["usage"] = s->usage();
  s->finish(200, "");
  ctx->logged = true;
  return json_response(200, out);
}

HttpResponse ApiService::completions(const HttpRequest& req, RequestCtx* ctx) {
  ApiResult<CompletionRequest> pr = parse_completion_request(req.body, cfg_.parse);
  if (!pr.ok()) return error_response(pr.error());
  CompletionRequest& cr = pr.value();
  std::vector<engine::GenerationRequest> reqs;
  std::vector<std::string> echoes;
  for (size_t i = 0; i < cr.prompts.size(); ++i) {
    engine::GenerationRequest g;
    const std::string field = cr.prompts.size() > 1 ? "prompt[" + std::to_string(i) + "]" : "prompt";
    if (cr.prompts[i].text) {
      g.prompt = tok_->encode(*cr.prompts[i].text);
    } else {
      g.prompt = cr.prompts[i].ids;
      for (int32_t id : g.prompt)
        if (!tok_->valid_id(id))
          return error_response(bad_request("'" + field + "' holds token id " + std::to_string(id) +
                                                ", outside this tokenizer's vocabulary",
                                            field));
    }
    if (auto e = check_lengths(static_cast<int64_t>(g.prompt.size()), cr.common.max_tokens, &g.max_tokens)) {
      ApiError err = *e;
      if (err.param == "messages") err.param = field;
      return error_response(err);
    }
    std::string echo;
    if (cr.echo) {
      if (cr.prompts[i].text) {
        echo = *cr.prompts[i].text;
      } else {
        Result<std::string> t = tok_->decode(g.prompt);
        if (t.ok()) echo = t.value();
      }
    }
    g.sampling = cr.common.sampling;
    g.stop_token_ids = cr.common.stop_token_ids;
    g.ignore_eos = cr.common.ignore_eos;
    reqs.push_back(std::move(g));
    echoes.push_back(std::move(echo));
  }

  auto s = std::make_shared<Session>();
  s->chat = false;
  s->id = next_id("cmpl");
  s->model = cfg_.served_model_name;
  s->created = clock_->now_unix_ns() / 1000000000;
  s->include_usage = cr.common.include_usage;
  s->metrics = metrics_;
  s->clock = clock_;
  s->arrival_ns = ctx->arrival_ns;
  RequestCtx c = *ctx;
  s->on_finish = [this, c](int status, const std::string& d) { finish_request(c, status, d); };
  ConsumerOptions co;
  co.raw = true;
  co.stop = cr.common.stop;
  co.stop_token_ids = cr.common.stop_token_ids;
  co.logprobs = cr.common.sampling.top_logprobs >= 0;
  std::vector<int64_t> prompt_lens;
  for (const auto& g : reqs) prompt_lens.push_back(static_cast<int64_t>(g.prompt.size()));
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].request_id = s->id + "-" + std::to_string(i);
    Result<std::shared_ptr<engine::RequestStream>> st = gen_->submit(std::move(reqs[i]));
    if (!st.ok()) {
      for (Gen& g : s->gens) g.stream->cancel();
      return error_response(api_error_from_status(st.status()));
    }
    Gen g;
    g.stream = st.value();
    co.prompt_tokens = prompt_lens[i];
    g.consumer = std::make_unique<CompletionConsumer>(*tok_, co);
    g.echo = echoes[i];
    s->gens.push_back(std::move(g));
  }
  if (cr.common.stream) {
    HttpResponse r;
    r.content_type = "text/event-stream";
    r.headers.emplace_back("Cache-Control", "no-cache");
    r.stream = sse_body(s);
    return r;
  }
  run_to_end(*s);
  Json choices = Json::array();
  for (size_t i = 0; i < s->gens.size(); ++i) {
    Gen& g = s->gens[i];
    if (g.finish_reason == "error") {
      s->finish(500, "error=1");
      ctx->logged = true;
      return error_response(generation_error(g.error));
    }
    choices.push_back({{"index", i},
                       {"text", g.echo + g.content},
                       {"logprobs", co.logprobs ? completion_logprobs(g.logprobs, g.echo.size()) : Json()},
                       {"finish_reason", g.finish_reason}});
  }
  Json out = s->envelope("text_completion");
  out["choices"] = choices;
  out["usage"] = s->usage();
  s->finish(200, "");
  ctx->logged = true;
  return json_response(200, out);
}

}  // namespace ds41::server
