// `ds41 score` with a {"dspark": ...} input (issue 17) on the public DSpark golden model, a short
// input (24 positions, anchors 1 and 3, a 2-step walk from a 20-token prompt): on the CPU
// reference it writes the DSpark arrays under their golden names; `--device cuda` on a machine
// without a GPU (or a build without CUDA) exits 1 with the reason, no crash, and on a GPU writes the
// same array names with the same shapes (the values are checked against the goldens in
// tests/gpu/engine/gpu_dspark_score_test.cpp); flags the DSpark path does not take are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "e2e/cli_inputs/run_in.h"
#include "model/loader/safetensors.h"

namespace ds41::testing_cli {
namespace {

std::map<std::string, std::vector<int64_t>> shapes_of(const std::string& path) {
  std::map<std::string, std::vector<int64_t>> out;
  auto f = model::SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.status().message();
  if (!f.ok()) return out;
  for (const auto& [name, t] : (*f)->header().tensors) out[name] = t.shape;
  return out;
}

TEST(ScoreDspark, CpuWritesTheGoldenNamesAndCudaFailsCleanlyWithoutAGpu) {
  const std::string cwd = fresh_dir("score_dspark_cwd");
  const std::string shared = DS41_SHARED_DIR;
  const std::string model = shared + "/golden/v41-tiny-dspark-public";
  std::vector<int32_t> ids;
  {
    auto g = model::SafetensorsFile::open(model + "/goldens.safetensors");
    ASSERT_TRUE(g.ok()) << g.status().message();
    const model::TensorInfo& t = (*g)->header().tensors.at("seq.input_ids");
    ASSERT_EQ(t.dtype, DType::kI32);
    ASSERT_GE(t.numel(), 24);
    ids.resize(24);
    std::memcpy(ids.data(), (*g)->data(t), ids.size() * sizeof(int32_t));
  }
  nlohmann::json in;
  in["dspark"] = {{"input_ids", ids}, {"prompt_len", 20}, {"anchors", {1, 3}}, {"walk_steps", 2}};
  std::ofstream(cwd + "/in.json") << in.dump();
  const std::string common =
      "score --model " + model + " --tokenizer " + shared + "/tokenizer-v41 --input in.json";

  RunResult cpu = run_ds41_in(cwd, common + " --out cpu.safetensors --device cpu --threads 1");
  ASSERT_EQ(cpu.exit_code, 0) << dump(cpu);
  const auto want = shapes_of(cwd + "/cpu.safetensors");
  EXPECT_EQ(want.size(), 26u);
  EXPECT_EQ(want.at("seq.target_argmax"), (std::vector<int64_t>{24}));
  EXPECT_EQ(want.at("context.main_x").at(0), 24);
  EXPECT_EQ(want.at("draft.candidates"), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(want.at("walk.accepted"), (std::vector<int64_t>{2}));

  RunResult gpu = run_ds41_in(cwd, common + " --out gpu.safetensors --device cuda");
  EXPECT_EQ(gpu.signal, 0) << dump(gpu);
  const bool no_gpu = gpu.err.find("no CUDA device found") != std::string::npos ||
                      gpu.err.find("built without CUDA") != std::string::npos;
  if (no_gpu) {
    EXPECT_EQ(gpu.exit_code, 1) << dump(gpu);
    EXPECT_FALSE(std::filesystem::exists(cwd + "/gpu.safetensors"));
  } else {
    ASSERT_EQ(gpu.exit_code, 0) << dump(gpu);
    EXPECT_EQ(shapes_of(cwd + "/gpu.safetensors"), want);
  }

  RunResult bad = run_ds41_in(cwd, common + " --out x.safetensors --device cpu --debug");
  EXPECT_EQ(bad.exit_code, 1) << dump(bad);
  EXPECT_NE(bad.err.find("dspark"), std::string::npos) << dump(bad);
  std::filesystem::remove_all(cwd);
}

}  // namespace
}  // namespace ds41::testing_cli
