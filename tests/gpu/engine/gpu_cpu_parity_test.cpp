// The GPU engine against the CPU reference (the oracle) on the golden tiny model and a generated
// `small` model (released row widths, real vocabulary): one-shot prefill, chunked prefill, decode
// steps, a mixed batch (a fresh prefill, a decode token and a prefill chunk of three sequences in
// one step), and fork. Sequences exceed the window, top-k and candidate limits of both configs
// (tiny: window 8, top-k 8, pool 6 blocks of 2; small: window 32, top-k 64, pool 16 blocks of 8).
// Logits rows within kTolGpuLogits (gpu_test_util.h); selections (top-k, candidate blocks,
// routing) equal as sets on every row of the short sequences; on long ones a fake-quant flip
// (golden README "Discontinuities") may tip a boundary, so at most 1% of rows may differ while the
// logits stay within tolerance.
#include <gtest/gtest.h>

#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

struct Case {
  const char* name;
  bool small;
};

class GpuCpuParity : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    DS41_SKIP_WITHOUT_GPU();
    dir_ = GetParam().small ? small_model_dir() : golden_dir();
    cpu_ = load_cpu_model(dir_, 8);
    ASSERT_TRUE(cpu_.model);
    dev_ = load_device_model(dir_);
    ASSERT_TRUE(dev_);
    eng_ = make_engine(*dev_, 400);
    ASSERT_TRUE(eng_);
    len_ = GetParam().small ? 160 : 297;  // both beyond every limit of their config
  }
  // CPU oracle: a fresh sequence prefilled (all rows, records) with `tokens`.
  model::SequenceOutput cpu_prefill(model::SequenceState& st, std::span<const int32_t> tokens) {
    model::ForwardOptions o;
    o.logits = model::LogitsRows::kAll;
    o.record = true;
    auto r = cpu_.model->prefill(st, tokens, 0, o);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r).value() : model::SequenceOutput{};
  }
  std::vector<int32_t> tokens(int64_t n, uint64_t seed) {
    return seeded_tokens(n, cpu_.model->config().vocab_size, seed);
  }
  std::string dir_;
  TestModel cpu_;
  std::unique_ptr<gpu::DeviceModel> dev_;
  std::unique_ptr<gpu::CudaEngine> eng_;
  int64_t len_ = 0;
};

TEST_P(GpuCpuParity, OneShotAndChunkedPrefill) {
  const model::ModelConfig& c = cpu_.model->config();
  const int64_t V = c.vocab_size;
  auto toks = tokens(len_, 1);
  auto st = cpu_.model->new_sequence();
  model::SequenceOutput want = cpu_prefill(*st, toks);
  // One shot.
  auto a = eng_->create_sequence();
  ASSERT_TRUE(a.ok());
  std::vector<engine::StepItem> items{{*a, toks, true}};
  std::vector<model::SequenceOutput> got;
  Status s = eng_->forward(items, model::LogitsRows::kAll, true, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_rows_close(want.logits, got[0].logits, V, kTolGpuLogits, std::string(GetParam().name) + " one-shot");
  EXPECT_EQ(got[0].record.hash_ids, want.record.hash_ids);
  const int64_t d1 = count_selection_diffs(want.record, got[0].record, c, "one-shot");
  EXPECT_LE(d1 * 100, len_ * static_cast<int64_t>(c.num_hidden_layers));
  // Chunks of 37 (odd: splits ratio-2 groups and candidate blocks across calls).
  auto b = eng_->create_sequence();
  ASSERT_TRUE(b.ok());
  model::SequenceOutput chunked;
  for (int64_t p = 0; p < len_; p += 37) {
    const int64_t e = std::min<int64_t>(len_, p + 37);
    std::vector<engine::StepItem> it{{*b, std::span<const int32_t>(toks).subspan(p, e - p), true}};
    std::vector<model::SequenceOutput> o;
    s = eng_->forward(it, model::LogitsRows::kAll, true, &o);
    ASSERT_TRUE(s.ok()) << s.message();
    chunked.append(std::move(o[0]));
  }
  expect_rows_close(want.logits, chunked.logits, V, kTolGpuLogits,
                    std::string(GetParam().name) + " chunked-37");
  const int64_t d2 = count_selection_diffs(want.record, chunked.record, c, "chunked");
  EXPECT_LE(d2 * 100, len_ * static_cast<int64_t>(c.num_hidden_layers));
  // Short prompt: selections exactly equal as sets.
  auto shortt = tokens(24, 2);
  auto st2 = cpu_.model->new_sequence();
  model::SequenceOutput w2 = cpu_prefill(*st2, shortt);
  auto cseq = eng_->create_sequence();
  std::vector<engine::StepItem> it2{{*cseq, shortt, true}};
  s = eng_->forward(it2, model::LogitsRows::kAll, true, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_rows_close(w2.logits, got[0].logits, V, kTolGpuLogits, "short");
  EXPECT_EQ(count_selection_diffs(w2.record, got[0].record, c, "short"), 0);
}

TEST_P(GpuCpuParity, DecodeStepsAndFork) {
  const int64_t V = cpu_.model->config().vocab_size;
  auto toks = tokens(len_ + 20, 3);
  std::span<const int32_t> prompt(toks.data(), len_);
  auto st = cpu_.model->new_sequence();
  cpu_prefill(*st, prompt);
  auto a = eng_->create_sequence();
  engine::StepItem pi{*a, prompt, true};
  engine::StepOutput so;
  ASSERT_TRUE(eng_->step(std::span<const engine::StepItem>(&pi, 1), &so).ok());
  auto f = eng_->fork_sequence(*a);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*eng_->sequence_bytes(*f), *eng_->sequence_bytes(*a));
  std::vector<float> want, got, got_fork;
  for (int64_t t = 0; t < 20; ++t) {
    auto o = cpu_.model->decode_step(*st, toks[len_ + t], model::ForwardOptions{});
    ASSERT_TRUE(o.ok());
    want.insert(want.end(), o->logits.begin(), o->logits.end());
    std::span<const int32_t> one(&toks[len_ + t], 1);
    std::vector<engine::StepItem> both{{*a, one, true}, {*f, one, true}};
    Status s = eng_->step(both, &so);
    ASSERT_TRUE(s.ok()) << s.message();
    got.insert(got.end(), so.logits.begin() + so.row[0] * V, so.logits.begin() + (so.row[0] + 1) * V);
    got_fork.insert(got_fork.end(), so.logits.begin() + so.row[1] * V,
                    so.logits.begin() + (so.row[1] + 1) * V);
  }
  expect_rows_close(want, got, V, kTolGpuLogits, std::string(GetParam().name) + " decode");
  expect_rows_close(want, got_fork, V, kTolGpuLogits, std::string(GetParam().name) + " decode (fork)");
  EXPECT_EQ(*eng_->sequence_position(*a), len_ + 20);
}

TEST_P(GpuCpuParity, MixedBatch) {
  const int64_t V = cpu_.model->config().vocab_size;
  // Three sequences: A fresh (a prefill of len/6 tokens), B prefilled 2len/5 then 1 decode token,
  // C prefilled 2len/3 then a chunk of 33, all in one engine step; the oracle runs them one by one.
  const int64_t la = len_ / 6, lb = 2 * len_ / 5, lc = 2 * len_ / 3;
  auto ta = tokens(la, 4), tb = tokens(lb + 1, 5), tc = tokens(lc + 33, 6);
  auto ga = eng_->create_sequence(), gb = eng_->create_sequence(), gc = eng_->create_sequence();
  engine::StepOutput so;
  std::vector<engine::StepItem> pre{{*gb, std::span<const int32_t>(tb).first(lb), false},
                                    {*gc, std::span<const int32_t>(tc).first(lc), false}};
  Status s = eng_->step(pre, &so);
  ASSERT_TRUE(s.ok()) << s.message();
  std::vector<engine::StepItem> mixed{{*ga, ta, true},
                                      {*gb, std::span<const int32_t>(tb).subspan(lb), true},
                                      {*gc, std::span<const int32_t>(tc).subspan(lc), true}};
  std::vector<model::SequenceOutput> got;
  s = eng_->forward(mixed, model::LogitsRows::kAll, true, &got);
  ASSERT_TRUE(s.ok()) << s.message();
  const model::ModelConfig& c = cpu_.model->config();
  const std::vector<int32_t>* all[3] = {&ta, &tb, &tc};
  const int64_t before[3] = {0, lb, lc};
  for (int i = 0; i < 3; ++i) {
    auto st = cpu_.model->new_sequence();
    model::ForwardOptions o;
    o.logits = model::LogitsRows::kNone;
    if (before[i] > 0) {
      ASSERT_TRUE(cpu_.model->prefill(*st, std::span<const int32_t>(*all[i]).first(before[i]), 0, o).ok());
    }
    o.logits = model::LogitsRows::kAll;
    o.record = true;
    auto w = cpu_.model->prefill(*st, std::span<const int32_t>(*all[i]).subspan(before[i]), 0, o);
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->positions, got[i].positions);
    expect_rows_close(w->logits, got[i].logits, V, kTolGpuLogits, "mixed seq " + std::to_string(i));
    const int64_t d = count_selection_diffs(w->record, got[i].record, c, "mixed seq " + std::to_string(i));
    EXPECT_LE(d * 100, static_cast<int64_t>(got[i].positions.size()) * c.num_hidden_layers);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuCpuParity, ::testing::Values(Case{"tiny", false}, Case{"small", true}),
                         [](const auto& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace ds41::testing
