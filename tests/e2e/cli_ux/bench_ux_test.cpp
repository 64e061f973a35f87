// `ds41 bench load` (issue 15) drops the whole machine's page cache only when asked
// (--drop-caches), and says so when it does not.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


TEST(BenchUx, BenchLoadDropsThePageCacheOnlyWithTheFlag) {
  const std::string dir = fresh_dir("bench_load_ux");
  RunResult mk = run_ds41("make-checkpoint --preset tiny --seed 1 --out " + dir + "/m -q");
  ASSERT_EQ(mk.exit_code, 0) << dump(mk);
  RunResult r = run_ds41("bench load " + dir + "/m --json --size-gib 0.01 --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_TRUE(has(r.err, "page cache is not dropped")) << dump(r);
  EXPECT_TRUE(has(r.err, "--drop-caches")) << dump(r);
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_FALSE(j["mmap_vs_dd"]["drop_caches_worked"].get<bool>()) << r.out;
  // Progress (plain lines: not a terminal) of writing the test file and of the read passes.
  EXPECT_TRUE(has(r.err, "ds41 bench load: writing the test file: ")) << dump(r);
  EXPECT_TRUE(has(r.err, "ds41 bench load: reading (12 passes): ")) << dump(r);
  EXPECT_TRUE(has(r.err, "(100%)")) << dump(r);
  RunResult q = run_ds41("bench load " + dir + "/m --json --size-gib 0.01 --repeats 1 -q");
  ASSERT_EQ(q.exit_code, 0) << dump(q);
  EXPECT_FALSE(has(q.err, "reading")) << dump(q);
  EXPECT_FALSE(has(q.err, "not dropped")) << dump(q);
  RunResult h = run_ds41("bench load --help");
  EXPECT_TRUE(has(h.out, "--drop-caches")) << dump(h);
  std::filesystem::remove_all(dir);
}

TEST(BenchUx, BenchKvstoreSaysWhereTheStoreIsAndKvStatsOpensAKeptOne) {
  const std::string dir = fresh_dir("bench_kvstore_ux");
  const std::string small =
      "bench kvstore --dir " + dir + " --blocks 16 --repeats 1 --no-redis --swa-iters 1";
  RunResult r = run_ds41(small);
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_TRUE(has(r.err, "the stores were in " + dir + "/ds41-bench-kvstore.")) << dump(r);
  EXPECT_TRUE(has(r.err, "now removed (--keep keeps them)")) << dump(r);

  r = run_ds41(small + " --keep");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  const std::string marker = "ds41 kv stats --kv-dir ";
  const size_t at = r.err.find(marker);
  ASSERT_NE(at, std::string::npos) << dump(r);
  const size_t from = at + marker.size();
  const std::string store = r.err.substr(from, r.err.find('\n', from) - from);
  RunResult st = run_ds41("kv stats --kv-dir " + store);
  EXPECT_EQ(st.exit_code, 0) << dump(st);
  EXPECT_TRUE(has(st.out, "16 (")) << dump(st);  // the 16 blocks the benchmark wrote
  std::filesystem::remove_all(dir);
}

// Every benchmark reports progress on stderr (issue 15): plain lines when stderr is not a
// terminal (here: a pipe), nothing with -q; stdout stays one JSON document.
TEST(BenchUx, BenchSamplerAndForwardShowProgressOnStderrOnly) {
  const std::string dir = fresh_dir("bench_progress_ux");
  const std::string sampler = "bench sampler --json --rows 1 --decode 1 --min-time 0 --work-dir " + dir;
  RunResult r = run_ds41(sampler);
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_TRUE(has(r.err, "ds41 bench sampler: 0 / 28 runs (0%)")) << dump(r);
  EXPECT_TRUE(has(r.err, "ds41 bench sampler: 28 / 28 runs (100%)")) << dump(r);
  EXPECT_FALSE(has(r.err, "\r")) << dump(r);  // plain lines, not a redrawn line
  EXPECT_FALSE(has(r.out, "runs")) << dump(r);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["results"].size(), 28u) << r.out;

  RunResult q = run_ds41(sampler + " -q");
  ASSERT_EQ(q.exit_code, 0) << dump(q);
  EXPECT_FALSE(has(q.err, "runs")) << dump(q);
  EXPECT_FALSE(nlohmann::json::parse(q.out, nullptr, false).is_discarded()) << q.out;

  const std::string forward =
      "bench forward --preset tiny --prompt-len 16 --decode 2 --json --work-dir " + dir;
  RunResult f = run_ds41(forward);
  ASSERT_EQ(f.exit_code, 0) << dump(f);
  EXPECT_TRUE(has(f.err, "ds41 bench forward: 3 / 3 phases (100%)")) << dump(f);
  EXPECT_FALSE(nlohmann::json::parse(f.out, nullptr, false).is_discarded()) << f.out;
  RunResult fq = run_ds41(forward + " -q");
  ASSERT_EQ(fq.exit_code, 0) << dump(fq);
  EXPECT_FALSE(has(fq.err, "phases")) << dump(fq);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::testing_cli
