// tools/kind_projection: the per-kind sums that project a slice's measurements to the released
// 40-layer schedule (issue 11): the exact prefill, MODEL_SPEC 4.4 decoder bounded replay, and a
// decode step with its roofline bytes.
#include "kind_projection.h"

#include <gtest/gtest.h>

#include "model/presets.h"

namespace ds41::cli {
namespace {

model::LayerSchedule schedule_of(const model::ModelConfig& c) {
  Result<model::LayerSchedule> s = model::derive_layer_schedule(c);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return *s;
}

// Distinct binary fractions per kind, so every sum below is exact and a layer counted under the
// wrong kind changes it.
KindSeconds slice_times() {
  KindSeconds k;
  k.prompt = {{"window-only", 1.0},      {"window-only+engram", 1.25}, {"full/r2+engram", 4.0},
              {"reuse/r2", 2.0},         {"full/r1+cand", 8.0},        {"reuse/r1", 0.5},
              {"reindex/r1", 16.0}};
  k.window = {{"window-only", 1.0 / 64},  {"window-only+engram", 1.0 / 32}, {"full/r2+engram", 1.0 / 16},
              {"reuse/r2", 1.0 / 128},   {"full/r1+cand", 1.0 / 8},        {"reuse/r1", 1.0 / 256},
              {"reindex/r1", 1.0 / 4}};
  return k;
}

TEST(PrefillProjection, ReleasedScheduleKindsAndCut) {
  const model::ModelConfig c = *model::preset_config("v41-flash");
  const model::LayerSchedule s = schedule_of(c);
  const KindSeconds t = slice_times();
  Result<PrefillProjection> p = project_prefill(c, s, 32768, t, 0.5);
  ASSERT_TRUE(p.ok()) << p.status().message();
  // MODEL_SPEC 1.5: 2 window-only layers (one with Engram), 18 ratio-2 (KV sources 2, 8, 14; 14 with
  // Engram), 20 ratio-1 (20 the candidate source, 24 / 28 / 32 / 36 Reindex).
  const std::map<std::string, int64_t> want{{"window-only", 1}, {"window-only+engram", 1}, {"full/r2", 2},
                                            {"full/r2+engram", 1}, {"reuse/r2", 15}, {"full/r1+cand", 1},
                                            {"reindex/r1", 4}, {"reuse/r1", 15}};
  EXPECT_EQ(p->layers_per_kind, want);
  EXPECT_EQ(p->layers, 40);
  EXPECT_EQ(p->cut, 20);  // the last KV source
  // full/r2 is not in the slice: full/r2+engram less the Engram delta (1.25 - 1.0).
  ASSERT_EQ(p->approximated.count("full/r2"), 1u);
  EXPECT_NE(p->approximated.at("full/r2").find("full/r2+engram"), std::string::npos);
  const double full_r2 = 4.0 - 0.25;
  const double exact = 0.5 + 1.0 + 1.25 + 2 * full_r2 + 4.0 + 15 * 2.0 + 8.0 + 4 * 16.0 + 15 * 0.5;
  EXPECT_DOUBLE_EQ(p->exact_s, exact);
  EXPECT_DOUBLE_EQ(p->exact_tokens_per_s, 32768 / exact);
  // Layers 0..20 over the prompt, 21..39 over the window: 4 Reindex and 15 Reuse ratio-1 layers.
  const double replay = 0.5 + 1.0 + 1.25 + 2 * full_r2 + 4.0 + 15 * 2.0 + 8.0 + 4 * (1.0 / 4) + 15 * (1.0 / 256);
  EXPECT_DOUBLE_EQ(p->replay_s, replay);
  EXPECT_DOUBLE_EQ(p->replay_tokens_per_s, 32768 / replay);
  EXPECT_GT(p->replay_tokens_per_s, 1.5 * p->exact_tokens_per_s);
}

TEST(PrefillProjection, SliceProjectsOntoItselfWithoutEstimates) {
  const model::ModelConfig c = *model::preset_config("v41-flash-slice");
  const model::LayerSchedule s = schedule_of(c);
  Result<PrefillProjection> p = project_prefill(c, s, 4096, slice_times(), 0.0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_TRUE(p->approximated.empty());
  EXPECT_EQ(p->cut, 4);
  // 0 window-only, 1 +engram, 2 full/r2+engram, 3 reuse/r2, 4 full/r1+cand | 5 reuse/r1, 6 reindex, 7 reuse/r1.
  EXPECT_DOUBLE_EQ(p->exact_s, 1.0 + 1.25 + 4.0 + 2.0 + 8.0 + 0.5 + 16.0 + 0.5);
  EXPECT_DOUBLE_EQ(p->replay_s, 1.0 + 1.25 + 4.0 + 2.0 + 8.0 + 1.0 / 256 + 1.0 / 4 + 1.0 / 256);
}

TEST(PrefillProjection, EngramKindFromItsBasePlusTheDelta) {
  const model::ModelConfig c = *model::preset_config("v41-flash-slice");
  const model::LayerSchedule s = schedule_of(c);
  KindSeconds t = slice_times();
  t.prompt.erase("full/r2+engram");
  t.prompt["full/r2"] = 3.0;
  Result<PrefillProjection> p = project_prefill(c, s, 4096, t, 0.0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->approximated.count("full/r2+engram"), 1u);
  EXPECT_DOUBLE_EQ(p->exact_s, 1.0 + 1.25 + (3.0 + 0.25) + 2.0 + 8.0 + 0.5 + 16.0 + 0.5);
}

TEST(PrefillProjection, RefusesUnmeasuredKindsAndBadTimes) {
  const model::ModelConfig c = *model::preset_config("v41-flash");
  const model::LayerSchedule s = schedule_of(c);
  KindSeconds t = slice_times();
  t.prompt.erase("reindex/r1");
  Result<PrefillProjection> p = project_prefill(c, s, 4096, t, 0.0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("'reindex/r1'"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("layer 24"), std::string::npos) << p.status().message();
  // A window time missing for a layer after the cut.
  t = slice_times();
  t.window.erase("reuse/r1");
  p = project_prefill(c, s, 4096, t, 0.0);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("window"), std::string::npos) << p.status().message();
  t = slice_times();
  t.prompt["reuse/r2"] = -1.0;
  EXPECT_FALSE(project_prefill(c, s, 4096, t, 0.0).ok());
  EXPECT_FALSE(project_prefill(c, s, 0, slice_times(), 0.0).ok());
  EXPECT_FALSE(project_prefill(c, s, 4096, slice_times(), -0.1).ok());
}

TEST(PrefillProjection, ATargetThatCannotReplayStillProjectsTheExactPrefill) {
  // An Engram layer after the last KV source: decoder replay is refused (MODEL_SPEC 4.4), the exact
  // sum stays.
  model::ModelConfig c = *model::preset_config("v41-flash-slice");
  c.engram_layer_ids = {1, 5};
  const model::LayerSchedule s = schedule_of(c);
  KindSeconds t = slice_times();
  t.prompt["full/r2"] = 3.75;
  t.prompt["reuse/r1+engram"] = 0.75;
  Result<PrefillProjection> p = project_prefill(c, s, 4096, t, 0.0);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->cut, -1);
  EXPECT_NE(p->replay_refused.find("Engram layer 5"), std::string::npos) << p->replay_refused;
  EXPECT_DOUBLE_EQ(p->exact_s, 1.0 + 1.25 + 3.75 + 2.0 + 8.0 + 0.75 + 16.0 + 0.5);
  EXPECT_EQ(p->replay_s, 0.0);
}

TEST(DecodeProjection, ReleasedStepFromTheSliceKinds) {
  const model::ModelConfig c = *model::preset_config("v41-flash");
  const model::LayerSchedule s = schedule_of(c);
  const KindSeconds t = slice_times();  // milliseconds per layer here
  std::map<std::string, double> bytes;  // bytes per layer: 2^20 x the kind's ms, so the Engram delta is too
  for (const auto& [k, v] : t.prompt) bytes[k] = v * 1048576.0;
  Result<DecodeProjection> p = project_decode(s, t.prompt, bytes, 0.25, 0.125, 1048576.0 * 1e3);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const double full_r2 = 4.0 - 0.25;
  const double layers = 1.0 + 1.25 + 2 * full_r2 + 4.0 + 15 * 2.0 + 8.0 + 4 * 16.0 + 15 * 0.5;
  EXPECT_EQ(p->layers, 40);
  EXPECT_DOUBLE_EQ(p->layers_ms, layers);
  EXPECT_DOUBLE_EQ(p->step_ms, layers + 0.25 + 0.125);
  EXPECT_DOUBLE_EQ(p->layers_bytes, layers * 1048576.0);
  EXPECT_DOUBLE_EQ(p->layers_roofline_ms, layers);  // bytes / (2^20 x 1e3 B/s) in ms
  EXPECT_DOUBLE_EQ(p->layers_roofline_ratio, 1.0);
  EXPECT_EQ(p->approximated.count("full/r2"), 1u);
  EXPECT_EQ(p->approximated.count("full/r2 (bytes)"), 1u);
  EXPECT_EQ(p->layers_per_kind.at("reuse/r1"), 15);
  // A kind without a time, a negative byte count, a bandwidth of 0: errors, not numbers.
  std::map<std::string, double> ms = t.prompt;
  ms.erase("reuse/r2");
  Result<DecodeProjection> bad = project_decode(s, ms, bytes, 0.0, 0.0, 1e12);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'reuse/r2'"), std::string::npos) << bad.status().message();
  std::map<std::string, double> nb = bytes;
  nb["reuse/r1"] = -1.0;
  EXPECT_FALSE(project_decode(s, t.prompt, nb, 0.0, 0.0, 1e12).ok());
  EXPECT_FALSE(project_decode(s, t.prompt, bytes, 0.0, 0.0, 0.0).ok());
}

}  // namespace
}  // namespace ds41::cli
