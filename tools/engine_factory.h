// ds41 CLI: the engine behind `generate`, `score`, `serve` and `chat` for a device — the CPU
// reference (engine::CpuEngine over model::Model) or the GPU engine (gpu::CudaEngine over a
// gpu::DeviceModel, only in builds with the GPU engine: DS41_HAVE_CUDA_ENGINE is set by
// tools/CMakeLists.txt when the ds41_gpu target exists; src/ never sees it). Without it,
// `--device cuda` is a clear error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/dspark_score.h"
#include "engine/engine.h"
#include "gpu/device_load_options.h"  // LoadFormat (a plain header: no CUDA needed)
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/model.h"
#include "quant/act_quant.h"

#if __has_include("device_flags.h")
#include "device_flags.h"  // DeviceFlags, add_device_flags, resolve_device (tools/device_flags.h)
#else
namespace CLI {
class App;
}
namespace ds41::cli {
// The interface of tools/device_flags.h until that file is merged (the same fields).
struct DeviceFlags {
  std::string device;  // "" = the default (cuda when the build has the GPU engine and a GPU is found)
  std::string load_format = "auto";
  uint64_t seed = 0;
  bool engram_host_pinned = false;
  std::string numerics = "exact";
};
}  // namespace ds41::cli
#endif

namespace ds41::cli {

// Registers --device, --load-format and --numerics on `cmd` (and, through tools/device_flags.h when it
// is there, --seed unless seed_flag is false, and --engram-host-pinned).
void add_engine_device_flags(CLI::App* cmd, DeviceFlags* f, bool seed_flag = true);
// "cpu" or "cuda" for the flags; InvalidArgument for another name or load format,
// FailedPrecondition for cuda in a build without the GPU engine ("this ds41 was built without
// CUDA"), dummy weights on the CPU.
Result<std::string> engine_device(const DeviceFlags& f);
// --load-format as the device loader's enum.
Result<gpu::LoadFormat> engine_load_format(const DeviceFlags& f);
// engine_device's answer, or "cpu" on error (for messages).
std::string device_name(const DeviceFlags& f);

struct EngineRequest {
  std::string model_dir, tokenizer_dir, model_name, who = "ds41";
  std::string preset;                   // GPU, --load-format dummy without a config.json in model_dir
  int threads = 2;                      // CPU engine
  int64_t context_tokens = 4096;        // CPU memory check before loading
  uint64_t memory_limit = 0;            // CPU memory check: --memory-limit (0: MemAvailable)
  int64_t max_context = 0;              // 0: the config's (the GPU engine caps its workspace at 131072)
  int64_t max_batch_tokens = 2048;      // GPU forward rows
  int64_t max_sequences = 64;           // GPU slots
  int64_t kv_bytes = int64_t{8} << 30;  // GPU KV block pool
  int64_t max_logit_rows = 0;           // GPU logits rows per forward (score: the longest prompt)
  bool quiet = false;                   // no load progress
};

struct EngineHandle {
  std::unique_ptr<engine::Engine> engine;  // owns its model
  model::ModelConfig config;
  model::LayerSchedule schedule;
  ThreadPool* cpu_pool = nullptr;  // the CPU engine's thread pool (idle between forwards); null for the GPU
  const model::Model* cpu_model = nullptr;  // the CPU engine's model; null for the GPU
  // The activation numerics the engine computes with (--numerics); part of the prefix cache's model
  // identity (KV computed under one never serves the other).
  quant::ActNumerics numerics = quant::ActNumerics::kExact;
  // Every row's logits (and records) of `tokens` continuing `seq`, in chunks (0 = as large as
  // the engine takes), with optional image spans (flags per token + the flagged positions' rows,
  // as engine::StepItem; each chunk carries its slice): `ds41 score`. Set for the GPU engine (the
  // CPU path of score uses the model).
  std::function<Result<model::SequenceOutput>(engine::SeqId seq, std::span<const int32_t> tokens,
                                              int64_t chunk, bool record, std::span<const uint8_t> image_span,
                                              std::span<const float> span_embeds)>
      forward_all;
  // MODEL_SPEC 4.4 decoder replay of a fresh `seq` with the kept rows' logits (`ds41 score --replay
  // decoder`); set for the GPU engine.
  std::function<Result<model::SequenceOutput>(engine::SeqId seq, std::span<const int32_t> tokens)>
      decoder_replay_all;
  // `ds41 score` with a {"dspark": ...} input (the golden DSpark arrays, gpu/gpu_dspark_score.h):
  // set for the GPU engine (the CPU path of score runs engine::dspark_score on the model). Needs a
  // fresh engine (it enables speculative decoding).
  std::function<Result<std::vector<engine::NamedArray>>(const engine::DsparkScoreInput& in)> dspark_score;
};

// Loads the model for the device and builds its engine (load progress on stderr unless quiet).
Result<EngineHandle> make_engine(const DeviceFlags& flags, const EngineRequest& req);

}  // namespace ds41::cli
