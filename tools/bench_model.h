// ds41 CLI: the model a CPU benchmark runs — --model DIR, or a preset generated once with the
// make-checkpoint recipe (seed 1) under --work-dir/PRESET — and the tokenizer beside it or the
// default one (../shared/tokenizer-v41). Shared by bench forward, sampler, vision, prefix-restore
// and speculative. Header-only (tools/ compiles main.cpp and cmd_*.cpp).
#pragma once

#include <filesystem>
#include <string>

#include "core/status.h"
#include "forward_cli_util.h"
#include "model/checkpoint_maker.h"
#include "model/presets.h"
#include "resource_paths.h"

namespace ds41::cli {

struct BenchModelSource {
  std::string model_dir;      // --model (wins when set)
  std::string preset;         // generated when model_dir is empty
  std::string work_dir;       // where presets are generated
  std::string tokenizer_dir;  // --tokenizer; empty: the model's own, else the default
  int threads = 2;
};

// The checkpoint directory: model_dir, or work_dir/preset (generated when absent).
inline Result<std::string> bench_model_dir(const BenchModelSource& s) {
  if (!s.model_dir.empty()) return s.model_dir;
  DS41_ASSIGN_OR_RETURN(model::ModelConfig pc, model::preset_config(s.preset));
  const std::string dir = s.work_dir + "/" + s.preset;
  if (!std::filesystem::exists(dir + "/config.json")) {
    model::MakeCheckpointOptions mo;
    mo.seed = 1;
    DS41_ASSIGN_OR_RETURN(auto made, model::make_checkpoint(dir, pc, mo));
    (void)made;
  }
  return dir;
}

// The tokenizer folder for the model in `dir` ("" = a preset generated on the device): --tokenizer,
// else the model's own (empty: the loaders look in the model folder), else the default one.
inline Result<std::string> bench_tokenizer_dir(const BenchModelSource& s, const std::string& dir) {
  if (!s.tokenizer_dir.empty()) return s.tokenizer_dir;
  if (!dir.empty() && std::filesystem::exists(dir + "/tokenizer.json")) return std::string();
  return default_tokenizer_dir();
}

// bench_model_dir (stored in *dir_out when given), then the CPU reference model with `threads`
// workers.
inline Result<LoadedModel> load_bench_model(const BenchModelSource& s, std::string* dir_out = nullptr) {
  DS41_ASSIGN_OR_RETURN(std::string dir, bench_model_dir(s));
  if (dir_out) *dir_out = dir;
  DS41_ASSIGN_OR_RETURN(const std::string tok_dir, bench_tokenizer_dir(s, dir));
  return load_cpu_model(dir, tok_dir, s.threads);
}

}  // namespace ds41::cli
