// `ds41 bench load` (issue 15) drops the whole machine's page cache only when asked
// (--drop-caches), and says so when it does not.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

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
  RunResult h = run_ds41("bench load --help");
  EXPECT_TRUE(has(h.out, "--drop-caches")) << dump(h);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::testing_cli
