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

// Memory this machine can give a model: `--memory-limit` when given (containers whose
// /proc/meminfo shows the host's memory, or to keep headroom), else MemAvailable from
// /proc/meminfo; 0 when unknown (then nothing is refused).
inline uint64_t available_memory_bytes(uint64_t memory_limit = 0) {
  if (memory_limit > 0) return memory_limit;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// `--memory-limit SIZE`: bytes, or a number with B, KB/MB/GB/TB (powers of 1000) or K/M/G/T,
// KiB/MiB/GiB/TiB (powers of 1024). Empty -> 0 (no limit given).
inline Result<uint64_t> parse_memory_limit(const std::string& s) {
  if (s.empty()) return uint64_t{0};
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    pos = 0;
  }
  if (pos == 0 || !(v > 0))
    return invalid_argument("--memory-limit '" + s +
                            "' is not a positive size (e.g. 20GB, 64GiB, 1000000000)");
  const std::string unit = s.substr(pos);
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12},
                                                          {"K", 1024.},
                                                          {"KiB", 1024.},
                                                          {"M", 1048576.},
                                                          {"MiB", 1048576.},
                                                          {"G", 1073741824.},
                                                          {"GiB", 1073741824.},
                                                          {"T", 1099511627776.},
                                                          {"TiB", 1099511627776.}};
  for (const auto& [name, mul] : kUnits)
    if (unit == name) return static_cast<uint64_t>(v * mul);
  return invalid_argument("--memory-limit '" + s + "': unknown unit '" + unit +
                          "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

// Refuses, before anything is loaded, a model whose weights + KV for `context_tokens` +
// workspaces exceed the available memory (a 510 GB layout-only checkpoint on a 23 GB machine).
inline Status check_model_fits(const std::string& dir, int64_t context_tokens, uint64_t memory_limit = 0) {
  const uint64_t avail = available_memory_bytes(memory_limit);
  if (avail == 0) return ok_status();
  Result<model::MemoryEstimate> e = model::estimate_model_memory(dir, context_tokens);
  if (!e.ok()) return ok_status();  // the loader reports a bad checkpoint with its own message
  return model::check_memory_fits(
      e.value(), avail, memory_limit > 0 ? "under --memory-limit" : "on this machine (MemAvailable)");
}

// act: the activation numerics of the FP8 / FP4 linears (--numerics; quant/act_quant.h).
inline Result<LoadedModel> load_cpu_model(const std::string& dir, const std::string& tokenizer_dir,
                                          int threads, int64_t context_tokens = 4096,
                                          uint64_t memory_limit = 0,
                                          quant::ActNumerics act = quant::ActNumerics::kExact) {
  DS41_RETURN_IF_ERROR(check_model_fits(dir, context_tokens, memory_limit));
  LoadedModel lm;
  lm.pool = std::make_unique<ThreadPool>(threads);
  backends::cpu::CpuBackendOptions bo;
  bo.act = act;
  lm.backend = std::make_unique<backends::cpu::CpuBackend>(lm.pool.get(), bo);
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
