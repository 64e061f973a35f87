// The memory check before loading (issue 15): a v41-flash layout-only checkpoint (510 GB of sparse
// files, written in seconds) is refused by `generate` with the numbers, instead of starting to load
// it; `inspect` shows the same estimate. The available memory is given with --memory-limit
// (the flag users set in containers) so the result does not depend on the machine.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


class MemoryCheck : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(fresh_dir("memory_check"));
    RunResult r = run_ds41("make-checkpoint --preset v41-flash --layout-only --out " + *root_ + "/big");
    ASSERT_EQ(r.exit_code, 0) << dump(r);
    r = run_ds41("make-checkpoint --preset tiny --seed 1 --out " + *root_ + "/tiny");
    ASSERT_EQ(r.exit_code, 0) << dump(r);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string* root_;
};
std::string* MemoryCheck::root_ = nullptr;


TEST_F(MemoryCheck, GenerateRefusesALayoutThatCannotFitWithTheNumbers) {
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r = run_ds41("generate --model " + *root_ + "/big --tokenizer " + kTok +
                         " --prompt-ids 0,1 --max-tokens 2 --memory-limit 23GB");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << dump(r);
  EXPECT_TRUE(has(r.err, "needs about")) << dump(r);
  EXPECT_TRUE(has(r.err, "weights 5")) << dump(r);  // ~510 GB
  EXPECT_TRUE(has(r.err, "only 23.0 GB is available under --memory-limit")) << dump(r);
  EXPECT_TRUE(has(r.err, "KV for")) << dump(r);
  EXPECT_LT(s, 20.0) << "it started loading";
}

TEST_F(MemoryCheck, TinyModelStillRunsAndInspectShowsTheEstimate) {
  RunResult g = run_ds41("generate --model " + *root_ + "/tiny --tokenizer " + kTok +
                         " --prompt-ids 0,1 --max-tokens 2");
  EXPECT_EQ(g.exit_code, 0) << dump(g);
  RunResult r = run_ds41("inspect --json --memory-limit 23000000000 " + *root_ + "/big");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("memory_estimate")) << r.out;
  EXPECT_GT(j["memory_estimate"]["weights_bytes"].get<uint64_t>(), 500'000'000'000ULL);
  EXPECT_EQ(j["memory_estimate"]["available_bytes"].get<uint64_t>(), 23'000'000'000ULL);
  EXPECT_FALSE(j["memory_estimate"]["fits"].get<bool>());
  // KV = global bytes per token (890 B for the released config) x 4096 + the window rings.
  EXPECT_EQ(j["global_kv_bytes_per_token"].get<double>(), 890.0);
  EXPECT_EQ(j["memory_estimate"]["kv_bytes"].get<uint64_t>(),
            890ULL * 4096 + j["bounded_state"]["window_ring_bytes"].get<uint64_t>());
  EXPECT_EQ(j["memory_estimate"]["total_bytes"].get<uint64_t>(),
            j["memory_estimate"]["weights_bytes"].get<uint64_t>() +
                j["memory_estimate"]["kv_bytes"].get<uint64_t>() +
                j["memory_estimate"]["workspace_bytes"].get<uint64_t>());
  RunResult t = run_ds41("inspect --memory-limit 23GB " + *root_ + "/big");
  EXPECT_TRUE(has(t.out, "memory to load")) << dump(t);
  EXPECT_TRUE(has(t.out, "(does not fit)")) << dump(t);
}

// The limit is a flag of every command that loads a model: serve refuses before loading too, a
// limit above the need lets the tiny model run, and a malformed size is a usage error (exit 2)
// naming the flag.
TEST_F(MemoryCheck, MemoryLimitFlagOnServeScoreAndBadSizes) {
  RunResult s =
      run_ds41("serve --model " + *root_ + "/big --tokenizer " + kTok + " --port 0 --memory-limit 23GB");
  EXPECT_NE(s.exit_code, 0) << dump(s);
  EXPECT_TRUE(has(s.err, "under --memory-limit")) << dump(s);
  RunResult ok = run_ds41("generate --model " + *root_ + "/tiny --tokenizer " + kTok +
                          " --prompt-ids 0,1 --max-tokens 2 --memory-limit 8GiB");
  EXPECT_EQ(ok.exit_code, 0) << dump(ok);
  RunResult tight = run_ds41("generate --model " + *root_ + "/tiny --tokenizer " + kTok +
                             " --prompt-ids 0,1 --max-tokens 2 --memory-limit 1MB");
  EXPECT_EQ(tight.exit_code, 1) << dump(tight);
  EXPECT_TRUE(has(tight.err, "only 0.0 GB is available under --memory-limit") ||
              has(tight.err, "is available under --memory-limit"))
      << dump(tight);
  for (const char* bad : {"lots", "-5GB", "20XB", "0"}) {
    RunResult b = run_ds41("generate --model " + *root_ + "/tiny --tokenizer " + kTok +
                           " --prompt-ids 0,1 --memory-limit " + bad);
    EXPECT_EQ(b.exit_code, 2) << bad << "\n" << dump(b);
    EXPECT_TRUE(has(b.err, "--memory-limit")) << dump(b);
  }
}

}  // namespace
}  // namespace ds41::testing_cli
