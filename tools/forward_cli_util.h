// ds41 CLI helpers shared by `ds41 score`, `ds41 generate` and `ds41 bench forward`: build the
// CPU reference backend + model, and load a dump as a safetensors file. Header-only (tools/
// compiles only cmd_*.cpp).
#pragma once

#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/thread_pool.h"
#include "model/loader/safetensors_writer.h"
#include "model/model.h"

namespace ds41::cli {

struct LoadedModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<backends::cpu::CpuBackend> backend;
  std::unique_ptr<model::Model> model;
};

inline Result<LoadedModel> load_cpu_model(const std::string& dir, const std::string& tokenizer_dir,
                                          int threads) {
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
