// ds41 CLI: the engine start-up shared by `ds41 serve` and `ds41 chat --model`: flag values,
// tokenizer + model load (with the load progress line), the CPU engine and its EngineLoop, and
// the server::Generator over it. One function per device; the GPU engine slots in here.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/prefix_cache.h"
#include "engine_factory.h"
#include "kvcache/metrics.h"
#include "server/generator.h"
#include "server/image_inputs.h"
#include "text/tokenizer.h"

namespace ds41::cli {

struct EngineArgs {
  std::string model_dir, tokenizer_dir;
  DeviceFlags device;  // --device, --load-format (engine_factory.h)
  int threads = 2;
  int64_t max_batch_tokens = 2048, max_running = 64, max_queue = 1024;
  std::string kv_memory = "8GiB";
  std::string memory_limit;             // --memory-limit (empty: MemAvailable)
  bool quiet = false;                   // no load progress
  std::string vision_cache = "256MiB";  // --vision-cache: image feature cache (0 = off)
  int64_t image_encoder_jobs = 8;         // --image-encoder-jobs: encoder queue bound (0 = on the loop thread)
  // Prefix cache (issue 13; README "Prefix cache"): on unless no_prefix_cache.
  bool no_prefix_cache = false;
  std::string kv_dir;                      // persistent tier; empty: none
  std::string kv_disk_capacity = "64GiB";  // its byte cap
  std::string kv_retention = "72h";        // never evict younger blocks
  std::string kv_redis;                    // "host:port,..." SWA pool; empty: in-process DRAM pool
  std::string swa_miss = "replay";         // replay | recompute
  std::string kv_swa_ttl = "300s";
  std::string prefill_mode = "exact";    // exact | decoder-replay
  std::string kv_cache_memory = "1GiB";  // engine tier (unpinned blocks)
  std::string kv_dram = "4GiB";          // host DRAM tier
  std::string kv_swa_memory;             // DRAM SWA pool cap; empty: 10 % of host memory
  // --speculative dspark|off|auto: greedy requests decode speculatively (MODEL_SPEC 3.10; their
  // outputs are unchanged). auto = off on the CPU engine (it computes every verified row, so a
  // speculative step is slower there), on for the GPU engine where the checkpoint has draft stages
  // (falls back to off, with a message, if the engine's limits cannot hold a verification).
  std::string speculative = "auto";
  // --speculative-token-budget: candidates verified per engine step over all speculative sequences
  // (MODEL_SPEC 3.10.9 confidence scheduling; LoopConfig::speculative_token_budget). -1: none.
  int64_t speculative_token_budget = -1;
};

// "8GiB", "512MiB", "1000000" -> bytes; the message names `flag`.
Result<int64_t> parse_bytes(const std::string& s, const std::string& flag = "--kv-memory");

// The prefix cache's config from the flags (model_identity: engine::model_identity()).
Result<engine::PrefixCacheConfig> prefix_cache_config(const EngineArgs& a, const std::string& model_identity);

// Checks the flag values before anything is loaded (kInvalidArgument / kUnimplemented).
Status validate_engine_args(const EngineArgs& a);

// A loaded model behind a running engine loop. Destroying it stops the loop and frees the model.
class ServingEngine {
 public:
  virtual ~ServingEngine() = default;
  virtual server::Generator* generator() = 0;
  virtual const text::Tokenizer* tokenizer() const = 0;
  virtual int64_t max_context() const = 0;
  // The served model's vision config for the API (disabled without vision_config).
  virtual server::VisionModelInfo vision_info() const = 0;
  // Lets running requests finish for up to `drain`, aborts the rest, stops the loop.
  virtual void stop(std::chrono::milliseconds drain) = 0;
  // The prefix cache's metrics (Prometheus text appended to /metrics), or null without a cache.
  virtual const kvcache::MetricsRegistry* cache_metrics() const { return nullptr; }
  // Waits up to `timeout` for the persistent tier's write queue to drain (after stop()); true
  // when everything queued was written (or there is no persistent tier).
  virtual bool drain_cache_writes(std::chrono::milliseconds) { return true; }
};

// Observes every engine step (sequences, tokens, seconds): the server's metrics.
using StepObserver = std::function<void(int64_t seqs, int64_t tokens, double seconds)>;

// Loads the tokenizer and the model (progress on stderr, prefixed by `who`, unless quiet) and
// starts the engine loop. `name` is the served model name.
Result<std::unique_ptr<ServingEngine>> start_serving_engine(const EngineArgs& a, const std::string& name,
                                                            const std::string& who,
                                                            StepObserver on_step = nullptr);

// The served model name from a model directory: its last path component.
std::string model_name_from_dir(std::string dir);

}  // namespace ds41::cli
