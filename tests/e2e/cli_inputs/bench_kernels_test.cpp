// `ds41 bench kernels` (issues 10, 11): argument errors exit 2 before any device work; without a
// device (or in a build without CUDA) it says so and exits 1; with one, a single shape's JSON
// starts with the common benchmark header and carries the roofline and cuBLASLt terms.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

using nlohmann::json;


TEST(BenchKernels, RejectsOtherDevicesAndBadTokenCounts) {
  RunResult cpu = run_ds41("bench kernels --device cpu --json");
  EXPECT_EQ(cpu.exit_code, 2) << dump(cpu);
  EXPECT_TRUE(has(cpu.err, "--device must be cuda")) << dump(cpu);
  RunResult zero = run_ds41("bench kernels --n 0 --json");
  EXPECT_EQ(zero.exit_code, 2) << dump(zero);
  EXPECT_TRUE(has(zero.err, "--n")) << dump(zero);
}

TEST(BenchKernels, OneShapeOrAClearNoDeviceError) {
  RunResult r =
      run_ds41("bench kernels --device cuda --only wkv --n 1 --min-time-ms 1 --blas-algos 1 --json -q");
  if (r.exit_code != 0) {
    EXPECT_EQ(r.exit_code, 1) << dump(r);
    EXPECT_TRUE(has(r.err, "no CUDA device") || has(r.err, "without CUDA")) << dump(r);
    return;
  }
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << dump(r);
  EXPECT_EQ(j.value("bench", ""), "kernels");
  EXPECT_GT(j["device"].value("copy_gbs", 0.0), 0.0) << r.out;
  ASSERT_EQ(j["results"].size(), 1u) << r.out;
  const json& e = j["results"][0];
  EXPECT_EQ(e.value("name", ""), "wkv");
  EXPECT_EQ(e.value("out", 0), 512);
  EXPECT_EQ(e.value("in", 0), 5120);
  EXPECT_GT(e.value("ours_us", 0.0), 0.0) << e.dump();
  EXPECT_NEAR(e.value("roofline_ratio", 0.0), e.value("ours_us", 0.0) / e.value("roofline_us", 1.0), 1e-9)
      << e.dump();
  EXPECT_GT(e.value("blas_bf16_us", 0.0), 0.0) << e.dump();
  // Our fp32-x result against cuBLASLt's on BF16 x: ~1e-3 apart; a layout error would be ~1.
  EXPECT_LT(e.value("check_rel_vs_blas_bf16", 1.0), 0.05) << e.dump();
}

}  // namespace
}  // namespace ds41::testing_cli
