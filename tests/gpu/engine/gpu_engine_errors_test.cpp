// Bad input on the GPU engine: unknown sequence, token outside the vocabulary, context overflow,
// a sequence twice in one step -> a Status naming the problem, and every sequence unchanged
// (position, bytes, and the next valid step still matches the CPU reference).
#include <gtest/gtest.h>

#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

TEST(GpuEngineErrors, BadInputLeavesStateUnchanged) {
  DS41_SKIP_WITHOUT_GPU();
  TestModel cpu = load_cpu_model(golden_dir(), 4);
  ASSERT_TRUE(cpu.model);
  auto dev = load_device_model(golden_dir());
  ASSERT_TRUE(dev);
  const int64_t V = dev->config().vocab_size;
  auto eng = make_engine(*dev, 64, /*max_context=*/64);
  ASSERT_TRUE(eng);
  EXPECT_EQ(eng->info().max_context, 64);
  auto toks = seeded_tokens(40, V, 9);
  auto a = eng->create_sequence();
  ASSERT_TRUE(a.ok());
  engine::StepOutput so;
  engine::StepItem first{*a, toks, true};
  ASSERT_TRUE(eng->step(std::span<const engine::StepItem>(&first, 1), &so).ok());
  const int64_t pos = *eng->sequence_position(*a), bytes = *eng->sequence_bytes(*a);
  const int64_t free_pages = eng->pool().pages().free_pages();
  auto unchanged = [&](const char* what) {
    EXPECT_EQ(*eng->sequence_position(*a), pos) << what;
    EXPECT_EQ(*eng->sequence_bytes(*a), bytes) << what;
    EXPECT_EQ(eng->pool().pages().free_pages(), free_pages) << what;
  };
  int32_t one = 5;
  // Unknown sequence (with a valid item before it).
  std::vector<engine::StepItem> bad1{{*a, std::span<const int32_t>(&one, 1), true},
                                     {9999, std::span<const int32_t>(&one, 1), true}};
  Status s = eng->step(bad1, &so);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.message();
  unchanged("unknown sequence");
  // Token outside the vocabulary.
  int32_t big = static_cast<int32_t>(V);
  engine::StepItem bad2{*a, std::span<const int32_t>(&big, 1), true};
  s = eng->step(std::span<const engine::StepItem>(&bad2, 1), &so);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.message();
  unchanged("token out of vocabulary");
  // Context overflow: 40 + 30 > 64.
  auto more = seeded_tokens(30, V, 10);
  engine::StepItem bad3{*a, more, true};
  s = eng->step(std::span<const engine::StepItem>(&bad3, 1), &so);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.message();
  unchanged("context overflow");
  // The same sequence twice.
  std::vector<engine::StepItem> bad4{{*a, std::span<const int32_t>(&one, 1), true},
                                     {*a, std::span<const int32_t>(&one, 1), true}};
  s = eng->step(bad4, &so);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  unchanged("sequence twice");
  EXPECT_EQ(eng->free_sequence(12345).code(), StatusCode::kNotFound);
  // The state still continues exactly: one more token matches the CPU reference.
  auto st = cpu.model->new_sequence();
  model::ForwardOptions o;
  o.logits = model::LogitsRows::kNone;
  ASSERT_TRUE(cpu.model->prefill(*st, toks, 0, o).ok());
  auto w = cpu.model->decode_step(*st, one, model::ForwardOptions{});
  ASSERT_TRUE(w.ok());
  engine::StepItem good{*a, std::span<const int32_t>(&one, 1), true};
  s = eng->step(std::span<const engine::StepItem>(&good, 1), &so);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_rows_close(w->logits, so.logits, V, kTolGpuLogits, "after errors");
  EXPECT_TRUE(eng->free_sequence(*a).ok());
  EXPECT_EQ(eng->live_sequences(), 0);
  EXPECT_EQ(eng->pool().pages().used_pages(), 0);
}

}  // namespace
}  // namespace ds41::testing
