// Issue 2 section 5 acceptance, through the built binary:
//   ds41 make-checkpoint --layout-only --preset v41-flash --out DIR && ds41 inspect DIR --json
// reports tensor_count 96085, payload_bytes 510286023000, global_kv_bytes_per_token 890,
// contract_ok true, and DIR uses < 100 MB of disk (allocated blocks, not apparent size).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace ds41::testing_cli {
namespace {

uint64_t allocated_bytes(const std::string& dir, uint64_t* apparent) {
  uint64_t blocks = 0;
  *apparent = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    struct stat st {};
    if (lstat(e.path().c_str(), &st) != 0) continue;
    blocks += static_cast<uint64_t>(st.st_blocks) * 512;
    *apparent += static_cast<uint64_t>(st.st_size);
  }
  return blocks;
}

TEST(CheckpointCli, ReleasedLayoutIsSparseAndPassesTheContract) {
  const std::string dir = fresh_dir("v41_layout");
  RunResult mk = run_ds41("make-checkpoint --layout-only --preset v41-flash --out " + dir);
  ASSERT_EQ(mk.exit_code, 0) << mk.out << mk.err;
  EXPECT_NE(mk.out.find("96085 tensors"), std::string::npos) << mk.out;
  RunResult in = run_ds41("inspect " + dir + " --json");
  ASSERT_EQ(in.exit_code, 0) << in.err;
  auto j = nlohmann::json::parse(in.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << in.out.substr(0, 500);
  EXPECT_EQ(j["tensor_count"].get<uint64_t>(), 96085u);
  EXPECT_EQ(j["payload_bytes"].get<uint64_t>(), 510286023000ull);
  EXPECT_EQ(j["global_kv_bytes_per_token"].get<double>(), 890.0);
  EXPECT_EQ(j["contract_ok"].get<bool>(), true);
  EXPECT_EQ(j["shard_files"].get<int>(), 48);
  EXPECT_EQ(j["bounded_state"]["window_ring_bytes"].get<int64_t>(), 2703360);  // MODEL_SPEC 5.4
  EXPECT_EQ(j["bounded_state"]["window_ring_dspark_bytes"].get<int64_t>(), 202752);
  EXPECT_EQ(j["bounded_state"]["half_pair_bytes"].get<int64_t>(), 3 * 4096);
  uint64_t apparent = 0;
  uint64_t used = allocated_bytes(dir, &apparent);
  EXPECT_LT(used, 100ull << 20) << "allocated " << used << " bytes";
  EXPECT_GT(apparent, 510286023000ull);  // the files really have the full size (holes)
  std::filesystem::remove_all(dir);
}

TEST(CheckpointCli, TinyPresetWithRandomWeightsPassesAndIsDeterministic) {
  const std::string a = fresh_dir("tiny_a"), b = fresh_dir("tiny_b");
  ASSERT_EQ(run_ds41("make-checkpoint --preset tiny --seed 11 --out " + a).exit_code, 0);
  ASSERT_EQ(run_ds41("make-checkpoint --preset tiny --seed 11 --shards 3 --out " + b).exit_code, 0);
  RunResult in = run_ds41("inspect " + a + " --json");
  ASSERT_EQ(in.exit_code, 0) << in.err;
  auto j = nlohmann::json::parse(in.out);
  EXPECT_TRUE(j["contract_ok"].get<bool>());
  EXPECT_EQ(j["tensor_count"].get<int>(), 657);
  RunResult inb = run_ds41("inspect " + b);
  ASSERT_EQ(inb.exit_code, 0) << inb.err;
  EXPECT_NE(inb.out.find("contract ok: 657 of 657"), std::string::npos) << inb.out;
  EXPECT_NE(inb.out.find("3 shard file(s)"), std::string::npos);
  // Refuses to overwrite an existing checkpoint.
  RunResult again = run_ds41("make-checkpoint --preset tiny --out " + a);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.err.find("already holds a checkpoint"), std::string::npos) << again.err;
  // Same seed, same bytes; another seed, other bytes.
  const std::string c = fresh_dir("tiny_c"), d = fresh_dir("tiny_d");
  ASSERT_EQ(run_ds41("make-checkpoint --preset tiny --seed 11 --out " + c).exit_code, 0);
  ASSERT_EQ(run_ds41("make-checkpoint --preset tiny --seed 12 --out " + d).exit_code, 0);
  EXPECT_TRUE(slurp(a + "/model.safetensors") == slurp(c + "/model.safetensors"));
  EXPECT_FALSE(slurp(a + "/model.safetensors") == slurp(d + "/model.safetensors"));
  for (const auto& x : {a, b, c, d}) std::filesystem::remove_all(x);
}

TEST(CheckpointCli, FullSizeRandomDataNeedsForce) {
  const std::string d = fresh_dir("v41_refuse");
  RunResult r = run_ds41("make-checkpoint --preset v41-flash --out " + d);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("510 GB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--layout-only"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(d));
  RunResult u = run_ds41("make-checkpoint --preset huge --out " + d);
  EXPECT_EQ(u.exit_code, 2);
  EXPECT_NE(u.err.find("unknown preset 'huge'"), std::string::npos) << u.err;
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace ds41::testing_cli
