// `ds41 bench forward|tokenize` (issue 9): they used to look for ../shared/tokenizer-v41 relative
// to the current directory and failed anywhere but the checkout's root; they now find the
// shared tokenizer from the binary's location, so these run from a fresh temp directory. Their
// JSON starts with the common benchmark header (tools/bench_header.h). `bench forward --preset
// v41-flash` used to start writing a 510 GB random checkpoint; it is refused like
// `make-checkpoint` refuses it, before anything is created.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

using nlohmann::json;

json parse(const RunResult& r) {
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << dump(r);
  return j;
}

void expect_header(const json& j, const std::string& bench) {
  EXPECT_EQ(j.value("bench", ""), bench);
  ASSERT_TRUE(j.contains("git_revision")) << j.dump();
  EXPECT_FALSE(j["git_revision"].get<std::string>().empty());
  ASSERT_TRUE(j.contains("device") && j["device"].is_object()) << j.dump();
  EXPECT_TRUE(j["device"].contains("cpu")) << j.dump();
  EXPECT_GE(j["device"].value("cores", 0), 1) << j.dump();
  EXPECT_TRUE(j.contains("config") && j["config"].is_object()) << j.dump();
}

TEST(BenchPaths, TokenizeRunsFromAnUnrelatedDirectory) {
  const std::string cwd = fresh_dir("bench_tok_cwd");
  RunResult r = run_ds41_in(cwd, "bench tokenize --no-js --mb 0.05 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse(r);
  expect_header(j, "tokenize");
  const std::string tok = j["config"].value("tokenizer", "");
  EXPECT_TRUE(std::filesystem::path(tok).is_absolute()) << tok;
  EXPECT_NE(tok.find("tokenizer-v41/tokenizer.json"), std::string::npos) << tok;
  EXPECT_GT(j["corpus"].value("tokens", 0), 0) << r.out;
  // An explicit path that does not exist is named in the error.
  RunResult bad =
      run_ds41_in(cwd, "bench tokenize --no-js --mb 0.05 --tokenizer /nonexistent/tokenizer.json");
  EXPECT_EQ(bad.exit_code, 1) << dump(bad);
  EXPECT_NE(bad.err.find("/nonexistent/tokenizer.json"), std::string::npos) << dump(bad);
  std::filesystem::remove_all(cwd);
}

TEST(BenchPaths, ForwardRunsFromAnUnrelatedDirectory) {
  const std::string cwd = fresh_dir("bench_fwd_cwd");
  RunResult r = run_ds41_in(cwd, "bench forward --preset tiny --work-dir " + cwd +
                                     "/work --prompt-len 12 --decode 2 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = parse(r);
  expect_header(j, "forward");
  EXPECT_EQ(j["config"].value("model", ""), "preset:tiny");
  EXPECT_EQ(j.value("decode_tokens", 0), 2);
  std::filesystem::remove_all(cwd);
}

TEST(BenchPaths, ForwardRefusesToGenerateTheFullSizePreset) {
  const std::string cwd = fresh_dir("bench_fwd_v41");
  RunResult r = run_ds41_in(cwd, "bench forward --preset v41-flash --work-dir " + cwd + "/work");
  EXPECT_EQ(r.exit_code, 2) << dump(r);
  EXPECT_NE(r.err.find("510 GB"), std::string::npos) << dump(r);
  EXPECT_NE(r.err.find("--force"), std::string::npos) << dump(r);
  EXPECT_FALSE(std::filesystem::exists(cwd + "/work")) << "nothing may be created";
  RunResult u = run_ds41_in(cwd, "bench forward --preset huge --work-dir " + cwd + "/work");
  EXPECT_EQ(u.exit_code, 2) << dump(u);
  EXPECT_NE(u.err.find("unknown preset 'huge'"), std::string::npos) << dump(u);
  std::filesystem::remove_all(cwd);
}

}  // namespace
}  // namespace ds41::testing_cli
