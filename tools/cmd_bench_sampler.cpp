// ds41 bench sampler: the cost of engine::Sampler::sample (src/engine/sampler.h) per token, on
// rows of the released vocabulary (129,280 logits) and of the tiny model's, for the usual
// sampling settings, next to the tiny model's CPU decode step measured in the same run (the
// sampler must cost a few percent of a decode step at most). Rows are seeded: "peaked" (a
// Zipf-like decay over a random permutation plus Gaussian noise, the shape of a language model's
// logits) and "flat" (Gaussian, sd 2: a long nucleus, the worst case for top_p). The model is
// --model DIR, else the tiny preset generated under --work-dir (as `ds41 bench forward`).
// Prints one JSON object with --json (tools/bench_header.h), else indented.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_header.h"
#include "bench_model.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "engine/sampler.h"
#include "forward_cli_util.h"
#include "load_progress.h"
#include "model/checkpoint_maker.h"
#include "model/presets.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_sampler {  // one name per file: the unity build of tools/ (CMakeLists.txt)

constexpr int64_t kReleasedVocab = 129280;

struct SamplerBenchArgs {
  std::string model_dir, tokenizer_dir, work_dir = "/tmp/ds41-bench";
  int64_t rows = 8, decode = 16;
  double min_time_s = 0.2;
  int threads = 2;
  bool json = false;
};

struct Setting {
  const char* name;
  engine::SamplerParams p;
};

std::vector<Setting> settings() {
  auto mk = [](double t, double top_p, int64_t top_k, double min_p) {
    engine::SamplerParams p;
    p.temperature = t;
    p.top_p = top_p;
    p.top_k = top_k;
    p.min_p = min_p;
    p.seed = 42;
    return p;
  };
  return {{"greedy", mk(0, 1, 0, 0)},
          {"t0.7", mk(0.7, 1, 0, 0)},
          {"t1_top_p0.9", mk(1, 0.9, 0, 0)},
          {"t1_top_p0.95", mk(1, 0.95, 0, 0)},
          {"t1_top_k50", mk(1, 1, 50, 0)},
          {"t1_min_p0.05", mk(1, 1, 0, 0.05)},
          {"t0.6_top_p0.95_top_k20", mk(0.6, 0.95, 20, 0)}};
}

std::vector<std::vector<float>> make_rows(int64_t count, int64_t vocab, bool peaked, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, peaked ? 0.5f : 2.0f);
  std::vector<std::vector<float>> rows(static_cast<size_t>(count));
  std::vector<int32_t> perm(static_cast<size_t>(vocab));
  for (auto& r : rows) {
    r.resize(static_cast<size_t>(vocab));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t rank = 0; rank < perm.size(); ++rank)
      r[static_cast<size_t>(perm[rank])] =
          (peaked ? 20.0f - 2.5f * std::log(static_cast<float>(rank) + 1.0f) : 0.0f) + noise(rng);
  }
  return rows;
}

// Mean microseconds per sample over the rows, repeated until min_time_s has passed.
Result<double> time_sampler(const engine::SamplerParams& p, const std::vector<std::vector<float>>& rows,
                            double min_time_s) {
  DS41_ASSIGN_OR_RETURN(engine::Sampler s, engine::Sampler::create(p));
  SystemClock clock;
  int64_t n = 0;
  int64_t sink = 0;
  DS41_RETURN_IF_ERROR(s.sample(rows[0]).status());  // warm-up (scratch buffers)
  const int64_t t0 = clock.now_mono_ns();
  int64_t t1 = t0;
  do {
    for (const auto& r : rows) {
      DS41_ASSIGN_OR_RETURN(int32_t tok, s.sample(r));
      sink += tok;
      ++n;
    }
    t1 = clock.now_mono_ns();
  } while ((t1 - t0) * 1e-9 < min_time_s);
  if (sink < 0) std::cerr << "";  // keep the draws observable
  return (t1 - t0) * 1e-3 / static_cast<double>(n);
}

// Mean microseconds per decode step of the model (after a short prefill and one warm-up step).
Result<double> time_decode(model::Model& m, int64_t steps) {
  auto st = m.new_sequence();
  model::ForwardOptions opt;
  std::vector<int32_t> ids{static_cast<int32_t>(m.config().bos_token_id), 5, 6, 7};
  DS41_ASSIGN_OR_RETURN(auto out, m.prefill(*st, ids, 0, opt));
  int32_t next = engine::argmax_token(out.logits);
  DS41_ASSIGN_OR_RETURN(auto w, m.decode_step(*st, next, opt));
  next = engine::argmax_token(w.logits);
  SystemClock clock;
  const int64_t t0 = clock.now_mono_ns();
  for (int64_t i = 0; i < steps; ++i) {
    DS41_ASSIGN_OR_RETURN(auto o, m.decode_step(*st, next, opt));
    next = engine::argmax_token(o.logits);
  }
  return (clock.now_mono_ns() - t0) * 1e-3 / static_cast<double>(steps);
}

Status run_bench(const SamplerBenchArgs& a) {
  std::string dir;
  DS41_ASSIGN_OR_RETURN(LoadedModel lm,
                        load_bench_model({a.model_dir, "tiny", a.work_dir, a.tokenizer_dir, a.threads}, &dir));
  const int64_t model_vocab = lm.model->config().vocab_size;
  DS41_ASSIGN_OR_RETURN(const double decode_us, time_decode(*lm.model, a.decode));

  nlohmann::ordered_json j = bench_header("sampler", {{"backend", "cpu-reference"}},
                                          {{"model", a.model_dir.empty() ? "preset:tiny" : dir},
                                           {"model_vocab", model_vocab},
                                           {"released_vocab", kReleasedVocab},
                                           {"rows", a.rows},
                                           {"decode_steps", a.decode},
                                           {"min_time_s", a.min_time_s},
                                           {"threads", a.threads}});
  j["decode_step_us"] = decode_us;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  double worst_released = 0, worst_model = 0;
  // Progress on stderr over the timed settings (2 vocabularies x 2 row kinds x the settings),
  // updated between the timed windows only; plain lines off a terminal, nothing with -q.
  const uint64_t runs = 4 * settings().size();
  uint64_t runs_done = 0;
  LoadProgress progress(stderr, LoadProgress::mode_for_stderr(), "ds41 bench sampler", "runs");
  progress.update(0, runs);
  for (const int64_t vocab : {kReleasedVocab, model_vocab}) {
    for (const bool peaked : {true, false}) {
      const auto rows = make_rows(a.rows, vocab, peaked, peaked ? 7 : 8);
      for (const Setting& s : settings()) {
        DS41_ASSIGN_OR_RETURN(const double us, time_sampler(s.p, rows, a.min_time_s));
        progress.update(++runs_done, runs);
        const double ratio = us / decode_us;
        (vocab == kReleasedVocab ? worst_released : worst_model) =
            std::max(vocab == kReleasedVocab ? worst_released : worst_model, ratio);
        results.push_back({{"vocab", vocab},
                           {"rows", peaked ? "peaked" : "flat"},
                           {"setting", s.name},
                           {"sample_us", us},
                           {"ratio_to_decode_step", ratio}});
      }
    }
  }
  j["results"] = std::move(results);
  j["worst_ratio_released_vocab"] = worst_released;
  j["worst_ratio_model_vocab"] = worst_model;
  std::cout << (a.json ? j.dump() : j.dump(2)) << "\n";
  return ok_status();
}

void setup_bench(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<SamplerBenchArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "sampler", "Sampler cost per token (released vocabulary and the model's) against a decode step");
  cmd->add_option("--model", a->model_dir, "Model directory for the decode step (default: the tiny preset)");
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json (default: the model's, else the shared V4.1 tokenizer)");
  cmd->add_option("--work-dir", a->work_dir, "Where the tiny preset is generated (default /tmp/ds41-bench)");
  cmd->add_option("--rows", a->rows, "Logits rows per kind (default 8)");
  cmd->add_option("--decode", a->decode, "Decode steps timed (default 16)");
  cmd->add_option("--min-time", a->min_time_s, "Seconds spent per sampler setting at least (default 0.2)");
  cmd->add_option("--threads", a->threads, "CPU threads of the decode step (default 2)");
  cmd->add_flag("--json", a->json, "One-line JSON");
  cmd->callback([a, &exit_code] {
    if (a->rows < 1 || a->decode < 1 || a->threads < 1 || !(a->min_time_s >= 0)) {
      std::cerr << "ds41 bench sampler: --rows, --decode and --threads must be >= 1, --min-time >= 0\n";
      exit_code = 2;
      return;
    }
    Status s = run_bench(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench sampler: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_bench_sampler
}  // namespace

DS41_REGISTER_BENCH("sampler", ::ds41::cli::cmd_bench_sampler::setup_bench);

}  // namespace ds41::cli
