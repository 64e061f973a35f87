// ds41 serve: the OpenAI-compatible HTTP server (src/server) over the engine loop (src/engine).
// Binds 127.0.0.1 unless --host; /health answers 503 while the model loads, then one ready line
// with the URL is printed. SIGTERM / SIGINT: stop accepting generation requests, let running ones
// finish within --shutdown-timeout (the rest are aborted), exit 0.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <iostream>
#include <thread>

#include "cli_registry.h"
#include "core/log.h"
#include "engine_factory.h"
#include "server/api_service.h"
#include "server/http_server.h"
#include "serving_engine.h"

namespace ds41::cli {
namespace {
namespace cmd_serve {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct ServeArgs {
  EngineArgs engine;
  std::string host = "127.0.0.1", api_key, served_model_name;
  int port = 8000, max_connections = 256;
  int64_t max_body_bytes = 8 << 20, max_prompt_tokens = 0, max_tokens_limit = 0;
  double shutdown_timeout_s = 30;
  int read_timeout_s = 30, write_timeout_s = 30, keep_alive_timeout_s = 5;
  bool allow_image_urls = false;  // image_url parts: http:// fetched only with this flag
  std::string max_image_bytes = "20MiB";
  int64_t max_image_pixels = 40000000;
};

Status run_serve(const ServeArgs& a) {
  DS41_RETURN_IF_ERROR(validate_engine_args(a.engine));
  if (a.port < 0 || a.port > 65535) return invalid_argument("--port must be in 0..65535");
  if (a.max_body_bytes <= 0 || a.max_connections <= 0 || a.shutdown_timeout_s < 0)
    return invalid_argument("--max-body-bytes and --max-connections must be > 0, --shutdown-timeout >= 0");
  if (a.keep_alive_timeout_s < 1 || a.keep_alive_timeout_s > 3600)
    return invalid_argument("--keep-alive-timeout must be in 1..3600 seconds");

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
  const std::string name =
      a.served_model_name.empty() ? model_name_from_dir(a.engine.model_dir) : a.served_model_name;
  sc.served_model_name = name;
  sc.images.allow_remote_urls = a.allow_image_urls;
  DS41_ASSIGN_OR_RETURN(sc.images.limits.max_bytes, parse_bytes(a.max_image_bytes, "--max-image-bytes"));
  sc.images.limits.max_pixels = a.max_image_pixels;
  if (sc.images.limits.max_pixels < 1) return invalid_argument("--max-image-pixels must be >= 1");

  // Serve from the start: /health answers 503 until the model is loaded.
  server::ApiService service(sc, &metrics);
  server::HttpServerConfig hc;
  hc.host = a.host;
  hc.port = a.port;
  hc.max_body_bytes = static_cast<size_t>(a.max_body_bytes);
  hc.max_connections = a.max_connections;
  hc.read_timeout_s = a.read_timeout_s;
  hc.write_timeout_s = a.write_timeout_s;
  hc.keep_alive_timeout_s = a.keep_alive_timeout_s;

  server::HttpServer http(hc, &service);
  DS41_RETURN_IF_ERROR(http.start());
  std::cerr << "ds41 serve: listening on " << a.host << ":" << http.port() << " (loading; /health is 503)\n";
  DS41_ASSIGN_OR_RETURN(auto eng, start_serving_engine(a.engine, name, "ds41 serve",
                                                       [&metrics](int64_t seqs, int64_t tokens, double s) {
                                                         metrics.observe_step(seqs, tokens, s);
                                                       }));
  service.set_vision(eng->vision_info());
  metrics.set_cache_metrics(eng->cache_metrics());
  service.set_ready(eng->generator(), eng->tokenizer(), eng->max_context());
  std::printf("ds41 serve: ready on http://%s:%d (model %s, %s)\n", a.host.c_str(), http.port(), name.c_str(),
              device_name(a.engine.device).c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "ds41 serve: %s, draining (up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               a.shutdown_timeout_s);
  service.set_draining();
  const auto shutdown_start = std::chrono::steady_clock::now();
  const auto shutdown_budget = std::chrono::milliseconds(static_cast<int64_t>(a.shutdown_timeout_s * 1000));
  eng->stop(shutdown_budget);
  // The persistent tier's write queue: what the last requests published, so a restarted server
  // finds it. Bounded by what is left of --shutdown-timeout.
  const auto left = shutdown_budget - std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - shutdown_start);
  if (!eng->drain_cache_writes(std::max(left, std::chrono::milliseconds(0))))
    std::fprintf(stderr,
                 "ds41 serve: the KV write queue did not drain within --shutdown-timeout (blocks dropped)\n");
  // Every generation has now finished or been aborted. cpp-httplib's stop() also waits for idle
  // keep-alive connections to reach their idle timeout (5 s), which would hold the exit past
  // --shutdown-timeout; nothing is left to send on them, so after a short grace the process
  // exits without waiting (the persistent tier's queue was drained above).
  auto stopped = std::make_shared<std::promise<void>>();
  std::future<void> http_done = stopped->get_future();
  std::thread([&http, stopped] {
    http.stop();
    stopped->set_value();
  }).detach();
  if (http_done.wait_for(std::chrono::seconds(1)) != std::future_status::ready) {
    std::fprintf(stderr, "ds41 serve: stopped (idle keep-alive connections closed at exit)\n");
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(0);
  }
  std::fprintf(stderr, "ds41 serve: stopped\n");
  return ok_status();
}

void setup_serve(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd =
      parent.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, metrics)");
  cmd->add_option("--model", a->engine.model_dir, "Model directory")->required();
  cmd->add_option("--tokenizer", a->engine.tokenizer_dir,
                  "Folder with tokenizer.json (default: the model directory)");
  add_engine_device_flags(cmd, &a->engine.device);
  cmd->add_option("--host", a->host, "Address to bind (default 127.0.0.1: loopback only)");
  cmd->add_option("--port", a->port, "Port (default 8000; 0 picks a free one)");
  cmd->add_option("--api-key", a->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--served-model-name", a->served_model_name,
                  "Model id in /v1/models (default: folder name)");
  cmd->add_option("--max-batch-tokens", a->engine.max_batch_tokens, "Tokens per engine step (default 2048)");
  cmd->add_option("--max-running", a->engine.max_running, "Sequences in flight (default 64)");
  cmd->add_option("--kv-memory", a->engine.kv_memory, "Sequence state capacity for admission (default 8GiB)");
  cmd->add_option(
      "--memory-limit", a->engine.memory_limit,
      "Memory the model may use (e.g. 20GB, 64GiB); default MemAvailable. Checked before loading");
  cmd->add_option("--max-queue", a->engine.max_queue, "Waiting requests before 429 (default 1024)");
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "Largest request body, else 413 (default 8 MiB)");
  cmd->add_option("--max-prompt-tokens", a->max_prompt_tokens,
                  "Largest prompt (default: the model's context)");
  cmd->add_option("--max-tokens-limit", a->max_tokens_limit,
                  "Largest max_tokens (default: no cap but the context)");
  cmd->add_option("--max-connections", a->max_connections,
                  "Open connections served at once, else 503 (default 256)");
  cmd->add_option("--read-timeout", a->read_timeout_s, "Seconds a silent client is kept (default 30)");
  cmd->add_option("--write-timeout", a->write_timeout_s, "Seconds a non-reading client is kept (default 30)");
  cmd->add_option("--keep-alive-timeout", a->keep_alive_timeout_s,
                  "Seconds an idle keep-alive connection is kept open (default 5; each holds a connection slot)");
  cmd->add_option("--shutdown-timeout", a->shutdown_timeout_s, "Seconds to drain on SIGTERM (default 30)");
  cmd->add_option("--threads", a->engine.threads, "CPU threads (default 2)");
  cmd->add_flag(
      "--allow-image-urls", a->allow_image_urls,
      "Fetch http:// image_url parts (off: only data: URLs; a server must not fetch arbitrary URLs)");
  cmd->add_option("--max-image-bytes", a->max_image_bytes, "Largest encoded image (default 20MiB)");
  cmd->add_option("--max-image-pixels", a->max_image_pixels,
                  "Largest decoded image in pixels (default 40000000)");
  cmd->add_option("--vision-cache", a->engine.vision_cache,
                  "Host memory for the vision-feature cache (default 256MiB; 0 = off)");
  cmd->add_option("--image-encoder-jobs", a->engine.image_encoder_jobs,
                  "Images of cache misses are encoded off the engine loop, concurrently with decode: at most "
                  "this many encoder jobs queued or running (default 8; 0 = encode on the loop thread, "
                  "stalling every request)");
  // Prefix cache (issue 13; README "Prefix cache").
  cmd->add_flag("--no-prefix-cache", a->engine.no_prefix_cache, "Serve without the prefix cache");
  cmd->add_option("--kv-dir", a->engine.kv_dir,
                  "Persistent global-KV tier directory (local SSD or shared filesystem; default: none)");
  cmd->add_option("--kv-disk-capacity", a->engine.kv_disk_capacity, "Byte cap of --kv-dir (default 64GiB)");
  cmd->add_option("--kv-retention", a->engine.kv_retention,
                  "Blocks in --kv-dir younger than this are never evicted (default 72h)");
  cmd->add_option("--kv-redis", a->engine.kv_redis,
                  "SWA snapshot pool in Redis: host:port[,host:port...] (default: in-process DRAM pool)");
  cmd->add_option("--swa-miss", a->engine.swa_miss,
                  "No SWA snapshot for a cached prefix: replay (bounded replay of the last window, "
                  "approximate; default) or recompute (the whole prefix, exact)");
  cmd->add_option("--kv-swa-ttl", a->engine.kv_swa_ttl, "Lifetime of SWA snapshots (default 300s)");
  cmd->add_option("--prefill-mode", a->engine.prefill_mode,
                  "exact (default) or decoder-replay (MODEL_SPEC 4.4: decoder layers on the last window "
                  "of the prompt only; approximate)");
  cmd->add_option("--kv-cache-memory", a->engine.kv_cache_memory,
                  "Engine-memory tier for cached blocks not in use (default 1GiB)");
  cmd->add_option("--kv-dram", a->engine.kv_dram, "Host DRAM tier for cached blocks (default 4GiB)");
  cmd->add_option("--kv-swa-memory", a->engine.kv_swa_memory,
                  "Cap of the in-process SWA snapshot pool (default: 10% of host memory)");
  cmd->add_option("--speculative", a->engine.speculative,
                  "DSpark speculative decoding for greedy requests: dspark | off | auto (default auto = on "
                  "for --device cuda when the checkpoint has draft stages, off on the CPU engine, where a "
                  "speculative step costs more than it saves)");
  cmd->add_option("--speculative-token-budget", a->engine.speculative_token_budget,
                  "Draft candidates verified per engine step over all speculative sequences (MODEL_SPEC "
                  "3.10.9: the most confident prefixes first, by prefix survival; 0 = plain decoding); "
                  "default -1 = no budget (every sequence verifies its whole block)");
  cmd->add_flag("-q,--quiet", a->engine.quiet, "No load progress (the ready line is still printed)");
  cmd->callback([a, &exit_code] {
    Status s = run_serve(*a);
    if (!s.ok()) {
      std::cerr << "ds41 serve: " << s.message() << "\n";
      exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace cmd_serve
}  // namespace

DS41_REGISTER_COMMAND("serve", ::ds41::cli::cmd_serve::setup_serve);

}  // namespace ds41::cli
