// ds41 bench prefix-restore: restoring a long prefix from the persistent tier vs recomputing it
// (issue 13), same run, on the CPU engine (default) or the GPU engine (--device cuda, loaded as
// `serve --device cuda` loads it: tools/engine_factory.h; --load-format dummy --preset
// v41-flash-slice generates released-width weights on the device). A prompt of --tokens random
// ids is prefilled through the engine (the recompute: all but the last token in --chunk-token
// steps, then the last token for its logits); its global-KV blocks go to a fresh --kv-dir (fsync
// on) through the prefix cache and its SWA snapshot at the last-but-one position into the DRAM
// pool. Then the same request is served by restore:
//   exact:  blocks read from disk (engine and DRAM tiers off) + the SWA snapshot, then the last
//           token; its logits are checked bit for bit against the recompute's (both engines are
//           deterministic and continue an imported state exactly);
//   replay: blocks from disk, no snapshot (a new SWA pool) -> Encoder SWA Bounded Replay of the
//           last window (MODEL_SPEC 4.5), then the rest.
// Medians over --repeats; ratios recompute / restore. The page cache holds the blocks (written a
// moment before) unless --drop-caches (needs root) drops it before each restore. On cuda the
// engine's context is --tokens (--tokens 131072 is the 128K target), its forward takes
// --chunk rows, and its KV pool holds two sequences of --tokens.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "bench_header.h"
#include "bench_model.h"
#include "cli_registry.h"
#include "engine/cpu_engine.h"
#include "engine/prefix_cache.h"
#include "engine_factory.h"
#include "forward_cli_util.h"
#include "model/checkpoint_maker.h"
#include "model/kv_layout.h"
#include "model/presets.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_prefix_restore {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct PrefixRestoreArgs {
  std::string preset = "small", model_dir, tokenizer_dir, work_dir = "/tmp/ds41-bench", dir = "/tmp";
  int64_t tokens = 2048, chunk = 2048;
  int threads = 2, repeats = 3;
  bool json = false, drop_caches = false;
  DeviceFlags device;  // --device (default cpu here), --load-format, --seed, --engram-host-pinned
};

// The engine the benchmark measures, with what it needs kept alive.
struct BenchEngine {
  LoadedModel cpu_model;                   // --device cpu: the reference model
  std::unique_ptr<engine::CpuEngine> cpu;  // over cpu_model
  EngineHandle gpu;                        // --device cuda (engine_factory.h)
  engine::Engine* engine = nullptr;
  model::ModelConfig config;
  int64_t global_bytes_per_token = 0;
  std::string model;              // for the report
  std::string dir;                // the checkpoint folder ("" for a device preset)
  nlohmann::ordered_json device;  // the report's device fields
};

Result<BenchEngine> load_engine(const PrefixRestoreArgs& a) {
  BenchEngine b;
  DS41_ASSIGN_OR_RETURN(const std::string device, engine_device(a.device));
  const BenchModelSource src{a.model_dir, a.preset, a.work_dir, a.tokenizer_dir, a.threads};
  if (device == "cpu") {
    std::string dir;
    DS41_ASSIGN_OR_RETURN(b.cpu_model, load_bench_model(src, &dir));
    b.cpu = std::make_unique<engine::CpuEngine>(b.cpu_model.model.get(), "bench");
    b.engine = b.cpu.get();
    b.config = b.cpu_model.model->config();
    b.global_bytes_per_token = b.cpu_model.model->kv_layout().global_bytes_per_token();
    b.model = a.model_dir.empty() ? "preset:" + a.preset : dir;
    b.dir = dir;
    b.device = {{"backend", "cpu-reference"}};
    return b;
  }
  // The GPU engine: --model DIR; or with --load-format dummy a preset generated on the device; or
  // (auto / safetensors) the preset's checkpoint generated under --work-dir as on the CPU.
  DS41_ASSIGN_OR_RETURN(const gpu::LoadFormat fmt, engine_load_format(a.device));
  std::string dir = a.model_dir;
  if (dir.empty() && fmt != gpu::LoadFormat::kDummy) {
    DS41_ASSIGN_OR_RETURN(dir, bench_model_dir(src));
  }
  EngineRequest req;
  req.model_dir = dir;
  req.preset = a.model_dir.empty() ? a.preset : "";
  DS41_ASSIGN_OR_RETURN(req.tokenizer_dir, bench_tokenizer_dir(src, dir));
  req.model_name = "bench";
  req.who = "ds41 bench prefix-restore";
  req.max_context = a.tokens;
  req.max_batch_tokens = a.chunk;
  req.max_sequences = 2;
  req.quiet = a.json;
  // Pages for two sequences of --tokens (the recompute's and the restore's), whatever the page
  // rounding: the global bytes per token of the widest config (890 B) x 3 x tokens, >= 256 MiB.
  req.kv_bytes = std::max<int64_t>(int64_t{256} << 20, 3 * 890 * a.tokens);
  DS41_ASSIGN_OR_RETURN(b.gpu, make_engine(a.device, req));
  b.engine = b.gpu.engine.get();
  b.config = b.gpu.config;
  DS41_ASSIGN_OR_RETURN(const model::KvLayout layout, model::make_kv_layout(b.gpu.config, b.gpu.schedule));
  b.global_bytes_per_token = layout.global_bytes_per_token();
  b.model = a.model_dir.empty() ? "preset:" + a.preset : dir;
  b.dir = dir.empty() ? b.model : dir;
  b.device = {{"backend", "cuda-engine"},
              {"gpu", b.engine->info().device},
              {"load_format", a.device.load_format},
              {"max_step_tokens", a.chunk}};
  return b;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool drop_page_cache() {
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "1\n";
  return static_cast<bool>(f);
}

Status run_prefix_restore(const PrefixRestoreArgs& a) {
  if (a.tokens < 130 || a.repeats < 1 || a.threads < 1 || a.chunk < 1)
    return invalid_argument("--tokens must be >= 130, --repeats, --threads and --chunk >= 1");
  if (a.model_dir.empty() && a.preset == "v41-flash" && a.device.load_format != "dummy")
    return invalid_argument("--preset v41-flash: use --model DIR (510 GB of weights) or --load-format dummy");
  DS41_ASSIGN_OR_RETURN(BenchEngine be, load_engine(a));
  const model::ModelConfig& c = be.config;
  engine::Engine& eng = *be.engine;
  const bool on_gpu = be.cpu == nullptr;
  std::mt19937 rng(4321);
  std::uniform_int_distribution<int32_t> d(3,
                                           static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 100000) - 1));
  std::vector<int32_t> ids{static_cast<int32_t>(c.bos_token_id)};
  while (static_cast<int64_t>(ids.size()) < a.tokens) ids.push_back(d(rng));
  const int64_t N = a.tokens;
  const std::span<const int32_t> T(ids);

  // Runs tokens [from, N) of `seq` in chunks; returns the last row's logits.
  auto prefill = [&](engine::SeqId seq, int64_t from, int64_t to) -> Result<std::vector<float>> {
    engine::StepOutput out;
    for (int64_t p = from; p < to;) {
      const int64_t n = std::min(a.chunk, to - p);
      std::vector<engine::StepItem> items = {{seq, T.subspan(p, n), p + n == to}};
      DS41_RETURN_IF_ERROR(eng.step(items, &out));
      p += n;
    }
    return out.logits;
  };
  {  // warm-up: dequantized weights (CPU); a full chunk and a decode step on the GPU, so library
     // initialisation (tensor-core linears, GEMV) stays out of the timed region
    DS41_ASSIGN_OR_RETURN(engine::SeqId w, eng.create_sequence());
    const int64_t n = on_gpu ? std::min(a.chunk, N - 2) : 2;
    DS41_RETURN_IF_ERROR(prefill(w, 0, n).status());
    if (on_gpu) DS41_RETURN_IF_ERROR(prefill(w, n, n + 1).status());
    DS41_RETURN_IF_ERROR(eng.free_sequence(w));
  }
  const std::string kv_dir = a.dir + "/ds41-bench-prefix-restore." + std::to_string(getpid());
  std::filesystem::remove_all(kv_dir);
  kvcache::MetricsRegistry metrics;
  engine::PrefixCacheConfig pcfg;
  pcfg.model_identity = "bench-prefix-restore " + be.dir;
  pcfg.engine_tier_bytes = 0;  // blocks must come up from the persistent tier
  pcfg.dram_tier_bytes = 0;
  pcfg.disk.dir = kv_dir;
  pcfg.disk.capacity_bytes = uint64_t{64} << 30;
  DS41_ASSIGN_OR_RETURN(auto cache, engine::PrefixCache::create(pcfg, SystemClock::instance(), metrics));

  std::vector<double> t_rec, t_exact, t_replay;
  bool bit_identical = true, dropped = false;
  int64_t restored_exact = 0, restored_replay = 0;
  for (int r = 0; r < a.repeats; ++r) {
    // Recompute (and publish, untimed).
    DS41_ASSIGN_OR_RETURN(engine::SeqId s, eng.create_sequence());
    engine::CacheSession sess;
    sess.request_id = 1;
    auto t0 = std::chrono::steady_clock::now();
    DS41_RETURN_IF_ERROR(prefill(s, 0, N - 1).status());
    auto t1 = std::chrono::steady_clock::now();
    cache->publish_blocks(eng, s, T, N - 1, sess);
    cache->publish_snapshot(eng, s, T.first(N - 1), sess);
    auto t2 = std::chrono::steady_clock::now();
    DS41_ASSIGN_OR_RETURN(std::vector<float> ref, prefill(s, N - 1, N));
    auto t3 = std::chrono::steady_clock::now();
    t_rec.push_back(std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count());
    cache->release(sess);
    DS41_RETURN_IF_ERROR(eng.free_sequence(s));
    if (!cache->drain_writes(600000)) return io_error("the persistent tier did not drain");

    for (int mode = 0; mode < 2; ++mode) {
      // mode 0: exact (snapshot in the pool); mode 1: replay (a cache over the same directory
      // with an empty SWA pool).
      std::unique_ptr<engine::PrefixCache> other;
      kvcache::MetricsRegistry m2;
      engine::PrefixCache* pc = cache.get();
      if (mode == 1) {
        DS41_ASSIGN_OR_RETURN(other, engine::PrefixCache::create(pcfg, SystemClock::instance(), m2));
        pc = other.get();
      }
      if (a.drop_caches) dropped = drop_page_cache();
      DS41_ASSIGN_OR_RETURN(engine::SeqId q, eng.create_sequence());
      engine::CacheSession qs;
      qs.request_id = 2;
      auto u0 = std::chrono::steady_clock::now();
      engine::RestoreResult rr = pc->restore(eng, q, T, N - 1, N, qs);
      DS41_ASSIGN_OR_RETURN(std::vector<float> got, prefill(q, rr.tokens, N));
      auto u1 = std::chrono::steady_clock::now();
      (mode == 0 ? t_exact : t_replay).push_back(std::chrono::duration<double>(u1 - u0).count());
      (mode == 0 ? restored_exact : restored_replay) = rr.tokens;
      if (mode == 0)
        bit_identical = bit_identical && got.size() == ref.size() &&
                        std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)) == 0;
      pc->release(qs);
      DS41_RETURN_IF_ERROR(eng.free_sequence(q));
    }
  }
  std::filesystem::remove_all(kv_dir);
  const double rec = median(t_rec), ex = median(t_exact), rp = median(t_replay);
  nlohmann::ordered_json j =
      bench_header("prefix-restore", be.device,
                   {{"model", be.model},
                    {"device", on_gpu ? "cuda" : "cpu"},
                    {"layers", c.num_hidden_layers},
                    {"hidden", c.hidden_size},
                    {"threads", a.threads},
                    {"tokens", N},
                    {"chunk", a.chunk},
                    {"repeats", a.repeats},
                    {"window", c.sliding_window},
                    {"page_cache", dropped ? "dropped before each restore" : "warm (blocks just written)"}});
  j["global_kv_bytes_per_token"] = be.global_bytes_per_token;
  j["recompute_s"] = rec;
  j["restore_exact_s"] = ex;
  j["restore_exact_tokens"] = restored_exact;
  j["restore_exact_logits_bit_identical"] = bit_identical;
  j["restore_replay_s"] = rp;
  j["restore_replay_tokens"] = restored_replay;
  j["ratio_recompute_over_restore_exact"] = ex > 0 ? rec / ex : 0.0;
  j["ratio_recompute_over_restore_replay"] = rp > 0 ? rec / rp : 0.0;
  std::cout << (a.json ? j.dump() : j.dump(2)) << "\n";
  return bit_identical ? ok_status()
                       : internal_error("the exact restore's logits differ from the recompute's");
}

void setup_prefix_restore(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<PrefixRestoreArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "prefix-restore",
      "Restore a long prefix from the persistent KV tier vs recompute it (CPU or GPU engine)");
  cmd->add_option("--preset", a->preset,
                  "tiny or small (default small; generated under --work-dir); with --device cuda "
                  "--load-format dummy any preset, e.g. v41-flash-slice (weights generated on the device)");
  cmd->add_option("--model", a->model_dir, "Use this model directory instead of a preset");
  cmd->add_option("--tokenizer", a->tokenizer_dir, "Tokenizer folder (default: the model's or ../shared)");
  cmd->add_option("--work-dir", a->work_dir,
                  "Where preset checkpoints are generated (default /tmp/ds41-bench)");
  cmd->add_option("--dir", a->dir, "The persistent tier is a fresh directory inside this one (default /tmp)");
  cmd->add_option("--tokens", a->tokens, "Prompt tokens (default 2048)");
  cmd->add_option("--chunk", a->chunk, "Prefill chunk tokens (default 2048; cuda: the forward's rows)");
  cmd->add_option("--repeats", a->repeats, "Repeats; medians reported (default 3)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->add_flag("--drop-caches", a->drop_caches, "Drop the page cache before each restore (root)");
  cmd->add_flag("--json", a->json, "One-line JSON");
  a->device.device = "cpu";
  add_engine_device_flags(cmd, &a->device);
  cmd->get_option("--device")->description("cpu (default) | cuda (the GPU engine)");
  cmd->callback([a, &exit_code] {
    Status s = run_prefix_restore(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench prefix-restore: " << s.message() << "\n";
      exit_code = s.code() == StatusCode::kInvalidArgument ? 2 : 1;
    }
  });
}

}  // namespace cmd_bench_prefix_restore
}  // namespace

DS41_REGISTER_BENCH("prefix-restore", ::ds41::cli::cmd_bench_prefix_restore::setup_prefix_restore);

}  // namespace ds41::cli
