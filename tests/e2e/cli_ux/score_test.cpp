// `ds41 score` (issue 15): takes a golden set's manifest.json as --input, says where it wrote, and
// refuses an output folder that is missing or not writable before computing anything.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"

namespace ds41::testing_cli {
namespace {


const std::string kGold = std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-public";

TEST(ScoreUx, ManifestAsInputAndSaysWhereItWrote) {
  const std::string dir = fresh_dir("score_manifest");
  RunResult r = run_ds41("score --model " + kGold + " --tokenizer " + kTok + " --input " + kGold +
                         "/manifest.json --out " + dir + "/out.safetensors");
  ASSERT_EQ(r.exit_code, 0) << dump(r);
  EXPECT_TRUE(std::filesystem::exists(dir + "/out.safetensors"));
  EXPECT_TRUE(has(r.err, "ds41 score: wrote 3 prompt(s) and the decode steps to /")) << dump(r);
  EXPECT_TRUE(has(r.err, "score_manifest")) << dump(r);
  EXPECT_TRUE(has(r.err, "/out.safetensors\n")) << dump(r);
  // The arrays under the golden names: the 3 prompts, and the 16 decode steps whose ids came from
  // goldens.safetensors (decode.input_ids).
  const std::string st = slurp(dir + "/out.safetensors");
  ASSERT_GT(st.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, st.data(), 8);
  auto h = nlohmann::json::parse(st.substr(8, n));
  for (const char* name : {"prompt0.logits", "prompt1.logits", "prompt2.logits"})
    EXPECT_TRUE(h.contains(name)) << name;
  ASSERT_TRUE(h.contains("decode.logits"));
  EXPECT_EQ(h["decode.logits"]["shape"][0].get<int64_t>(), 16);
  std::filesystem::remove_all(dir);
}

TEST(ScoreUx, MissingOutputFolderFailsBeforeLoading) {
  // The model does not exist: a check made after loading would say "not found" about the model.
  RunResult r = run_ds41("score --model /nonexistent/m --input " + kGold +
                         "/manifest.json --out /nonexistent/dir/out.safetensors");
  EXPECT_EQ(r.exit_code, 1) << dump(r);
  EXPECT_TRUE(has(r.err, "/nonexistent/dir does not exist")) << dump(r);
}

TEST(ScoreUx, ReadOnlyOutputFolderFailsBeforeLoading) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  const std::string dir = fresh_dir("score_ro");
  ::chmod(dir.c_str(), 0555);
  RunResult r = run_ds41("score --model /nonexistent/m --input " + kGold + "/manifest.json --out " + dir +
                         "/o.safetensors");
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(r.exit_code, 1) << dump(r);
  EXPECT_TRUE(has(r.err, "not writable")) << dump(r);
  std::filesystem::remove_all(dir);
}

// --numerics fp8-act (quant/act_quant.h): the CPU reference scores with FP8 activations, says so in the
// file's producer, and its logits differ from the exact path's; an unknown value is refused by name
// before the model loads.
TEST(ScoreUx, NumericsFp8ActIsAppliedAndNamed) {
  const std::string dir = fresh_dir("score_numerics");
  const std::string in = " --input " + kGold + "/manifest.json";
  RunResult ex = run_ds41("score --model " + kGold + " --tokenizer " + kTok + in + " --out " + dir + "/ex.safetensors");
  ASSERT_EQ(ex.exit_code, 0) << dump(ex);
  RunResult f8 = run_ds41("score --model " + kGold + " --tokenizer " + kTok + in + " --numerics fp8-act --out " + dir +
                          "/f8.safetensors");
  ASSERT_EQ(f8.exit_code, 0) << dump(f8);
  auto header = [](const std::string& st) {
    uint64_t n = 0;
    std::memcpy(&n, st.data(), 8);
    return nlohmann::json::parse(st.substr(8, n));
  };
  const std::string a = slurp(dir + "/ex.safetensors"), b = slurp(dir + "/f8.safetensors");
  ASSERT_GT(a.size(), 8u);
  ASSERT_GT(b.size(), 8u);
  auto ha = header(a), hb = header(b);
  EXPECT_EQ(ha["__metadata__"]["producer"], "ds41 score (CPU reference, numerics exact)");
  EXPECT_EQ(hb["__metadata__"]["producer"], "ds41 score (CPU reference, numerics fp8-act)");
  // prompt0.logits: same shape, different values.
  auto off = [](const nlohmann::json& h, const std::string& st, const char* name) {
    uint64_t n = 0;
    std::memcpy(&n, st.data(), 8);
    const auto& o = h[name]["data_offsets"];
    return st.substr(8 + n + o[0].get<size_t>(), o[1].get<size_t>() - o[0].get<size_t>());
  };
  const std::string la = off(ha, a, "prompt0.logits"), lb = off(hb, b, "prompt0.logits");
  EXPECT_EQ(la.size(), lb.size());
  EXPECT_NE(la, lb);
  RunResult bad = run_ds41("score --model /nonexistent/m" + in + " --numerics fp16 --out " + dir + "/x.safetensors");
  EXPECT_EQ(bad.exit_code, 1) << dump(bad);
  EXPECT_TRUE(has(bad.err, "unknown numerics 'fp16' (accepted: exact, fp8-act)")) << dump(bad);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::testing_cli
