// ds41 serve: the OpenAI-compatible HTTP server (src/server) over the engine loop (src/engine).
// Binds 127.0.0.1 unless --host; /health answers 503 while the model loads, then one ready line
// with the URL is printed. SIGTERM / SIGINT: stop accepting generation requests, let running ones
// finish within --shutdown-timeout (the rest are aborted), exit 0.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli_registry.h"
#include "core/log.h"
#include "forward_cli_util.h"
#include "server/api_service.h"
#include "server/http_server.h"
#include "text/tokenizer.h"

#include "engine/cpu_engine.h"
#include "server/engine_loop_generator.h"

namespace ds41::cli {
namespace {

struct ServeArgs {
  std::string model_dir, tokenizer_dir, device = "cpu", host = "127.0.0.1", api_key, served_model_name;
  int port = 8000, threads = 2, max_connections = 256;
  int64_t max_batch_tokens = 2048, max_running = 64, max_queue = 1024;
  std::string kv_memory = "8GiB";
  int64_t max_body_bytes = 8 << 20, max_prompt_tokens = 0, max_tokens_limit = 0;
  double shutdown_timeout_s = 30;
  int read_timeout_s = 30, write_timeout_s = 30;
};

Result<int64_t> parse_bytes(const std::string& s) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return invalid_argument("--kv-memory '" + s + "' is not a size (e.g. 8GiB, 512MiB, 1000000)");
  }
  const std::string unit = s.substr(pos);
  double mul = 1;
  if (unit == "" || unit == "B")
    mul = 1;
  else if (unit == "KiB" || unit == "K")
    mul = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mul = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    mul = 1024.0 * 1024 * 1024;
  else
    return invalid_argument("--kv-memory '" + s + "': unknown unit '" + unit + "' (B, KiB, MiB, GiB)");
  if (v <= 0) return invalid_argument("--kv-memory must be > 0");
  return static_cast<int64_t>(v * mul);
}

// What serving needs from an engine: the Generator the API talks to, the context length and a
// drain-then-stop. Engine construction is isolated here (one function per device).
struct ServingEngine {
  virtual ~ServingEngine() = default;
  virtual server::Generator* generator() = 0;
  virtual int64_t max_context() const = 0;
  virtual void stop(std::chrono::milliseconds drain) = 0;
};

struct CpuServingEngine final : ServingEngine {
  std::unique_ptr<engine::CpuEngine> engine;
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<server::EngineLoopGenerator> gen;
  int64_t context = 0;
  server::Generator* generator() override { return gen.get(); }
  int64_t max_context() const override { return context; }
  void stop(std::chrono::milliseconds drain) override { loop->stop(drain); }
};

Result<std::unique_ptr<ServingEngine>> start_cpu_engine(const ServeArgs& a, model::Model* m, const std::string& name,
                                                        int64_t kv_bytes,
                                                        server::ServerMetrics* metrics) {
  auto se = std::make_unique<CpuServingEngine>();
  se->engine = std::make_unique<engine::CpuEngine>(m, name);
  engine::LoopConfig lc;
  lc.max_batch_tokens = a.max_batch_tokens;
  lc.max_running = a.max_running;
  lc.kv_memory_bytes = kv_bytes;
  lc.max_queue = a.max_queue;
  se->loop = std::make_unique<engine::EngineLoop>(se->engine.get(), lc);
  se->loop->on_step = [metrics](int64_t seqs, int64_t tokens, double s) {
    metrics->observe_step(seqs, tokens, s);
  };
  DS41_RETURN_IF_ERROR(se->loop->start());
  se->gen = std::make_unique<server::EngineLoopGenerator>(se->loop.get());
  se->context = se->engine->info().max_context;
  return std::unique_ptr<ServingEngine>(std::move(se));
}

Status run_serve(const ServeArgs& a) {
  if (a.device == "cuda")
    return unimplemented("--device cuda: the GPU engine is not available yet; use --device cpu");
  if (a.device != "cpu") return invalid_argument("--device must be cpu or cuda, got '" + a.device + "'");
  if (a.port < 0 || a.port > 65535) return invalid_argument("--port must be in 0..65535");
  if (a.max_body_bytes <= 0 || a.max_connections <= 0 || a.max_queue <= 0 || a.max_running <= 0 ||
      a.max_batch_tokens <= 0 || a.threads <= 0 || a.shutdown_timeout_s < 0)
    return invalid_argument(
        "--max-body-bytes, --max-connections, --max-queue, --max-running, --max-batch-tokens "
        "and --threads must be > 0, --shutdown-timeout >= 0");
  DS41_ASSIGN_OR_RETURN(int64_t kv_bytes, parse_bytes(a.kv_memory));

  // SIGTERM/SIGINT are taken by sigwait below: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

  server::ServerMetrics metrics;
  server::ServiceConfig sc;
  sc.api_key = a.api_key;
  sc.max_prompt_tokens = a.max_prompt_tokens;
  sc.max_tokens_limit = a.max_tokens_limit;
  std::string name = a.served_model_name;
  if (name.empty()) {
    std::string d = a.model_dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    name = d.substr(d.find_last_of('/') + 1);
  }
  sc.served_model_name = name;

  // Serve from the start: /health answers 503 until the model is loaded.
  server::ApiService service(sc, &metrics);
  server::HttpServerConfig hc;
  hc.host = a.host;
  hc.port = a.port;
  hc.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
  hc.max_connections = a.max_connections;
  hc.read_timeout_s = a.read_timeout_s;
  hc.write_timeout_s = a.write_timeout_s;

  server::HttpServer http(hc, &service);
  DS41_RETURN_IF_ERROR(http.start());
  std::cerr << "ds41 serve: listening on " << a.host << ":" << http.port() << " (loading; /health is 503)\n";
  const std::string tok_dir = a.tokenizer_dir.empty() ? a.model_dir : a.tokenizer_dir;
  std::cerr << "ds41 serve: loading tokenizer from " << tok_dir << "\n";
  DS41_ASSIGN_OR_RETURN(auto tok, text::Tokenizer::from_model_dir(tok_dir));
  std::cerr << "ds41 serve: loading model from " << a.model_dir << " (" << a.threads << " threads)\n";
  const auto t0 = std::chrono::steady_clock::now();
  DS41_ASSIGN_OR_RETURN(LoadedModel lm, load_cpu_model(a.model_dir, a.tokenizer_dir, a.threads));
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "ds41 serve: model loaded in %.1f s\n", load_s);

  DS41_ASSIGN_OR_RETURN(auto eng, start_cpu_engine(a, lm.model.get(), name, kv_bytes, &metrics));
  service.set_ready(eng->generator(), tok.get(), eng->max_context());
  std::printf("ds41 serve: ready on http://%s:%d (model %s, %s)\n", a.host.c_str(), http.port(), name.c_str(),
              a.device.c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "ds41 serve: %s, draining (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               a.shutdown_timeout_s);
  service.set_draining();
  eng->stop(std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_timeout_s * 1000)));
  http.stop();
  std::fprintf(stderr, "ds41 serve: stopped\n");
  return ok_status();
}

void setup_serve(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd =
      parent.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, metrics)");
  cmd->add_option("--model", a->model_dir, "Model directory")->required();
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json (default: the model directory)");
  cmd->add_option("--device", a->device, "cpu (default) or cuda (not available yet)");
  cmd->add_option("--host", a->host, "Address to bind (default 127.0.0.1: loopback only)");
  cmd->add_option("--port", a->port, "Port (default 8000; 0 picks a free one)");
  cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--served-model-name", a->served_model_name,
                  "Model id in /v1/models (default: folder name)");
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "Tokens per engine step (default 2048)");
  cmd->add_option("--max-running", a->max_running, "Sequences in flight (default 64)");
  cmd->add_option("--kv-memory", a->kv_memory, "Sequence state capacity for admission (default 8GiB)");
  cmd->add_option("--max-queue", a->max_queue, "Waiting requests before 429 (default 1024)");
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "Largest request body, else 413 (default 8 MiB)");
  cmd->add_option("--max-prompt-tokens", a->max_prompt_tokens,
                  "Largest prompt (default: the model's context)");
  cmd->add_option("--max-tokens-limit", a->max_tokens_limit,
                  "Largest max_tokens (default: no cap but the context)");
  cmd->add_option("--max-connections", a->max_connections,
                  "Open connections served at once, else 503 (default 256)");
  cmd->add_option("--read-timeout", a->read_timeout_s, "Seconds a silent client is kept (default 30)");
  cmd->add_option("--write-timeout", a->write_timeout_s, "Seconds a non-reading client is kept (default 30)");
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout_s, "Seconds to drain on SIGTERM (default 30)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->callback([a, &exit_code] {
    Status s = run_serve(*a);
    if (!s.ok()) {
      std::cerr << "ds41 serve: " << s.message() << "\n";
      exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace

DS41_REGISTER_COMMAND("serve", setup_serve);

}  // namespace ds41::cli
