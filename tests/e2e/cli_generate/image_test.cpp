// `ds41 generate --image` (issue 16) on the public vision golden model: two images before a short
// raw prompt; usage counts BOS + both spans (17 + 10 positions) + the text; the images change the
// answer. With --device cuda (skipped where this ds41 has no CUDA or no GPU is visible) the GPU
// engine's tower and text model give the same greedy tokens as the CPU reference. The prompt text
// tokenizes to ids below the tiny model's 2048-entry vocabulary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {

const std::string kShared = DS41_SHARED_DIR;
const std::string kVision = kShared + "/golden/v41-tiny-vision-public";

std::string gen(const std::string& device, bool images) {
  std::string a = "generate --model " + kVision + " --tokenizer " + kShared +
                  "/tokenizer-v41 --prompt 'ab a!'" + " --max-tokens 6 --json --seed 1 --device " + device;
  if (images) a += " --image " + kVision + "/images/image2.png --image " + kVision + "/images/image0.png";
  return a;
}

nlohmann::json json_of(const RunResult& r) {
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << dump(r);
  return j;
}

bool no_gpu(const RunResult& r) {
  return r.exit_code != 0 && (r.err.find("no CUDA device found") != std::string::npos ||
                              r.err.find("built without CUDA") != std::string::npos);
}

TEST(GenerateImage, ImagesBecomeSpansOnTheCpuReference) {
  RunResult r = run_ds41(gen("cpu", true));
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  const auto j = json_of(r);
  // BOS + image2 (3 x 4 tokens: 17 positions) + image0 (2 x 3: 10) + "ab a!" (3 tokens).
  EXPECT_EQ(j["prompt_tokens"], 31) << j.dump();
  EXPECT_EQ(j["token_ids"].size(), 6u);
  RunResult t = run_ds41(gen("cpu", false));
  ASSERT_EQ(t.exit_code, 0) << dump(t);
  EXPECT_EQ(json_of(t)["prompt_tokens"], 4);
  EXPECT_NE(json_of(t)["token_ids"], j["token_ids"]) << "the images changed nothing";
}

TEST(GenerateImage, CudaGivesTheCpuReferencesGreedyTokens) {
  RunResult g = run_ds41(gen("cuda", true));
  if (no_gpu(g)) GTEST_SKIP() << "no GPU: " << g.err;
  ASSERT_EQ(g.exit_code, 0) << dump(g);
  RunResult c = run_ds41(gen("cpu", true));
  ASSERT_EQ(c.exit_code, 0) << dump(c);
  const auto jg = json_of(g), jc = json_of(c);
  std::printf("cpu %s\ncuda %s\n", jc["token_ids"].dump().c_str(), jg["token_ids"].dump().c_str());
  EXPECT_EQ(jg["prompt_tokens"], 31);
  EXPECT_EQ(jg["token_ids"], jc["token_ids"]);
}

}  // namespace
}  // namespace ds41::testing_cli
