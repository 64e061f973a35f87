// ds41 CLI: shared engine start-up (see serving_engine.h).
#include "serving_engine.h"

#include <cstdio>

#include "engine/cpu_engine.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache.h"
#include "engine_factory.h"
#include "forward_cli_util.h"
#include "kvcache/store_config.h"
#include "load_progress.h"
#include "model/image_input.h"
#include "server/engine_loop_generator.h"
#include "text/chat_encoding.h"

namespace ds41::cli {

Result<int64_t> parse_bytes(const std::string& s, const std::string& flag) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return invalid_argument(flag + " '" + s + "' is not a size (e.g. 8GiB, 512MiB, 1000000)");
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
    return invalid_argument(flag + " '" + s + "': unknown unit '" + unit + "' (B, KiB, MiB, GiB)");
  if (v <= 0) return invalid_argument(flag + " must be > 0");
  return static_cast<int64_t>(v * mul);
}

Status validate_engine_args(const EngineArgs& a) {
  DS41_RETURN_IF_ERROR(engine_device(a.device).status());
  if (a.speculative != "auto" && a.speculative != "dspark" && a.speculative != "off")
    return invalid_argument("--speculative must be dspark or off, got '" + a.speculative + "'");
  if (a.speculative_token_budget < -1)
    return invalid_argument("--speculative-token-budget must be >= 0, or -1 for no budget (got " +
                            std::to_string(a.speculative_token_budget) + ")");
  if (a.max_queue <= 0 || a.max_running <= 0 || a.max_batch_tokens <= 0 || a.threads <= 0)
    return invalid_argument("--max-queue, --max-running, --max-batch-tokens and --threads must be > 0");
  DS41_RETURN_IF_ERROR(parse_memory_limit(a.memory_limit).status());
  DS41_RETURN_IF_ERROR(parse_bytes(a.kv_memory).status());
  if (a.prefill_mode != "exact" && a.prefill_mode != "decoder-replay")
    return invalid_argument("--prefill-mode must be exact or decoder-replay, got '" + a.prefill_mode + "'");
  if (a.no_prefix_cache) return ok_status();
  auto c = prefix_cache_config(a, "validation");
  return c.ok() ? c->validate() : c.status();
}

Result<engine::PrefixCacheConfig> prefix_cache_config(const EngineArgs& a, const std::string& identity) {
  engine::PrefixCacheConfig c;
  c.model_identity = identity;
  if (a.swa_miss == "replay")
    c.swa_miss = engine::SwaMiss::kReplay;
  else if (a.swa_miss == "recompute")
    c.swa_miss = engine::SwaMiss::kRecompute;
  else
    return invalid_argument("--swa-miss must be replay or recompute, got '" + a.swa_miss + "'");
  auto ttl = kvcache::parse_duration_ns(a.kv_swa_ttl);
  if (!ttl.ok()) return invalid_argument("--kv-swa-ttl '" + a.kv_swa_ttl + "': " + ttl.status().message());
  c.swa_ttl_ns = *ttl;
  DS41_ASSIGN_OR_RETURN(int64_t eng_bytes, parse_bytes(a.kv_cache_memory, "--kv-cache-memory"));
  DS41_ASSIGN_OR_RETURN(int64_t dram_bytes, parse_bytes(a.kv_dram, "--kv-dram"));
  c.engine_tier_bytes = static_cast<uint64_t>(eng_bytes);
  c.dram_tier_bytes = static_cast<uint64_t>(dram_bytes);
  c.decoder_replay_prefill = a.prefill_mode == "decoder-replay";
  if (!a.kv_swa_memory.empty()) {
    DS41_ASSIGN_OR_RETURN(int64_t swa_bytes, parse_bytes(a.kv_swa_memory, "--kv-swa-memory"));
    c.dram_swa.capacity_bytes = static_cast<uint64_t>(swa_bytes);
  }
  if (!a.kv_dir.empty()) {
    c.disk.dir = a.kv_dir;
    auto cap = kvcache::parse_byte_size(a.kv_disk_capacity);
    if (!cap.ok())
      return invalid_argument("--kv-disk-capacity '" + a.kv_disk_capacity + "': " + cap.status().message());
    c.disk.capacity_bytes = *cap;
    auto ret = kvcache::parse_duration_ns(a.kv_retention);
    if (!ret.ok())
      return invalid_argument("--kv-retention '" + a.kv_retention + "': " + ret.status().message());
    c.disk.retention_ns = *ret;
  }
  if (!a.kv_redis.empty()) {
    c.swa_backend = kvcache::SwaBackend::kRedis;
    std::string nodes = a.kv_redis;
    for (size_t b = 0; b <= nodes.size();) {
      size_t e = nodes.find(',', b);
      if (e == std::string::npos) e = nodes.size();
      if (e > b) c.redis.nodes.push_back(nodes.substr(b, e - b));
      b = e + 1;
    }
    for (const std::string& n : c.redis.nodes) {
      std::string host;
      int port = 0;
      Status st = kvcache::parse_host_port(n, &host, &port);
      if (!st.ok()) return invalid_argument("--kv-redis '" + n + "': " + st.message());
    }
  }
  return c;
}

std::string model_name_from_dir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir.substr(dir.find_last_of('/') + 1);
}

namespace {

// Member order is destruction order reversed: the generator and loop go before the engine,
// the engine before the model it computes with.
class CpuServingEngine final : public ServingEngine {
 public:
  std::unique_ptr<text::Tokenizer> tok;
  EngineHandle engine;
  std::unique_ptr<kvcache::MetricsRegistry> cache_registry;
  std::unique_ptr<engine::PrefixCache> cache;  // outlives the loop that uses it
  std::unique_ptr<engine::EngineLoop> loop;
  std::unique_ptr<server::EngineLoopGenerator> gen;
  int64_t context = 0;

  server::Generator* generator() override { return gen.get(); }
  const text::Tokenizer* tokenizer() const override { return tok.get(); }
  int64_t max_context() const override { return context; }
  server::VisionModelInfo vision_info() const override {
    server::VisionModelInfo v;
    const model::ModelConfig& c = engine.config;
    const auto placeholder = tok->token_to_id(text::kImageToken);
    // Images need the engine's vision tower (both engines have one for a model with vision_config).
    if (!c.has_vision || !placeholder || !engine.engine->info().has_vision) return v;
    v.enabled = true;
    v.plan = model::vision_plan_config(c);
    v.image_token_id = static_cast<int32_t>(c.image_token_id);
    v.placeholder_id = *placeholder;
    // The feature-cache key covers everything that changes an image's span rows: the model's
    // vision config (a different checkpoint of the same shape is a different process).
    v.config_key = "p" + std::to_string(v.plan.patch_size) + "d" + std::to_string(v.plan.downsample_ratio) +
                   "m" + std::to_string(v.plan.min_pixels) + "t" + std::to_string(v.plan.max_image_tokens) +
                   "r" + std::to_string(v.plan.max_wh_ratio) + "h" + std::to_string(c.vision_hidden_size) +
                   "l" + std::to_string(c.vision_num_layers);
    return v;
  }
  void stop(std::chrono::milliseconds drain) override { loop->stop(drain); }
  const kvcache::MetricsRegistry* cache_metrics() const override { return cache_registry.get(); }
  bool drain_cache_writes(std::chrono::milliseconds timeout) override {
    return cache ? cache->drain_writes(timeout.count()) : true;
  }
};

}  // namespace

Result<std::unique_ptr<ServingEngine>> start_serving_engine(const EngineArgs& a, const std::string& name,
                                                            const std::string& who, StepObserver on_step) {
  DS41_RETURN_IF_ERROR(validate_engine_args(a));
  DS41_ASSIGN_OR_RETURN(int64_t kv_bytes, parse_bytes(a.kv_memory));
  auto se = std::make_unique<CpuServingEngine>();
  const std::string tok_dir = a.tokenizer_dir.empty() ? a.model_dir : a.tokenizer_dir;
  if (!a.quiet) std::fprintf(stderr, "%s: loading tokenizer from %s\n", who.c_str(), tok_dir.c_str());
  DS41_ASSIGN_OR_RETURN(se->tok, text::Tokenizer::from_model_dir(tok_dir));
  if (!a.quiet)
    std::fprintf(stderr, "%s: loading model from %s (%s)\n", who.c_str(), a.model_dir.c_str(),
                 device_name(a.device).c_str());
  EngineRequest req;
  req.model_dir = a.model_dir;
  req.tokenizer_dir = a.tokenizer_dir;
  req.model_name = name;
  req.who = who;
  req.threads = a.threads;
  req.max_batch_tokens = a.max_batch_tokens;
  req.max_sequences = a.max_running;
  req.kv_bytes = kv_bytes;
  req.quiet = a.quiet;
  DS41_ASSIGN_OR_RETURN(req.memory_limit, parse_memory_limit(a.memory_limit));
  DS41_ASSIGN_OR_RETURN(se->engine, make_engine(a.device, req));
  engine::LoopConfig lc;
  lc.max_batch_tokens = a.max_batch_tokens;
  lc.max_running = a.max_running;
  lc.kv_memory_bytes = kv_bytes;
  lc.max_queue = a.max_queue;
  lc.sample_pool = se->engine.cpu_pool;  // the CPU engine's pool is idle between its forwards (null: GPU)
  DS41_ASSIGN_OR_RETURN(lc.vision_cache_bytes, parse_bytes(a.vision_cache, "--vision-cache"));
  lc.image_encoder_jobs = a.image_encoder_jobs;
  // The prefix cache needs the engine's state export / import and replay_window, decoder-replay
  // prefill (MODEL_SPEC 4.4) Engine::prefill_decoder_replay: both engines have them.
  lc.decoder_replay_prefill = a.prefill_mode == "decoder-replay";
  if (!a.no_prefix_cache) {
    DS41_ASSIGN_OR_RETURN(model::KvLayout layout, model::make_kv_layout(se->engine.config, se->engine.schedule));
    DS41_ASSIGN_OR_RETURN(std::string identity, engine::model_identity(a.model_dir, layout));
    // KV computed with FP8 activations never serves an exact request nor the reverse (the exact
    // identity keeps its form: caches written before --numerics stay valid).
    if (se->engine.numerics != quant::ActNumerics::kExact)
      identity += std::string(" numerics=") + quant::act_numerics_name(se->engine.numerics);
    DS41_ASSIGN_OR_RETURN(engine::PrefixCacheConfig pcc, prefix_cache_config(a, identity));
    se->cache_registry = std::make_unique<kvcache::MetricsRegistry>();
    DS41_ASSIGN_OR_RETURN(se->cache,
                          engine::PrefixCache::create(pcc, SystemClock::instance(), *se->cache_registry));
    lc.prefix_cache = se->cache.get();
    if (!a.quiet)
      std::fprintf(stderr, "%s: prefix cache on (SWA pool %s, persistent tier %s, --swa-miss %s)\n",
                   who.c_str(), a.kv_redis.empty() ? "dram" : a.kv_redis.c_str(),
                   a.kv_dir.empty() ? "off" : a.kv_dir.c_str(), a.swa_miss.c_str());
  }
  // auto (issue 17): on for the GPU engine when the checkpoint has draft stages (a verification of
  // B + 1 rows costs about one memory-bound decode step there), off on the CPU engine (where a
  // speculative step costs more than it saves; docs/dspark.md).
  const bool gpu = se->engine.engine->info().device.rfind("cuda", 0) == 0;
  const bool spec_auto = a.speculative == "auto" && gpu && se->engine.config.num_nextn_predict_layers > 0;
  if (a.speculative == "dspark" || spec_auto) {
    Status st = se->engine.engine->enable_speculative();
    if (!st.ok() && a.speculative == "dspark") return st.with_context("--speculative dspark");
    if (st.ok()) {
      lc.speculative = true;
      lc.speculative_token_budget = a.speculative_token_budget;
      if (!a.quiet) std::fprintf(stderr, "%s: DSpark speculative decoding on (greedy requests)\n", who.c_str());
    } else if (!a.quiet) {
      std::fprintf(stderr, "%s: DSpark speculative decoding off (--speculative auto): %s\n", who.c_str(),
                   st.message().c_str());
    }
  }
  se->loop = std::make_unique<engine::EngineLoop>(se->engine.engine.get(), lc);
  if (on_step) se->loop->on_step = std::move(on_step);
  DS41_RETURN_IF_ERROR(se->loop->start());
  se->gen = std::make_unique<server::EngineLoopGenerator>(se->loop.get());
  se->context = se->engine.engine->info().max_context;
  return std::unique_ptr<ServingEngine>(std::move(se));
}

}  // namespace ds41::cli
