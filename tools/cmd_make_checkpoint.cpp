// ds41 make-checkpoint: write a checkpoint in the official format (MODEL_SPEC 1, 2) for a preset:
// random weights with sane scales (model/random_weights.h), or with --layout-only real headers and
// sparse holes instead of data (the 510 GB released layout costs a few MB of disk).
//   ds41 make-checkpoint --preset tiny|small|v41-flash|v41-flash-slice --seed N --out DIR [--layout-only]
//   [--shards K]
//                        [--tokenizer DIR]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "checkpoint_guard.h"
#include "cli_registry.h"
#include "core/log.h"
#include "load_progress.h"
#include "model/checkpoint_maker.h"
#include "model/presets.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_make_checkpoint {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct MakeArgs {
  std::string preset, out;
  std::string tokenizer_dir;  // copy tokenizer files in and widen the vocabulary to cover them
  uint64_t seed = 1;
  int shards = 0;  // 0: the preset's default (48 for v41-flash, 1 otherwise)
  bool layout_only = false;
  bool force = false;
};

int run_make_checkpoint(const MakeArgs& a) {
  auto cfg = model::preset_config(a.preset);
  if (!cfg.ok()) {
    std::cerr << "ds41 make-checkpoint: " << cfg.status().message() << "\n";
    return 2;
  }
  if (!a.layout_only) {
    Status g = guard_random_checkpoint(
        a.preset, *cfg, a.force,
        "pass --layout-only for the sparse layout (a few MB), or --force if you really mean it");
    if (!g.ok()) {
      std::cerr << "ds41 make-checkpoint: " << g.message() << "\n";
      return 2;
    }
  }
  if (!a.tokenizer_dir.empty()) {
    // The checkpoint must accept every id the tokenizer can produce (the tiny preset's own
    // vocabulary of 2048 ids keeps the golden structure but cannot embed real text).
    auto tok = text::Tokenizer::from_model_dir(a.tokenizer_dir);
    if (!tok.ok()) {
      std::cerr << "ds41 make-checkpoint: --tokenizer: " << tok.status().message() << "\n";
      return 2;
    }
    cfg->vocab_size = std::max<int64_t>(cfg->vocab_size, (*tok)->id_end());
  }
  model::MakeCheckpointOptions o;
  o.seed = a.seed;
  o.shards = a.shards > 0 ? a.shards : model::preset_default_shards(a.preset);
  o.layout_only = a.layout_only;
  // Bytes written with rate and ETA (redrawn on a terminal, plain lines otherwise, none with -q);
  // a layout-only write is a few MB of headers and needs none.
  const bool quiet = a.layout_only || log_level() >= LogLevel::kError;
  LoadProgress progress(stderr, LoadProgress::mode_for(stderr, quiet), "ds41 make-checkpoint: writing");
  o.progress = [&progress](uint64_t done, uint64_t total) { progress.update(done, total); };
  auto t0 = std::chrono::steady_clock::now();
  auto made = model::make_checkpoint(a.out, *cfg, o);
  if (!made.ok()) {
    std::cerr << "ds41 make-checkpoint: " << made.status().message() << "\n";
    return 1;
  }
  if (!a.tokenizer_dir.empty()) {
    namespace fs = std::filesystem;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::error_code ec;
      fs::path src = fs::path(a.tokenizer_dir) / f;
      if (!fs::exists(src, ec)) continue;
      fs::copy_file(src, fs::path(a.out) / f, fs::copy_options::overwrite_existing, ec);
      if (!ec)  // the source may be read-only; the copy belongs to the checkpoint's owner
        fs::permissions(
            fs::path(a.out) / f,
            fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read,
            ec);
      if (ec) {
        std::cerr << "ds41 make-checkpoint: copying " << src << ": " << ec.message() << "\n";
        return 1;
      }
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote %s: preset %s, seed %llu, %llu tensors, %llu payload bytes, %d shard(s)%s in %.2f s\n",
              a.out.c_str(), a.preset.c_str(), static_cast<unsigned long long>(a.seed),
              static_cast<unsigned long long>(made->tensor_count),
              static_cast<unsigned long long>(made->payload_bytes), made->shards,
              a.layout_only ? " (layout only: sparse, no data)" : "", s);
  if (a.tokenizer_dir.empty() && !a.layout_only && log_level() < LogLevel::kError)
    std::fprintf(
        stderr,
        "ds41 make-checkpoint: note: %s has no tokenizer: generate from text with --tokenizer FOLDER "
        "(e.g. ../shared/tokenizer-v41), or write it with --tokenizer FOLDER; --prompt-ids works "
        "without one\n",
        a.out.c_str());
  return 0;
}

void setup(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<MakeArgs>();
  CLI::App* sub =
      parent.add_subcommand("make-checkpoint", "Write a preset checkpoint (random weights or sparse layout)");
  sub->add_option("--preset", args->preset,
                  "tiny | tiny-vision | small | v41-flash | v41-flash-slice | v41-flash-slice-vision")
      ->required();
  sub->add_option("--seed", args->seed, "Random seed (weights depend only on seed and tensor name)");
  sub->add_option("--out", args->out, "Output directory (must not hold a checkpoint yet)")->required();
  sub->add_flag("--layout-only", args->layout_only, "Real headers, sparse all-zero data (holes)");
  sub->add_option("--shards", args->shards, "Number of shards (default: 48 for v41-flash, else 1)")
      ->check(CLI::Range(1, 100000));
  sub->add_option("--tokenizer", args->tokenizer_dir,
                  "Folder with tokenizer.json: copied into the checkpoint, vocabulary widened to cover it");
  sub->add_flag("--force", args->force, "Allow writing v41-flash with random data (510 GB)");
  sub->callback([args, &exit_code] { exit_code = run_make_checkpoint(*args); });
}

}  // namespace cmd_make_checkpoint
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("make-checkpoint", ::ds41::cli::cmd_make_checkpoint::setup);
