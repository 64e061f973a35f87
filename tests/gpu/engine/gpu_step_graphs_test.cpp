// Decode steps replayed from captured CUDA graphs (gpu/step_graphs.h, one per segment: layer 0,
// the other layers with the head) against the same steps launched kernel by kernel: two engines over one device
// model, one with graphs (2 variants per segment, so graphs are evicted and updated in place), one
// without. Three sequences of different lengths
// (past every window, top-k and candidate limit; different ratio-2 phases) decode 300 steps, with a
// stretch where only two of them decode (another batch shape) and one where a fourth joins. The
// steps cross key and score buckets (128: the plan pads decode steps' counts to them), page
// boundaries and the ratio-2 emit phases, so signatures change and graphs are captured, replayed,
// evicted and updated; a replay that used a stale argument (a count, an arena address, a page table)
// would part the logits or the packed state. Both must be bit-identical. The graphed engine also
// runs two chains of each layer on a side stream (gpu_forward.h "Side stream"), the direct one
// everything in order on one stream: their bits must not differ either.
#include <gtest/gtest.h>

#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

struct GraphCase {
  const char* name;
  bool small;
};

class GpuStepGraphs : public ::testing::TestWithParam<GraphCase> {};

TEST_P(GpuStepGraphs, ReplayIsBitIdenticalToDirectLaunches) {
  DS41_SKIP_WITHOUT_GPU();
  const std::string dir = GetParam().small ? small_model_dir() : golden_dir();
  auto dev = load_device_model(dir);
  ASSERT_TRUE(dev);
  // The direct engine also runs without the side stream (GpuLimits::side_stream): the graphed one's
  // captured fork / join branches must give the bits of the kernels launched in order.
  auto graphed = make_engine(*dev, 8, 4096, 1024, 128, 2, 1), direct = make_engine(*dev, 8, 4096, 1024, 128, 0, 0);
  ASSERT_TRUE(graphed && direct);
  ASSERT_NE(graphed->executor().step_graphs(), nullptr);
  ASSERT_EQ(direct->executor().step_graphs(), nullptr);
  const int64_t V = dev->config().vocab_size, steps = 300;
  const int64_t lens[4] = {GetParam().small ? 160 : 297, 131, 77, 200};
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < 4; ++i) toks.push_back(seeded_tokens(lens[i] + steps, V, 11 + i));

  struct Side {
    gpu::CudaEngine* eng;
    std::vector<engine::SeqId> ids;
    std::vector<float> logits;
  } sides[2] = {{graphed.get(), {}, {}}, {direct.get(), {}, {}}};
  for (Side& s : sides)
    for (int i = 0; i < 4; ++i) {
      auto id = s.eng->create_sequence();
      ASSERT_TRUE(id.ok());
      s.ids.push_back(*id);
    }
  // Prefills (not graphed): sequences 0-2 now, 3 at step 200.
  auto prefill = [&](Side& s, int i) {
    engine::StepItem it{s.ids[i], std::span<const int32_t>(toks[i]).first(lens[i]), true};
    engine::StepOutput so;
    Status st = s.eng->step(std::span<const engine::StepItem>(&it, 1), &so);
    ASSERT_TRUE(st.ok()) << st.message();
  };
  for (Side& s : sides)
    for (int i = 0; i < 3; ++i) prefill(s, i);
  int64_t done[4] = {0, 0, 0, 0};
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<int> active = {0, 1, 2};
    if (t >= 120 && t < 160) active = {0, 2};  // another batch shape
    if (t == 200)
      for (Side& s : sides) prefill(s, 3);
    if (t >= 200) active = {0, 1, 2, 3};
    for (Side& s : sides) {
      std::vector<engine::StepItem> items;
      for (int i : active)
        items.push_back({s.ids[i], std::span<const int32_t>(&toks[i][lens[i] + done[i]], 1), true});
      engine::StepOutput so;
      Status st = s.eng->step(items, &so);
      ASSERT_TRUE(st.ok()) << "step " << t << ": " << st.message();
      for (size_t k = 0; k < active.size(); ++k)
        s.logits.insert(s.logits.end(), so.logits.begin() + so.row[k] * V, so.logits.begin() + (so.row[k] + 1) * V);
    }
    for (int i : active) ++done[i];
  }
  ASSERT_EQ(sides[0].logits.size(), sides[1].logits.size());
  int64_t first_diff = -1;
  for (size_t r = 0; r * V < sides[0].logits.size() && first_diff < 0; ++r)
    if (!std::equal(sides[0].logits.begin() + r * V, sides[0].logits.begin() + (r + 1) * V,
                    sides[1].logits.begin() + r * V))
      first_diff = static_cast<int64_t>(r);
  EXPECT_EQ(first_diff, -1) << "a replayed decode step's logits differ from the directly launched step's";
  for (int i = 0; i < 4; ++i) {
    auto a = graphed->sequence_bytes(sides[0].ids[i]), b = direct->sequence_bytes(sides[1].ids[i]);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(*a == *b) << "sequence " << i << ": packed state differs after replayed steps";
    EXPECT_EQ(*graphed->sequence_position(sides[0].ids[i]), lens[i] + done[i]);
  }
  const gpu::StepGraphStats& g = graphed->executor().step_graphs()->stats();
  // One graph per graphed segment (by default layer 0, and the other layers with the head; the
  // prologue runs directly).
  const int64_t segments = steps * gpu::GpuForward::graphed_segments_per_step(dev->config().num_hidden_layers);
  std::cout << GetParam().name << ": " << steps << " steps, " << segments << " segments, graph hits " << g.hits
            << ", captures " << g.captures << ", updates " << g.updates << ", deferred " << g.deferred << ", direct " << g.direct << ", unrouted "
            << g.unrouted << "\n";
  EXPECT_EQ(g.unrouted, 0) << "stream work outside launch()/copy_async()/fill_async()/record_event()";
  EXPECT_EQ(g.direct, 0);
  EXPECT_EQ(g.hits + g.captures + g.updates + g.deferred, segments);
  EXPECT_GT(g.deferred, 0);  // first sightings run directly
  // Two variants per segment (the ratio-2 emit phases alternate): new signatures (bucket, page and
  // batch-shape changes) evict and mostly update in place; executables are rarely instantiated.
  EXPECT_GT(g.hits, segments / 2) << "consecutive decode steps should replay their graphs";
  EXPECT_GT(g.captures, 1);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuStepGraphs, ::testing::Values(GraphCase{"tiny", false}, GraphCase{"small", true}),
                         [](const auto& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace ds41::testing
