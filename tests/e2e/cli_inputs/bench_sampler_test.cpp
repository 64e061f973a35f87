// `ds41 bench sampler` (issue 15): times engine::Sampler::sample on released-vocabulary rows
// (129,280) and the tiny model's for the usual settings, next to the tiny model's decode step
// measured in the same run; its JSON starts with the common benchmark header and carries the
// ratio sample / decode step for every row kind and setting.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

using nlohmann::json;

TEST(BenchSampler, ReportsEachSettingAgainstTheDecodeStep) {
  const std::string cwd = fresh_dir("bench_sampler_cwd");
  RunResult r = run_ds41_in(
      cwd, "bench sampler --work-dir " + cwd + "/work --rows 1 --decode 2 --min-time 0 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << dump(r);
  EXPECT_EQ(j.value("bench", ""), "sampler");
  EXPECT_TRUE(j.contains("git_revision") && j.contains("device")) << r.out;
  EXPECT_EQ(j["config"].value("released_vocab", 0), 129280);
  EXPECT_EQ(j["config"].value("model_vocab", 0), 2048);
  EXPECT_GT(j.value("decode_step_us", 0.0), 0.0) << r.out;
  ASSERT_TRUE(j["results"].is_array());
  std::set<std::string> settings;
  for (const json& e : j["results"]) {
    settings.insert(e.value("setting", ""));
    EXPECT_GT(e.value("sample_us", 0.0), 0.0) << e.dump();
    EXPECT_NEAR(e.value("ratio_to_decode_step", 0.0),
                e.value("sample_us", 0.0) / j.value("decode_step_us", 1.0), 1e-9)
        << e.dump();
  }
  for (const char* s : {"greedy", "t0.7", "t1_top_p0.9", "t1_top_p0.95", "t1_top_k50", "t1_min_p0.05"})
    EXPECT_TRUE(settings.count(s)) << s;
  EXPECT_EQ(j["results"].size(), 2u * 2u * settings.size());  // 2 vocabularies x 2 row kinds
  EXPECT_GT(j.value("worst_ratio_released_vocab", 0.0), 0.0);
  RunResult bad = run_ds41_in(cwd, "bench sampler --rows 0");
  EXPECT_EQ(bad.exit_code, 2) << dump(bad);
  std::filesystem::remove_all(cwd);
}

}  // namespace
}  // namespace ds41::testing_cli
