// `ds41 bench speculative` (issue 17 benchmark, CPU reference) on the public DSpark golden model:
// the JSON carries the common header, the draft / verification / plain step times of one run,
// their ratios (consistent with the times), the GPU targets alongside, and the projection
// (accepted + 1 tokens per speculative step); bad flags exit 2, a model without draft stages 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

using nlohmann::json;

TEST(BenchSpeculative, ReportsDraftAndVerificationAgainstAPlainStep) {
  const std::string cwd = fresh_dir("bench_speculative_cwd");
  const std::string shared = DS41_SHARED_DIR;
  RunResult r = run_ds41_in(cwd, "bench speculative --model " + shared + "/golden/v41-tiny-dspark-public --tokenizer " +
                                     shared + "/tokenizer-v41 --prompt-len 40 --steps 2 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << dump(r);
  EXPECT_EQ(j.value("bench", ""), "speculative");
  EXPECT_EQ(j["config"].value("block", 0), 5);
  EXPECT_EQ(j["config"].value("draft_stages", 0), 3);
  const double plain = j.value("plain_step_ms", 0.0), draft = j.value("draft_step_ms", 0.0),
               full = j.value("speculative_step_ms", 0.0), verify = j.value("verification_ms", -1.0);
  EXPECT_GT(plain, 0.0) << r.out;
  EXPECT_GT(draft, 0.0) << r.out;
  EXPECT_GT(full, draft) << "a speculative step drafts and verifies: " << r.out;
  EXPECT_NEAR(verify, full - draft, 1e-9);
  EXPECT_NEAR(j.value("draft_over_plain", 0.0), draft / plain, 1e-9);
  EXPECT_NEAR(j.value("verification_over_plain", 0.0), verify / plain, 1e-9);
  EXPECT_EQ(j["targets"].value("draft_over_plain_max", 0.0), 0.15);
  EXPECT_EQ(j["targets"].value("verification_over_plain_max", 0.0), 1.3);
  ASSERT_EQ(j["projection"].size(), 6u);
  for (const json& p : j["projection"]) {
    const int acc = p.value("accepted", -1);
    EXPECT_NEAR(p.value("tokens_per_s", 0.0), (acc + 1) / (full * 1e-3), 1e-6 * (acc + 1) / (full * 1e-3));
  }
  RunResult bad = run_ds41_in(cwd, "bench speculative --steps 0");
  EXPECT_EQ(bad.exit_code, 2) << dump(bad);
  // The golden tiny model (no draft stages) is refused with the reason.
  RunResult none = run_ds41_in(cwd, "bench speculative --model " + shared + "/golden/v41-tiny-public --tokenizer " +
                                        shared + "/tokenizer-v41 --steps 1");
  EXPECT_EQ(none.exit_code, 1) << dump(none);
  EXPECT_NE(none.err.find("no draft stages"), std::string::npos) << dump(none);
  std::filesystem::remove_all(cwd);
}

}  // namespace
}  // namespace ds41::testing_cli
