// End-to-end regression tests for issue 9's data-loss bug: `ds41 bench kvstore --dir D` used to
// delete D itself and everything that was in it. The benchmark must work in a directory it
// creates inside D and remove only that. Runs the binary with a tiny configuration (a few
// blocks of 1 KB, no fsync, no Redis): each run takes well under a second.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "e2e/checkpoint_cli/cli_util.h"

namespace ds41 {
namespace {

using testing_cli::run_ds41;
using testing_cli::RunResult;

const char* kTinyBench =
    " --blocks 4 --block-bytes 1000 --repeats 1 --swa-bytes 1000 --swa-iters 2 --no-redis --no-sync --json";

std::string dump(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\nstdout:\n" + r.out + "\nstderr:\n" + r.err;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

class BenchKvstoreDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing_cli::fresh_dir(std::string("bench_kv_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(BenchKvstoreDirTest, Issue9PreexistingFilesInDirSurvive) {
  const std::string d = root_ + "/D";
  std::filesystem::create_directories(d + "/sub");
  { std::ofstream(d + "/keep.txt") << "user data"; }
  { std::ofstream(d + "/sub/nested.txt") << "more"; }
  RunResult r = run_ds41("bench kvstore --dir " + d + kTinyBench);
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  ASSERT_TRUE(std::filesystem::is_directory(d)) << "the benchmark deleted --dir\n" << dump(r);
  EXPECT_EQ(testing_cli::slurp(d + "/keep.txt"), "user data");
  EXPECT_EQ(testing_cli::slurp(d + "/sub/nested.txt"), "more");
  // ...and it removed everything it created (nothing else is left beside the user's files).
  EXPECT_EQ(entries(d), (std::set<std::string>{"keep.txt", "sub"}));
  EXPECT_EQ(entries(d + "/sub"), (std::set<std::string>{"nested.txt"}));
}

TEST_F(BenchKvstoreDirTest, Issue9MissingDirIsCreatedAndRemovedAgain) {
  const std::string d = root_ + "/new/D";
  RunResult r = run_ds41("bench kvstore --dir " + d + kTinyBench);
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_FALSE(std::filesystem::exists(d)) << "left behind the directory it created";
}

TEST_F(BenchKvstoreDirTest, Issue9KeepLeavesOnlyItsOwnDirectory) {
  const std::string d = root_ + "/D";
  std::filesystem::create_directories(d);
  { std::ofstream(d + "/keep.txt") << "user data"; }
  RunResult r = run_ds41("bench kvstore --keep --dir " + d + kTinyBench);
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  auto names = entries(d);
  ASSERT_EQ(names.size(), 2u) << dump(r);
  EXPECT_TRUE(names.count("keep.txt"));
  names.erase("keep.txt");
  EXPECT_TRUE(names.begin()->starts_with("ds41-bench-kvstore.")) << *names.begin();
  EXPECT_TRUE(std::filesystem::is_directory(d + "/" + *names.begin() + "/store.0"));
}

}  // namespace
}  // namespace ds41
