// ds41 bench serve: load generator for an OpenAI-compatible server, in the spirit of
// `vllm bench serve`. Sweeps concurrency (--concurrency 1,8,64) and request rate (--request-rate
// 2,inf: Poisson arrivals) over
//   (a) random prompts of --input-len token ids and exactly --output-len generated tokens
//       (/v1/completions with token-id prompts and ignore_eos, so lengths are exact), and
//   (b) a seeded multi-turn agent trace whose prompts grow with shared prefixes
//       (bench_serve_workload.h);
// and reports request throughput, output tokens/s, TTFT / TPOT / ITL p50/p90/p99 and the
// cached-token ratio (usage.prompt_tokens_details.cached_tokens / prompt tokens).
//
// --url URL: against a running server. --model DIR: starts the server in-process on a free
// loopback port. --overhead (with --model): runs the same requests, at the same concurrency, once
// through HTTP and once directly on the same EngineLoop, and reports the ratio of output tokens/s
// (the server's own overhead: parsing, detokenization, SSE, sockets). --cache-compare (with
// --model): two in-process servers, one without and one with the prefix cache (DRAM tiers, issue
// 13), run the same requests in the same run; each point reports both, the prefill tokens each
// computed and the ratios (TTFT p50/p99, prefill tokens: cache on / off). Each point uses its own
// trace seed so the cache-on server never sees a point's trace before.
//
// Clients: one thread per concurrent client (cpp-httplib, streaming), fine up to a few hundred.
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "bench_header.h"
#include "bench_serve_workload.h"
#include "cli_registry.h"
#include "engine/cpu_engine.h"
#include "engine/engine_loop.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache.h"
#include "forward_cli_util.h"
#include "load_progress.h"
#include "server/api_service.h"
#include "server/engine_loop_generator.h"
#include "server/http_server.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_serve {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using Json = nlohmann::ordered_json;
using SteadyClock = std::chrono::steady_clock;
using namespace bench_serve;

struct BenchServeArgs {
  std::string url, model_dir, tokenizer_dir, api_key, model_name;
  bool overhead = false, json = false, cache_compare = false;
  std::string concurrency = "1,8,64", request_rate = "inf", workload = "random";
  int64_t num_prompts = 0;  // 0: 4 x concurrency (at least 16)
  int64_t input_len = 128, output_len = 32;
  int64_t agent_sessions = 0;  // 0: concurrency (at least 4)
  int64_t agent_turns = 4, agent_system = 256, agent_user = 32, agent_tool = 128;
  int32_t token_lo = 1000, token_hi = 30000;
  uint64_t seed = 0;
  int threads = 2;
  int64_t max_batch_tokens = 2048, max_running = 64;
  int timeout_s = 600;
  int warmup = 2;
};

// What one request measured.
struct ReqResult {
  bool ok = false;
  std::string error;
  double start = 0, ttft = 0, e2e = 0;  // seconds (start: from the run's start)
  std::vector<double> itl;              // gaps between output chunks
  int64_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
};

// Sends one request on behalf of one client; each client (thread) owns one Sender.
class Sender {
 public:
  virtual ~Sender() = default;
  virtual ReqResult send(const BenchRequest& r) = 0;
};
using SenderFactory = std::function<std::unique_ptr<Sender>()>;

double since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// --- HTTP client: POST /v1/completions, stream, token-id prompt, ignore_eos --------------------

struct ParsedUrl {
  std::string host;
  int port = 80;
};

Result<ParsedUrl> parse_url(const std::string& url) {
  std::string u = url;
  if (u.rfind("http://", 0) == 0)
    u = u.substr(7);
  else if (u.find("://") != std::string::npos)
    return invalid_argument("--url '" + url + "': only http:// is supported");
  if (const size_t slash = u.find('/'); slash != std::string::npos) u.resize(slash);
  ParsedUrl p;
  const size_t colon = u.rfind(':');
  p.host = colon == std::string::npos ? u : u.substr(0, colon);
  if (colon != std::string::npos) {
    try {
      p.port = std::stoi(u.substr(colon + 1));
    } catch (...) {
      return invalid_argument("--url '" + url + "': bad port");
    }
  }
  if (p.host.empty()) return invalid_argument("--url '" + url + "': no host");
  return p;
}

class HttpSender final : public Sender {
 public:
  HttpSender(const ParsedUrl& u, const std::string& api_key, const std::string& model, int timeout_s,
             SteadyClock::time_point t0)
      : cli_(u.host, u.port), model_(model), t0_(t0) {
    cli_.set_read_timeout(timeout_s, 0);
    cli_.set_write_timeout(timeout_s, 0);
    cli_.set_connection_timeout(10, 0);
    cli_.set_keep_alive(true);
    cli_.set_tcp_nodelay(true);
    if (!api_key.empty()) cli_.set_bearer_token_auth(api_key);
  }

  ReqResult send(const BenchRequest& r) override {
    ReqResult res;
    Json body = {{"prompt", r.prompt}, {"max_tokens", r.max_tokens},
                 {"ignore_eos", true}, {"temperature", 0.0},
                 {"stream", true},     {"stream_options", {{"include_usage", true}}}};
    if (!model_.empty()) body["model"] = model_;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    const auto start = SteadyClock::now();
    res.start = std::chrono::duration<double>(start - t0_).count();
    std::string buf;
    double last = -1;
    bool done = false;
    auto on_event = [&](std::string_view data) {
      if (data == "[DONE]") {
        done = true;
        return;
      }
      Json j = Json::parse(data, nullptr, false);
      if (!j.is_object()) return;
      if (j.contains("error")) {
        res.error = j["error"].value("message", std::string("error event"));
        return;
      }
      if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
        const Json& c = j["choices"][0];
        if (c.contains("text") && c["text"].is_string() && !c["text"].get_ref<const std::string&>().empty()) {
          const double t = since(start);
          if (last < 0)
            res.ttft = t;
          else
            res.itl.push_back(t - last);
          last = t;
        }
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        const Json& u = j["usage"];
        res.prompt_tokens = u.value("prompt_tokens", int64_t{0});
        res.output_tokens = u.value("completion_tokens", int64_t{0});
        if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
          res.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
      }
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      buf.append(data, n);
      size_t pos;
      while ((pos = buf.find("\n\n")) != std::string::npos) {
        std::string_view ev(buf.data(), pos);
        if (ev.rfind("data: ", 0) == 0) on_event(ev.substr(6));
        buf.erase(0, pos + 2);
      }
      return true;
    };
    httplib::Response resp;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli_.send(req, resp, err);
    res.e2e = since(start);
    if (!sent) {
      res.error = "HTTP: " + httplib::to_string(err);
    } else if (resp.status != 200) {
      res.error = "HTTP " + std::to_string(resp.status) + ": " + buf.substr(0, 200);
    } else if (res.error.empty() && !done) {
      res.error = "stream ended without [DONE]";
    } else if (res.error.empty() && res.output_tokens != r.max_tokens) {
      res.error =
          "got " + std::to_string(res.output_tokens) + " tokens, asked " + std::to_string(r.max_tokens);
    }
    res.ok = res.error.empty();
    return res;
  }

 private:
  httplib::Client cli_;
  std::string model_;
  SteadyClock::time_point t0_;
};

// --- direct client: the same request straight into the EngineLoop --------------------------------

class DirectSender final : public Sender {
 public:
  DirectSender(engine::EngineLoop* loop, SteadyClock::time_point t0) : loop_(loop), t0_(t0) {}
  ReqResult send(const BenchRequest& r) override {
    ReqResult res;
    engine::GenerationRequest g;
    g.prompt = r.prompt;
    g.max_tokens = r.max_tokens;
    g.ignore_eos = true;
    g.sampling.temperature = 0.0;
    const auto start = SteadyClock::now();
    res.start = std::chrono::duration<double>(start - t0_).count();
    Result<std::shared_ptr<engine::RequestStream>> st = loop_->submit(std::move(g));
    if (!st.ok()) {
      res.error = st.status().message();
      res.e2e = since(start);
      return res;
    }
    std::vector<engine::TokenEvent> evs;
    double last = -1;
    while (st.value()->next(&evs, std::chrono::milliseconds(100))) {
      if (evs.empty()) continue;
      const double t = since(start);
      for (const engine::TokenEvent& ev : evs) {
        if (ev.token >= 0) ++res.output_tokens;
        if (ev.finish == engine::FinishReason::kError) res.error = ev.error;
        if (ev.finish != engine::FinishReason::kNone) {
          res.prompt_tokens = ev.prompt_tokens;
          res.cached_tokens = ev.cached_tokens;
        }
      }
      // One "chunk" per wake-up, as a streaming HTTP client sees it.
      if (last < 0)
        res.ttft = t;
      else
        res.itl.push_back(t - last);
      last = t;
      evs.clear();
    }
    res.e2e = since(start);
    if (res.error.empty() && res.output_tokens != r.max_tokens)
      res.error =
          "got " + std::to_string(res.output_tokens) + " tokens, asked " + std::to_string(r.max_tokens);
    res.ok = res.error.empty();
    return res;
  }

 private:
  engine::EngineLoop* loop_;
  SteadyClock::time_point t0_;
};

// --- one sweep point -------------------------------------------------------------------------------

// Runs `jobs` with at most `concurrency` clients; job i starts no earlier than arrivals[i].
Json run_point(const std::vector<BenchJob>& jobs, const std::vector<double>& arrivals, int64_t concurrency,
               const std::function<std::unique_ptr<Sender>(SteadyClock::time_point)>& make_sender) {
  const auto t0 = SteadyClock::now();
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<ReqResult> results;
  std::vector<std::thread> clients;
  const int64_t n_clients = std::min<int64_t>(concurrency, static_cast<int64_t>(jobs.size()));
  for (int64_t c = 0; c < n_clients; ++c) {
    clients.emplace_back([&] {
      std::unique_ptr<Sender> s = make_sender(t0);
      std::vector<ReqResult> mine;
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<SteadyClock::duration>(
                                               std::chrono::duration<double>(arrivals[i])));
        for (const BenchRequest& r : jobs[i]) {
          mine.push_back(s->send(r));
          if (!mine.back().ok) break;  // a failed turn ends its session
        }
      }
      std::lock_guard<std::mutex> l(mu);
      for (ReqResult& r : mine) results.push_back(std::move(r));
    });
  }
  for (std::thread& t : clients) t.join();
  const double dur = since(t0);

  int64_t ok = 0, out_tok = 0, in_tok = 0, cached = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::vector<std::string> errors;
  for (const ReqResult& r : results) {
    if (!r.ok) {
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++ok;
    out_tok += r.output_tokens;
    in_tok += r.prompt_tokens;
    cached += r.cached_tokens;
    ttft.push_back(r.ttft * 1e3);
    e2e.push_back(r.e2e * 1e3);
    if (r.output_tokens > 1)
      tpot.push_back((r.e2e - r.ttft) * 1e3 / static_cast<double>(r.output_tokens - 1));
    for (double g : r.itl) itl.push_back(g * 1e3);
  }
  auto dist = [](const std::vector<double>& v) {
    double mean = 0;
    for (double x : v) mean += x;
    mean = v.empty() ? 0 : mean / static_cast<double>(v.size());
    return Json{
        {"mean", mean}, {"p50", percentile(v, 50)}, {"p90", percentile(v, 90)}, {"p99", percentile(v, 99)}};
  };
  Json j;
  j["requests"] = results.size();
  j["completed"] = ok;
  j["failed"] = static_cast<int64_t>(results.size()) - ok;
  if (!errors.empty()) j["errors"] = errors;
  j["duration_s"] = dur;
  j["request_throughput"] = ok / dur;
  j["input_tokens"] = in_tok;
  j["output_tokens"] = out_tok;
  j["output_tokens_per_s"] = out_tok / dur;
  j["total_tokens_per_s"] = (in_tok + out_tok) / dur;
  j["cached_token_ratio"] = in_tok > 0 ? static_cast<double>(cached) / static_cast<double>(in_tok) : 0.0;
  j["ttft_ms"] = dist(ttft);
  j["tpot_ms"] = dist(tpot);
  j["itl_ms"] = dist(itl);
  j["e2e_ms"] = dist(e2e);
  return j;
}

Result<std::vector<int64_t>> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      return invalid_argument(std::string(flag) + ": '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) return invalid_argument(std::string(flag) + " is empty");
  return out;
}

Result<std::vector<double>> parse_rate_list(const std::string& s) {
  std::vector<double> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "inf") {
      out.push_back(std::numeric_limits<double>::infinity());
      continue;
    }
    try {
      size_t pos = 0;
      const double v = std::stod(item, &pos);
      if (pos != item.size() || !(v > 0)) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      return invalid_argument("--request-rate: '" + item + "' is not a positive number or inf");
    }
  }
  if (out.empty()) return invalid_argument("--request-rate is empty");
  return out;
}

// The in-process engine + server of --model.
struct InProcess {
  LoadedModel lm;
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<engine::CpuEngine> engine;
  kvcache::MetricsRegistry cache_metrics;
  std::unique_ptr<engine::PrefixCache> cache;  // --cache-compare's cache-on server
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<server::EngineLoopGenerator> gen;
  server::ServerMetrics metrics;
  std::unique_ptr<server::ApiService> service;
  std::unique_ptr<server::HttpServer> http;
  ~InProcess() {
    if (http) http->stop();
    if (loop) loop->stop(std::chrono::milliseconds(0));
  }
};

Result<std::unique_ptr<InProcess>> start_in_process(const BenchServeArgs& a, int64_t max_running,
                                                    bool prefix_cache = false) {
  auto p = std::make_unique<InProcess>();
  const std::string tok_dir = a.tokenizer_dir.empty() ? a.model_dir : a.tokenizer_dir;
  DS41_ASSIGN_OR_RETURN(p->tok, text::Tokenizer::from_model_dir(tok_dir));
  DS41_ASSIGN_OR_RETURN(p->lm, load_cpu_model(a.model_dir, a.tokenizer_dir, a.threads));
  p->engine = std::make_unique<engine::CpuEngine>(p->lm.model.get(), "bench");
  engine::LoopConfig lc;
  lc.max_batch_tokens = a.max_batch_tokens;
  lc.max_running = max_running;
  lc.sample_pool = p->lm.pool.get();
  if (prefix_cache) {
    engine::PrefixCacheConfig pc;
    DS41_ASSIGN_OR_RETURN(pc.model_identity, engine::model_identity(a.model_dir, p->lm.model->kv_layout()));
    DS41_ASSIGN_OR_RETURN(p->cache,
                          engine::PrefixCache::create(pc, SystemClock::instance(), p->cache_metrics));
    lc.prefix_cache = p->cache.get();
  }
  p->loop = std::make_unique<engine::EngineLoop>(p->engine.get(), lc);
  DS41_RETURN_IF_ERROR(p->loop->start());
  p->gen = std::make_unique<server::EngineLoopGenerator>(p->loop.get());
  server::ServiceConfig sc;
  sc.served_model_name = "bench";
  p->service = std::make_unique<server::ApiService>(sc, &p->metrics);
  server::HttpServerConfig hc;
  hc.port = 0;
  hc.max_connections = 512;
  hc.read_timeout_s = hc.write_timeout_s = a.timeout_s;
  p->http = std::make_unique<server::HttpServer>(hc, p->service.get());
  DS41_RETURN_IF_ERROR(p->http->start());
  p->service->set_ready(p->gen.get(), p->tok.get(), p->engine->info().max_context);
  return p;
}

Status run_bench_serve(const BenchServeArgs& a) {
  if (a.url.empty() == a.model_dir.empty()) return invalid_argument("give exactly one of --url and --model");
  if (a.overhead && a.model_dir.empty())
    return invalid_argument("--overhead needs --model (an in-process engine)");
  if (a.cache_compare && (a.model_dir.empty() || a.overhead))
    return invalid_argument("--cache-compare needs --model and excludes --overhead");
  if (a.workload != "random" && a.workload != "agent" && a.workload != "both")
    return invalid_argument("--workload must be random, agent or both");
  if (a.input_len <= 0 || a.output_len <= 0 || a.agent_turns <= 0 || a.token_lo < 0 ||
      a.token_hi <= a.token_lo)
    return invalid_argument("--input-len, --output-len, --agent-turns must be > 0 and --token-range lo < hi");
  DS41_ASSIGN_OR_RETURN(std::vector<int64_t> concs, parse_int_list(a.concurrency, "--concurrency"));
  DS41_ASSIGN_OR_RETURN(std::vector<double> rates, parse_rate_list(a.request_rate));
  signal(SIGPIPE, SIG_IGN);
  const int64_t max_conc = *std::max_element(concs.begin(), concs.end());

  std::unique_ptr<InProcess> proc, proc_on;
  ParsedUrl url, url_on;
  if (!a.model_dir.empty()) {
    std::cerr << "ds41 bench serve: loading " << a.model_dir << "\n";
    DS41_ASSIGN_OR_RETURN(proc, start_in_process(a, std::max(a.max_running, max_conc)));
    url.host = "127.0.0.1";
    url.port = proc->http->port();
    if (a.cache_compare) {
      DS41_ASSIGN_OR_RETURN(proc_on, start_in_process(a, std::max(a.max_running, max_conc), true));
      url_on.host = "127.0.0.1";
      url_on.port = proc_on->http->port();
    }
  } else {
    DS41_ASSIGN_OR_RETURN(url, parse_url(a.url));
  }
  auto http_sender = [&](SteadyClock::time_point t0) -> std::unique_ptr<Sender> {
    return std::make_unique<HttpSender>(url, a.api_key, a.model_name, a.timeout_s, t0);
  };
  auto http_sender_on = [&](SteadyClock::time_point t0) -> std::unique_ptr<Sender> {
    return std::make_unique<HttpSender>(url_on, a.api_key, a.model_name, a.timeout_s, t0);
  };
  auto direct_sender = [&](SteadyClock::time_point t0) -> std::unique_ptr<Sender> {
    return std::make_unique<DirectSender>(proc->loop.get(), t0);
  };
  const TokenRange range{a.token_lo, a.token_hi};

  Json cfg = {{"url", a.url},
              {"model", a.model_dir},
              {"overhead", a.overhead},
              {"cache_compare", a.cache_compare},
              {"workload", a.workload},
              {"concurrency", concs},
              {"request_rate", a.request_rate},
              {"input_len", a.input_len},
              {"output_len", a.output_len},
              {"num_prompts", a.num_prompts},
              {"agent",
               {{"sessions", a.agent_sessions},
                {"turns", a.agent_turns},
                {"system_tokens", a.agent_system},
                {"user_tokens", a.agent_user},
                {"tool_tokens", a.agent_tool}}},
              {"seed", a.seed},
              {"threads", a.threads},
              {"max_batch_tokens", a.max_batch_tokens}};
  Json report = bench_header<Json>("serve", Json{{"engine", a.model_dir.empty() ? "remote" : "cpu"}}, cfg);

  // Warm-up: a few short requests (connections, first-touch allocations) not measured.
  if (a.warmup > 0) {
    auto w = random_workload(a.warmup, 8, 4, a.seed + 999, range);
    (void)run_point(w, poisson_arrivals(a.warmup, 0, 0), a.warmup, http_sender);
    if (proc_on) (void)run_point(w, poisson_arrivals(a.warmup, 0, 0), a.warmup, http_sender_on);
  }

  Json results = Json::array();
  std::vector<std::string> workloads;
  if (a.workload == "random" || a.workload == "both") workloads.push_back("random");
  if (a.workload == "agent" || a.workload == "both") workloads.push_back("agent");
  // Progress on stderr over the measured points, updated between them only; plain lines off a
  // terminal, nothing with -q (the per-point heading is quiet with -q too).
  const uint64_t points = workloads.size() * concs.size() * rates.size();
  uint64_t points_done = 0;
  const LoadProgress::Mode mode = LoadProgress::mode_for_stderr();
  LoadProgress progress(stderr, mode, "ds41 bench serve", "points");
  // On a terminal the progress line is redrawn in place: clear it before other stderr lines.
  const char* clear = mode == LoadProgress::Mode::kTerminal ? "\r\033[2K" : "";
  progress.update(0, points);
  for (const std::string& wl : workloads) {
    for (int64_t conc : concs) {
      for (double rate : rates) {
        std::vector<BenchJob> jobs;
        if (wl == "random") {
          const int64_t n = a.num_prompts > 0 ? a.num_prompts : std::max<int64_t>(16, 4 * conc);
          jobs = random_workload(n, a.input_len, a.output_len, a.seed, range);
        } else {
          AgentTraceConfig tc;
          tc.sessions = a.agent_sessions > 0 ? a.agent_sessions : std::max<int64_t>(4, conc);
          tc.turns = a.agent_turns;
          tc.system_tokens = a.agent_system;
          tc.user_tokens = a.agent_user;
          tc.tool_tokens = a.agent_tool;
          tc.output_tokens = a.output_len;
          tc.seed = a.cache_compare ? a.seed + points_done : a.seed;
          tc.range = range;
          jobs = agent_trace(tc);
        }
        const std::vector<double> at = poisson_arrivals(static_cast<int64_t>(jobs.size()), rate, a.seed);
        Json point = {{"workload", wl},
                      {"concurrency", conc},
                      {"request_rate", std::isinf(rate) ? Json("inf") : Json(rate)}};
        if (mode != LoadProgress::Mode::kQuiet)
          std::cerr << clear << "ds41 bench serve: " << wl << " concurrency " << conc << " rate " << rate
                    << "\n";
        const int64_t off0 = proc ? proc->loop->stats().prefill_tokens_computed : 0;
        Json http = run_point(jobs, at, conc, http_sender);
        if (a.cache_compare) {
          const int64_t off = proc->loop->stats().prefill_tokens_computed - off0;
          const int64_t on0 = proc_on->loop->stats().prefill_tokens_computed;
          Json on = run_point(jobs, at, conc, http_sender_on);
          const int64_t onp = proc_on->loop->stats().prefill_tokens_computed - on0;
          auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
          point["cache_off"] = http;
          point["cache_on"] = on;
          point["prefill_tokens_computed"] = {{"cache_off", off}, {"cache_on", onp}};
          point["cached_token_ratio"] = on["cached_token_ratio"];
          point["ratios_on_over_off"] = {
              {"ttft_p50", ratio(on["ttft_ms"]["p50"].get<double>(), http["ttft_ms"]["p50"].get<double>())},
              {"ttft_p99", ratio(on["ttft_ms"]["p99"].get<double>(), http["ttft_ms"]["p99"].get<double>())},
              {"prefill_tokens_computed", ratio(static_cast<double>(onp), static_cast<double>(off))},
              {"output_tokens_per_s",
               ratio(on["output_tokens_per_s"].get<double>(), http["output_tokens_per_s"].get<double>())}};
        } else if (a.overhead) {
          Json direct = run_point(jobs, at, conc, direct_sender);
          point["server"] = http;
          point["direct"] = direct;
          const double d = direct["output_tokens_per_s"].get<double>();
          point["server_over_direct_tokens_per_s"] =
              d > 0 ? http["output_tokens_per_s"].get<double>() / d : 0.0;
        } else {
          for (auto it = http.begin(); it != http.end(); ++it) point[it.key()] = it.value();
        }
        results.push_back(point);
        if (!a.json) std::cerr << clear << point.dump(2) << "\n";
        progress.update(++points_done, points);
      }
    }
  }
  report["results"] = results;
  std::cout << (a.json ? report.dump(2) : report.dump()) << "\n";
  return ok_status();
}

void setup_bench_serve(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<BenchServeArgs>();
  CLI::App* cmd =
      parent.add_subcommand("serve", "Benchmark an OpenAI-compatible server (TTFT/TPOT/ITL, tokens/s)");
  cmd->add_option("--url", a->url, "Server to benchmark, e.g. http://127.0.0.1:8000");
  cmd->add_option("--model", a->model_dir, "Start the server in-process on this model (CPU engine)");
  cmd->add_option("--tokenizer", a->tokenizer_dir, "Tokenizer folder (default: the model directory)");
  cmd->add_flag("--overhead", a->overhead,
                "Also run the same requests directly on the engine loop; report the ratio");
  cmd->add_flag("--cache-compare", a->cache_compare,
                "With --model: the same requests on a server without and one with the prefix cache, "
                "same run (TTFT, prefill tokens computed, cached ratio)");
  cmd->add_flag("--json", a->json, "Pretty JSON report on stdout (progress on stderr)");
  cmd->add_option("--concurrency", a->concurrency, "Comma-separated client counts (default 1,8,64)");
  cmd->add_option("--request-rate", a->request_rate,
                  "Comma-separated Poisson rates per second or inf (default inf)");
  cmd->add_option("--workload", a->workload, "random, agent or both (default random)");
  cmd->add_option("--num-prompts", a->num_prompts,
                  "Random workload requests per point (default 4 x concurrency, >= 16)");
  cmd->add_option("--input-len", a->input_len, "Prompt tokens of the random workload (default 128)");
  cmd->add_option("--output-len", a->output_len, "Generated tokens per request, exact (default 32)");
  cmd->add_option("--agent-sessions", a->agent_sessions,
                  "Agent sessions per point (default: concurrency, >= 4)");
  cmd->add_option("--agent-turns", a->agent_turns, "Turns per agent session (default 4)");
  cmd->add_option("--agent-system-len", a->agent_system, "Shared system prompt tokens (default 256)");
  cmd->add_option("--agent-user-len", a->agent_user, "User message tokens per turn (default 32)");
  cmd->add_option("--agent-tool-len", a->agent_tool, "Tool output tokens per turn (default 128)");
  cmd->add_option("--token-lo", a->token_lo, "Smallest random token id (default 1000)");
  cmd->add_option("--token-hi", a->token_hi, "Random token ids are below this (default 30000)");
  cmd->add_option("--seed", a->seed, "Workload and arrival seed (default 0)");
  cmd->add_option("--api-key", a->api_key, "Bearer key for --url");
  cmd->add_option("--served-model-name", a->model_name, "'model' field sent (default: none)");
  cmd->add_option("--threads", a->threads, "CPU threads of the in-process engine (default 2)");
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens,
                  "In-process engine: tokens per step (default 2048)");
  cmd->add_option("--max-running", a->max_running,
                  "In-process engine: sequences in flight (default 64, >= concurrency)");
  cmd->add_option("--timeout", a->timeout_s, "Seconds per request before it counts as failed (default 600)");
  cmd->add_option("--warmup", a->warmup, "Unmeasured warm-up requests (default 2)");
  cmd->callback([a, &exit_code] {
    Status s = run_bench_serve(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench serve: " << s.message() << "\n";
      exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace cmd_bench_serve
}  // namespace

DS41_REGISTER_BENCH("serve", ::ds41::cli::cmd_bench_serve::setup_bench_serve);

}  // namespace ds41::cli
