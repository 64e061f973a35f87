// Engine state export / import (issue 13, docs/formats/kv_block.md "Engine state payloads") on
// the public golden tiny model (window 8, top-k 8, candidate pool 6 x 2, KV sources of ratio 2
// and 1): export at N, import into a fresh sequence, continue -> logits bit-identical to the
// uninterrupted sequence, for N past the window and every selection limit, N odd (a pending
// ratio-2 half pair), N not a multiple of 128, N below one block and exactly on a block boundary.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/cpu_engine.h"
#include "engine/state_codec.h"
#include "golden/golden_arrays.h"
#include "unit/engine/loop_test_util.h"

namespace ds41::engine {
namespace {

constexpr int64_t kB = 128;

class StateExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tm_ = new ds41::testing::TestModel(ds41::testing::load_golden_model(2)); }
  static void TearDownTestSuite() { delete tm_; }
  void SetUp() override {
    ASSERT_TRUE(tm_->model);
    eng_ = std::make_unique<CpuEngine>(tm_->model.get(), "tiny");
    V_ = eng_->info().vocab_size;
  }
  std::vector<float> run(SeqId s, std::span<const int32_t> t) {
    StepOutput out;
    std::vector<StepItem> items = {{s, t, true}};
    Status st = eng_->step(items, &out);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) return {};
    return std::vector<float>(out.logits.begin(), out.logits.begin() + V_);
  }
  static bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && !a.empty() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  // Exports blocks 0..N/B-1 and the snapshot of `s`.
  void export_state(SeqId s, std::vector<std::vector<uint8_t>>* blocks, std::vector<uint8_t>* snap,
                    bool approx = false) {
    const int64_t pos = *eng_->sequence_position(s);
    blocks->clear();
    for (int64_t i = 0; i < pos / kB; ++i) {
      auto b = eng_->export_kv_block(s, i, kB);
      ASSERT_TRUE(b.ok()) << b.status().message();
      blocks->push_back(std::move(*b));
    }
    auto sn = eng_->export_swa_snapshot(s, kB, approx);
    ASSERT_TRUE(sn.ok()) << sn.status().message();
    *snap = std::move(*sn);
  }
  static std::vector<std::span<const uint8_t>> views(const std::vector<std::vector<uint8_t>>& b) {
    return std::vector<std::span<const uint8_t>>(b.begin(), b.end());
  }
  static ds41::testing::TestModel* tm_;
  std::unique_ptr<CpuEngine> eng_;
  int64_t V_ = 0;
};
ds41::testing::TestModel* StateExportTest::tm_ = nullptr;

TEST_F(StateExportTest, BlockPayloadIsTheGlobalBytesPerTokenTimesTheBlock) {
  const model::KvLayout& L = tm_->model->kv_layout();
  EXPECT_EQ(static_cast<double>(kv_block_payload_bytes(L, kB)), L.global_bytes_per_token() * kB);
  EXPECT_TRUE(check_block_tokens(L, kB).ok());
  EXPECT_FALSE(check_block_tokens(L, 127).ok());  // ratio 2 does not divide it
  EXPECT_FALSE(check_block_tokens(L, 0).ok());
}

TEST_F(StateExportTest, ImportAtNContinuesBitIdentically) {
  for (int64_t N : {100, 128, 256, 257, 300, 383}) {
    SCOPED_TRACE("N = " + std::to_string(N));
    auto t = looptest::random_prompt_with_repeats(N + 60, static_cast<uint32_t>(N));
    std::span<const int32_t> T(t);
    const SeqId a = *eng_->create_sequence();
    // Chunks that straddle block and pair boundaries.
    for (int64_t p = 0; p < N;) {
      const int64_t n = std::min<int64_t>(97, N - p);
      run(a, T.subspan(p, n));
      p += n;
    }
    std::vector<std::vector<uint8_t>> blocks;
    std::vector<uint8_t> snap;
    export_state(a, &blocks, &snap);
    auto info = peek_swa_snapshot(snap);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->position, N);
    EXPECT_EQ(info->flags, 0u);
    const SeqId b = *eng_->create_sequence();
    Status st = eng_->import_state(b, views(blocks), snap, kB);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(*eng_->sequence_position(b), N);
    EXPECT_EQ(*eng_->sequence_bytes(b), *eng_->sequence_bytes(a));
    // The restored state exports the same bytes.
    std::vector<std::vector<uint8_t>> blocks2;
    std::vector<uint8_t> snap2;
    export_state(b, &blocks2, &snap2);
    EXPECT_EQ(blocks2, blocks);
    EXPECT_EQ(snap2, snap);
    // Continue both: a prefill chunk past the next block/pair boundaries, then decodes.
    EXPECT_TRUE(bitwise_equal(run(a, T.subspan(N, 41)), run(b, T.subspan(N, 41))));
    for (int64_t i = N + 41; i < N + 60; ++i)
      EXPECT_TRUE(bitwise_equal(run(a, T.subspan(i, 1)), run(b, T.subspan(i, 1)))) << "decode at " << i;
    ASSERT_TRUE(eng_->free_sequence(a).ok());
    ASSERT_TRUE(eng_->free_sequence(b).ok());
  }
}

TEST_F(StateExportTest, BlocksOnlyPlusReplayIsTheModelsEncoderReplay) {
  const int64_t N = 256;
  auto t = looptest::random_prompt_with_repeats(N + 20, 11);
  std::span<const int32_t> T(t);
  const SeqId a = *eng_->create_sequence();
  run(a, T.subspan(0, N));
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<uint8_t> snap;
  export_state(a, &blocks, &snap);
  // The reference: the model's own encoder replay on a copy of the exact state.
  const SeqId ref = *eng_->fork_sequence(a);
  ASSERT_TRUE(eng_->replay_window(ref, T.subspan(0, N)).ok());
  const SeqId b = *eng_->create_sequence();
  ASSERT_TRUE(eng_->import_state(b, views(blocks), {}, kB).ok());
  EXPECT_EQ(*eng_->sequence_position(b), N);
  Status st = eng_->replay_window(b, T.subspan(0, N));
  ASSERT_TRUE(st.ok()) << st.message();
  const auto replayed = run(b, T.subspan(N, 20));
  EXPECT_TRUE(bitwise_equal(run(ref, T.subspan(N, 20)), replayed));
  // A replay is an approximation: the exact continuation differs (tiny window: large drift).
  EXPECT_FALSE(bitwise_equal(run(a, T.subspan(N, 20)), replayed));
}

TEST_F(StateExportTest, ImportErrorsLeaveTheSequenceFresh) {
  const int64_t N = 300;
  auto t = looptest::random_prompt_with_repeats(N, 12);
  const SeqId a = *eng_->create_sequence();
  run(a, std::span<const int32_t>(t));
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<uint8_t> snap;
  export_state(a, &blocks, &snap, /*approx=*/true);
  EXPECT_EQ(peek_swa_snapshot(snap)->flags, kSwaFlagApproximate);
  const SeqId b = *eng_->create_sequence();
  auto expect_fails = [&](std::vector<std::vector<uint8_t>> bl, std::vector<uint8_t> sn, StatusCode code) {
    Status st = eng_->import_state(b, views(bl), sn, kB);
    EXPECT_EQ(st.code(), code) << st.message();
    EXPECT_EQ(*eng_->sequence_position(b), 0);
    EXPECT_EQ(*eng_->sequence_bytes(b), eng_->bytes_for_tokens(0));
  };
  expect_fails({blocks[0]}, snap, StatusCode::kInvalidArgument);  // snapshot needs 2 blocks
  auto short_block = blocks;
  short_block[1].pop_back();
  expect_fails(short_block, snap, StatusCode::kDataLoss);
  auto cut = snap;
  cut.resize(cut.size() - 5);
  expect_fails(blocks, cut, StatusCode::kDataLoss);
  auto extra = snap;
  extra.push_back(0);
  expect_fails(blocks, extra, StatusCode::kDataLoss);
  EXPECT_FALSE(eng_->import_state(b, views(blocks), snap, 64).ok());  // another block size
  EXPECT_EQ(*eng_->sequence_position(b), 0);
  // Not fresh.
  EXPECT_EQ(eng_->import_state(a, views(blocks), snap, kB).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(eng_->export_kv_block(a, 2, kB).status().code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(eng_->import_state(b, views(blocks), snap, kB).ok());
}

}  // namespace
}  // namespace ds41::engine
