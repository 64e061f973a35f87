// ds41 CLI helpers shared by `ds41 score`, `ds41 generate` and `ds41 bench forward`: build the
// CPU reference backend + model, and load a dump as a safetensors file. Header-only (tools/
// compiles only cmd_*.cpp).
#pragma once

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/loader/safetensors_writer.h"
#include "model/memory_estimate.h"
#include "model/model.h"

namespace ds41::cli {

struct LoadedModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<backends::cpu::CpuBackend> backend;
  std::unique_ptr<model::Model> model;
};

// Memory this machine can give a model: MemAvailable from /proc/meminfo (DS41_MEMAVAILABLE_BYTES
// overrides it, for tests); 0 when unknown (then nothing is refused).
inline uint64_t available_memory_bytes() {
  if (const char* v = std::getenv("DS41_MEMAVAILABLE_BYTES")) return std::strtoull(v, nullptr, 10);
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// Refuses, before anything is loaded, a model whose weights + KV for `context_tokens` +
// workspaces exceed the available memory (a 510 GB layout-only checkpoint on a 23 GB machine).
inline Status check_model_fits(const std::string& dir, int64_t context_tokens) {
  const uint64_t avail = available_memory_bytes();
  if (avail == 0) return ok_status();
  Result<model::MemoryEstimate> e = model::estimate_model_memory(dir, context_tokens);
  if (!e.ok()) return ok_status();  // the loader reports a bad checkpoint with its own message
  return model::check_memory_fits(e.value(), avail, "on this machine (MemAvailable)");
}

inline Result<LoadedModel> load_cpu_model(const std::string& dir, const std::string& tokenizer_dir,
                                          int threads, int64_t context_tokens = 4096) {
  DS41_RETURN_IF_ERROR(check_model_fits(dir, context_tokens));
  LoadedModel lm;
  lm.pool = std::make_unique<ThreadPool>(threads);
  lm.backend = std::make_unique<backends::cpu::CpuBackend>(lm.pool.get());
  model::LoadOptions lo;
  lo.tokenizer_dir = tokenizer_dir;
  DS41_ASSIGN_OR_RETURN(lm.model, model::Model::load(dir, lo, lm.backend.get()));
  return lm;
}

// A DumpFn collecting every intermediate into a writer (names prefixed).
inline model::DumpFn dump_into(model::SafetensorsWriter* w, std::string prefix) {
  return [w, prefix](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    w->add_f32(prefix + name, shape, data);
  };
}

}  // namespace ds41::cli
