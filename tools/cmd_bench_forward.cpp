// ds41 bench forward: CPU reference prefill and decode throughput on a preset model
// (`ds41 make-checkpoint` presets, generated on first use under --work-dir) or on --model DIR,
// plus the allocator's global KV bytes per token (layout and measured on the sequence state).
// Prints one JSON object with --json (tools/bench_header.h: git revision, device, config; then
// the numbers). A preset whose random checkpoint would be huge (v41-flash: 510 GB) is refused
// unless --force (tools/checkpoint_guard.h, the same guard as make-checkpoint). The tokenizer
// (Engram vocabulary) defaults to the model directory's when it has one, else the shared V4.1
// tokenizer found from the binary's location (tools/resource_paths.h), never from the cwd.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_header.h"
#include "bench_model.h"
#include "checkpoint_guard.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "forward_cli_util.h"
#include "load_progress.h"
#include "model/checkpoint_maker.h"
#include "model/presets.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_forward {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct BenchArgs {
  std::string preset = "tiny", model_dir, tokenizer_dir, work_dir = "/tmp/ds41-bench";
  int64_t prompt_len = 256, decode = 32;
  int threads = 2;
  bool json = false, force = false;
};

// Usage errors (exit 2): bad numbers, an unknown preset, a preset too big to generate.
Status validate_bench_args(const BenchArgs& a) {
  if (a.prompt_len < 1 || a.decode < 0)
    return invalid_argument("--prompt-len must be >= 1 and --decode >= 0");
  if (a.threads < 1) return invalid_argument("--threads must be >= 1");
  if (!a.model_dir.empty()) return ok_status();
  DS41_ASSIGN_OR_RETURN(model::ModelConfig pc, model::preset_config(a.preset));
  if (std::filesystem::exists(a.work_dir + "/" + a.preset + "/config.json")) return ok_status();
  return guard_random_checkpoint(a.preset, pc, a.force,
                                 "use --preset tiny|small, --model DIR, or --force if you really mean it");
}

Status run_bench(const BenchArgs& a) {
  std::string dir;
  DS41_ASSIGN_OR_RETURN(LoadedModel lm,
                        load_bench_model({a.model_dir, a.preset, a.work_dir, a.tokenizer_dir, a.threads}, &dir));
  model::Model& m = *lm.model;
  const model::ModelConfig& c = m.config();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> d(3,
                                           static_cast<int32_t>(std::min<int64_t>(c.vocab_size, 100000) - 1));
  std::vector<int32_t> ids{static_cast<int32_t>(c.bos_token_id)};
  while (static_cast<int64_t>(ids.size()) < a.prompt_len) ids.push_back(d(rng));
  SystemClock clock;
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  // Progress on stderr over the three phases (warm-up, prefill, decode), updated between the
  // timed windows only; plain lines when stderr is not a terminal, nothing with -q.
  LoadProgress progress(stderr, LoadProgress::mode_for_stderr(), "ds41 bench forward", "phases");
  progress.update(0, 3);
  // Warm-up (dequantized-weight cache) on a throwaway sequence.
  {
    auto w = m.new_sequence();
    std::vector<int32_t> two(ids.begin(), ids.begin() + std::min<size_t>(2, ids.size()));
    DS41_RETURN_IF_ERROR(m.prefill(*w, two, 0, opt).status());
  }
  progress.update(1, 3);
  const int64_t t0 = clock.now_mono_ns();
  DS41_ASSIGN_OR_RETURN(auto out, m.prefill(*st, ids, 0, opt));
  const int64_t t1 = clock.now_mono_ns();
  progress.update(2, 3);
  const int64_t t1d = clock.now_mono_ns();  // the decode window starts after the progress line
  int32_t next =
      static_cast<int32_t>(std::max_element(out.logits.begin(), out.logits.end()) - out.logits.begin());
  for (int64_t i = 0; i < a.decode; ++i) {
    DS41_ASSIGN_OR_RETURN(auto o, m.decode_step(*st, next, opt));
    next = static_cast<int32_t>(std::max_element(o.logits.begin(), o.logits.end()) - o.logits.begin());
  }
  const int64_t t2 = clock.now_mono_ns();
  progress.update(3, 3);
  const double pre_s = (t1 - t0) * 1e-9, dec_s = (t2 - t1d) * 1e-9;
  nlohmann::ordered_json j = bench_header("forward", {{"backend", "cpu-reference"}},
                                          {{"model", a.model_dir.empty() ? "preset:" + a.preset : dir},
                                           {"threads", a.threads},
                                           {"layers", c.num_hidden_layers},
                                           {"hidden", c.hidden_size},
                                           {"vocab", c.vocab_size},
                                           {"experts", c.n_routed_experts},
                                           {"window", c.sliding_window}});
  j["prefill_tokens"] = a.prompt_len;
  j["prefill_s"] = pre_s;
  j["prefill_tok_per_s"] = a.prompt_len / std::max(pre_s, 1e-12);
  j["decode_tokens"] = a.decode;
  j["decode_s"] = dec_s;
  j["decode_tok_per_s"] = a.decode / std::max(dec_s, 1e-12);
  j["kv_bytes_per_token_layout"] = m.kv_layout().global_bytes_per_token();
  j["kv_bytes_per_token_measured"] =
      static_cast<double>(st->global_kv_bytes()) / static_cast<double>(st->position());
  j["bounded_state_bytes"] = st->bounded_bytes();
  j["dequantized_weight_cache_bytes"] = lm.backend->cached_weight_bytes();
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << j.dump(2) << "\n";
  }
  return ok_status();
}

void setup_bench(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd =
      parent.add_subcommand("forward", "CPU reference prefill/decode tokens/s and KV bytes per token");
  cmd->add_option("--preset", a->preset,
                  "tiny | small | v41-flash (generated with random weights under --work-dir; v41-flash needs "
                  "--force)");
  cmd->add_option("--model", a->model_dir, "Use this model directory instead of a preset");
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json, the Engram vocabulary (default: the model's, else the "
                  "shared V4.1 tokenizer beside the source tree)");
  cmd->add_option("--work-dir", a->work_dir,
                  "Where preset checkpoints are generated (default /tmp/ds41-bench)");
  cmd->add_option("--prompt-len", a->prompt_len, "Prefill tokens (default 256)");
  cmd->add_option("--decode", a->decode, "Decode steps (default 32)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->add_flag("--json", a->json, "One-line JSON");
  cmd->add_flag("--force", a->force,
                "Allow generating a huge preset with random weights (v41-flash: 510 GB)");
  cmd->callback([a, &exit_code] {
    if (Status u = validate_bench_args(*a); !u.ok()) {
      std::cerr << "ds41 bench forward: " << u.message() << "\n";
      exit_code = 2;
      return;
    }
    Status s = run_bench(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench forward: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_bench_forward
}  // namespace

DS41_REGISTER_BENCH("forward", ::ds41::cli::cmd_bench_forward::setup_bench);

}  // namespace ds41::cli
