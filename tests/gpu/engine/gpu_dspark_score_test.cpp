// `ds41 score --device cuda` with a {"dspark": ...} input (issue 17): gpu::gpu_dspark_score on the
// public DSpark golden model against ../shared/golden/v41-tiny-dspark-public with the README's
// tolerances (tests/golden/dspark_golden_compare.h, the rules the CPU reference's golden test
// uses): seq.target_argmax, context.features / main_x, every stage's window rows, the draft at the
// 8 golden anchors (candidates exact, hidden, base logits, confidences, block rows, routing as
// sets) and the 32-step greedy walk (anchors, candidates, confidences, survival, accepted lengths,
// bonus tokens) — 26 arrays. The engine is left without live sequences.
// DS41_DSPARK_TEST_SMALL=1 (the host emulator, scripts/cuda-host-emu/run_engine.sh): the first 12
// positions, the 4 golden anchors among them, against the golden prefixes; the walk from a
// 10-token prompt for 2 steps against the CPU reference's engine::dspark_score of the same input.
#include "gpu/gpu_dspark_score.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "engine/dspark_score.h"
#include "golden/dspark_golden_compare.h"
#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

TEST(GpuDsparkScore, GoldenArraysWithinTolerances) {
  DS41_SKIP_WITHOUT_GPU();
  GoldenFile g(dspark_golden_dir() + "/goldens.safetensors");
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  auto e = make_engine(*dev, 64, 4096, 512);
  ASSERT_TRUE(e);
  const bool small = emulator_sizes();
  engine::DsparkScoreInput in;
  in.input_ids = g.get<int32_t>("seq.input_ids").v;
  in.prompt_len = g.get<int32_t>("seq.prompt_len").v.at(0);
  for (int32_t L : g.get<int32_t>("draft.anchor_pos").v) in.anchors.push_back(L);
  in.walk_steps = g.get<int32_t>("walk.accepted").rows();
  if (small) {
    in.input_ids.resize(12);
    in.prompt_len = 10;
    std::erase_if(in.anchors, [](int64_t L) { return L >= 12; });
    in.walk_steps = 2;
  }
  auto arrays = gpu::gpu_dspark_score(*e, in);
  ASSERT_TRUE(arrays.ok()) << arrays.status().message();
  EXPECT_EQ(e->live_sequences(), 0);
  EXPECT_GT(e->speculative_block(), 0);
  std::vector<engine::NamedArray> cpu;
  if (small) {  // the walk's oracle: the CPU reference on the same input
    TestModel cm = load_cpu_model(dspark_golden_dir(), 4);
    ASSERT_TRUE(cm.model);
    auto c = engine::dspark_score(cm.model.get(), in);
    ASSERT_TRUE(c.ok()) << c.status().message();
    cpu = std::move(*c);
  }
  int compared = 0;
  for (const engine::NamedArray& a : *arrays) {
    ASSERT_TRUE(g.has(a.name)) << a.name;
    if (small && a.name.starts_with("walk.")) {
      const auto it =
          std::find_if(cpu.begin(), cpu.end(), [&](const engine::NamedArray& c) { return c.name == a.name; });
      ASSERT_NE(it, cpu.end()) << a.name;
      expect_dspark_close(*it, a);
    } else {
      expect_dspark_matches(g, a, /*prefix=*/small);
    }
    ++compared;
  }
  EXPECT_EQ(compared, 26);  // every golden array but seq.input_ids and seq.prompt_len
  if (!small) {             // the walk's statistics (golden README: 24 x a=0, 6 x a=1, 2 x a=2)
    for (const engine::NamedArray& a : *arrays)
      if (a.name == "walk.accepted") {
        int64_t acc = 0;
        for (int32_t v : a.i32) acc += v;
        std::cout << "walk: " << a.i32.size() << " steps, " << acc << " candidates accepted\n";
      }
  }
}

// The entry point's preconditions are errors, not crashes.
TEST(GpuDsparkScore, BadInputsAreErrors) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(dspark_golden_dir());
  ASSERT_TRUE(dev);
  auto e = make_engine(*dev, 64, 4096, 512);
  ASSERT_TRUE(e);
  engine::DsparkScoreInput in;
  EXPECT_EQ(gpu::gpu_dspark_score(*e, in).status().code(), StatusCode::kInvalidArgument) << "empty input";
  in.input_ids = {0, 5, 6, 7};
  in.prompt_len = 5;
  EXPECT_EQ(gpu::gpu_dspark_score(*e, in).status().code(), StatusCode::kInvalidArgument) << "prompt_len > N";
  in.prompt_len = 2;
  in.anchors = {4};
  EXPECT_EQ(gpu::gpu_dspark_score(*e, in).status().code(), StatusCode::kInvalidArgument) << "anchor >= N";
  // A live sequence: speculative decoding can no longer be enabled.
  in.anchors = {};
  auto s = e->create_sequence();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(gpu::gpu_dspark_score(*e, in).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ds41::testing
