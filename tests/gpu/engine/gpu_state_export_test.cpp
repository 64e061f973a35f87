// State export / import and bounded replay on the GPU engine (issue 13, docs/formats/kv_block.md
// "Engine state payloads"), on the golden tiny model and the generated `small` model, with
// prompts past every limit of their config (small: window 32, top-k 64, pool 16 x 8; golden:
// window 8, top-k 8, pool 6 x 2), more than one 128-token block, a partial last block and an odd
// length (a ratio-2 pending group half filled):
//   - GPU export -> GPU import continues bit-identically to the un-exported sequence (same
//     kernels, same state) and re-exports the same bytes;
//   - the GPU's block bytes equal the CPU engine's for the same prompt on the rows before the
//     GPU's own flip point (gpu_test_util.h flip_free_rows: fake-quant midpoints may differ after);
//   - CPU export -> GPU import and GPU export -> CPU import continue within kTolGpuLogits of the
//     exporting engine's own continuation (the small model, random weights, flips within a few
//     rows, as in the parity test: strict on its first rows, printed after);
//   - replay_window (MODEL_SPEC 4.5) on blocks-only imports: GPU vs CPU logits, the snapshot
//     header (position, Engram look-back, window floors, tail counts) equal;
//   - bad payloads give the CPU engine's errors and leave the sequence fresh and the free page
//     count unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "engine/cpu_engine.h"
#include "engine/state_codec.h"
#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

constexpr int64_t kB = 128;

struct ExportCase {
  const char* name;
  bool small;
};

using Blocks = std::vector<std::vector<uint8_t>>;

std::vector<std::span<const uint8_t>> spans(const Blocks& b) {
  return std::vector<std::span<const uint8_t>>(b.begin(), b.end());
}

class GpuStateExport : public ::testing::TestWithParam<ExportCase> {
 protected:
  void SetUp() override {
    DS41_SKIP_WITHOUT_GPU();
    const std::string dir = GetParam().small ? small_model_dir() : golden_dir();
    cpu_model_ = load_cpu_model(dir, 8);
    ASSERT_TRUE(cpu_model_.model);
    cpu_ = std::make_unique<engine::CpuEngine>(cpu_model_.model.get(), "test");
    dev_ = load_device_model(dir);
    ASSERT_TRUE(dev_);
    gpu_ = make_engine(*dev_, 64);
    ASSERT_TRUE(gpu_);
    V_ = dev_->config().vocab_size;
    len_ = GetParam().small ? 293 : 297;  // 2 blocks + an odd partial block
  }
  std::vector<int32_t> tokens(int64_t n, uint64_t seed) { return seeded_tokens(n, V_, seed); }

  // A prefill of `t` (no logits) into a new sequence of `e`.
  engine::SeqId prefill(engine::Engine& e, std::span<const int32_t> t) {
    auto s = e.create_sequence();
    EXPECT_TRUE(s.ok()) << s.status().message();
    engine::StepItem it{*s, t, false};
    engine::StepOutput so;
    Status st = e.step(std::span<const engine::StepItem>(&it, 1), &so);
    EXPECT_TRUE(st.ok()) << st.message();
    return *s;
  }
  // Decode steps of `t` one token at a time; the logits rows [t.size(), V].
  std::vector<float> decode(engine::Engine& e, engine::SeqId s, std::span<const int32_t> t) {
    return decode_rows(e, s, t, V_);
  }
  void export_state(const engine::Engine& e, engine::SeqId s, Blocks* blocks, std::vector<uint8_t>* snap) {
    const int64_t pos = *e.sequence_position(s);
    blocks->clear();
    for (int64_t i = 0; i < pos / kB; ++i) {
      auto b = e.export_kv_block(s, i, kB);
      ASSERT_TRUE(b.ok()) << b.status().message();
      blocks->push_back(std::move(*b));
    }
    if (!snap) return;
    auto sn = e.export_swa_snapshot(s, kB, false);
    ASSERT_TRUE(sn.ok()) << sn.status().message();
    *snap = std::move(*sn);
  }
  // Rows of a continuation compared strictly: all for the golden model, the first 2 for the small
  // one (it flips within a few rows even from identical states; the rest are printed).
  // strict_rows: rows held to kTolGpuLogits (-1: all on the golden model); the small model is
  // held on its first 2 (it flips within a few rows), the rest is printed as the envelope.
  void expect_continuation_close(const std::vector<float>& want, const std::vector<float>& got,
                                 const std::string& what, int64_t strict_rows = -1) {
    int64_t strict = GetParam().small ? 2 : static_cast<int64_t>(want.size()) / V_;
    if (strict_rows >= 0) strict = std::min(strict, strict_rows);
    expect_rows_close(first_logit_rows(want, strict, V_), first_logit_rows(got, strict, V_), V_, kTolGpuLogits,
                      what);
    double e = 0;
    for (size_t r = 0; (r + 1) * V_ <= std::min(want.size(), got.size()); ++r)
      e = std::max(e, row_error(&want[r * V_], &got[r * V_], V_));
    std::cout << what << ": all " << want.size() / V_ << " rows max e_r " << e << "\n";
  }

  TestModel cpu_model_;
  std::unique_ptr<engine::CpuEngine> cpu_;
  std::unique_ptr<gpu::DeviceModel> dev_;
  std::unique_ptr<gpu::CudaEngine> gpu_;
  int64_t V_ = 0, len_ = 0;
};

TEST_P(GpuStateExport, GpuToGpuContinuesBitIdentically) {
  for (int64_t n : {int64_t{77}, int64_t{256}, len_}) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " tokens");
    auto t = tokens(n + 8, 11 + n);
    std::span<const int32_t> T(t);
    const engine::SeqId a = prefill(*gpu_, T.first(n));
    Blocks blocks;
    std::vector<uint8_t> snap;
    export_state(*gpu_, a, &blocks, &snap);
    const int64_t used = gpu_->pool().pages().used_pages();
    auto b = gpu_->create_sequence();
    ASSERT_TRUE(b.ok());
    Status st = gpu_->import_state(*b, spans(blocks), snap, kB);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(*gpu_->sequence_position(*b), n);
    EXPECT_EQ(*gpu_->sequence_bytes(*b), *gpu_->sequence_bytes(a));
    EXPECT_EQ(gpu_->pool().pages().used_pages(),
              used + gpu::KvBlockPool::pages_for_tokens(dev_->kv_layout(), n, gpu_->pool().geometry().entries_per_page));
    // The import re-exports the same bytes.
    Blocks blocks2;
    std::vector<uint8_t> snap2;
    export_state(*gpu_, *b, &blocks2, &snap2);
    EXPECT_TRUE(blocks2 == blocks);
    EXPECT_TRUE(snap2 == snap);
    // Both continue alone in their own steps (same batch shape): bit-identical logits.
    const auto want = decode(*gpu_, a, T.subspan(n));
    const auto got = decode(*gpu_, *b, T.subspan(n));
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
        << "an imported sequence must continue exactly like the exported one";
    ASSERT_TRUE(gpu_->free_sequence(a).ok());
    ASSERT_TRUE(gpu_->free_sequence(*b).ok());
  }
  EXPECT_EQ(gpu_->pool().pages().used_pages(), 0);
}

TEST_P(GpuStateExport, BlockBytesMatchTheCpuEngineBeforeTheFlipPoint) {
  auto t = tokens(len_, 21);
  const engine::SeqId c = prefill(*cpu_, t);
  const engine::SeqId g = prefill(*gpu_, t);
  Blocks cb, gb;
  export_state(*cpu_, c, &cb, nullptr);
  export_state(*gpu_, g, &gb, nullptr);
  ASSERT_EQ(cb.size(), gb.size());
  ASSERT_EQ(cb.size(), 2u);
  for (size_t i = 0; i < cb.size(); ++i) EXPECT_EQ(cb[i].size(), gb[i].size()) << "block " << i;
  // The GPU's own flip point (two GPU runs that differ only in float order, as the parity test):
  // before it the rows are the CPU's up to fake-quant midpoints; count equal entry rows there.
  std::vector<model::SequenceOutput> one, chunked;
  auto s1 = gpu_->create_sequence(), s2 = gpu_->create_sequence();
  const int64_t rows = std::min<int64_t>(64, len_);
  std::span<const int32_t> head = std::span<const int32_t>(t).first(rows);
  std::vector<engine::StepItem> i1{{*s1, head, true}};
  ASSERT_TRUE(gpu_->forward(i1, model::LogitsRows::kAll, false, &one).ok());
  model::SequenceOutput ch;
  for (int64_t p = 0; p < rows; p += 13) {
    std::vector<engine::StepItem> i2{{*s2, head.subspan(p, std::min<int64_t>(13, rows - p)), true}};
    ASSERT_TRUE(gpu_->forward(i2, model::LogitsRows::kAll, false, &chunked).ok());
    ch.append(std::move(chunked[0]));
  }
  const int64_t strict = flip_free_rows(one[0].logits, ch.logits, V_, kTolGpuLogits);
  const model::KvLayout& L = dev_->kv_layout();
  int64_t off = 0, equal = 0, total = 0;
  for (const model::KvSourceLayout& sl : L.sources) {
    const int64_t per = kB / sl.ratio, n = strict / sl.ratio;  // block 0's entries before the flip point
    for (int64_t k = 0; k < n; ++k) {
      const uint8_t* a = cb[0].data() + off + k * sl.kv_row_bytes;
      const uint8_t* b = gb[0].data() + off + k * sl.kv_row_bytes;
      const uint8_t* ka = cb[0].data() + off + per * sl.kv_row_bytes + k * sl.key_row_bytes;
      const uint8_t* kb = gb[0].data() + off + per * sl.kv_row_bytes + k * sl.key_row_bytes;
      equal += std::memcmp(a, b, sl.kv_row_bytes) == 0 && std::memcmp(ka, kb, sl.key_row_bytes) == 0;
      ++total;
    }
    off += per * sl.entry_bytes();
  }
  std::cout << GetParam().name << ": " << equal << " of " << total << " block-0 entries (positions < " << strict
            << ", the GPU's flip point) byte-equal to the CPU engine's\n";
  // A layout or offset bug leaves next to nothing equal; a midpoint flip changes single rows.
  // The small model (random weights) flips within a few rows: printed only.
  if (!GetParam().small) {
    EXPECT_GT(total, 0);
    EXPECT_GE(equal * 10, total * 9);
  }
}

TEST_P(GpuStateExport, CrossEngineImportContinues) {
  auto t = tokens(len_ + 8, 31);
  std::span<const int32_t> T(t);
  const std::span<const int32_t> prompt = T.first(len_), next = T.subspan(len_);
  // CPU export -> GPU import, against the CPU's own continuation.
  {
    const engine::SeqId c = prefill(*cpu_, prompt);
    Blocks blocks;
    std::vector<uint8_t> snap;
    export_state(*cpu_, c, &blocks, &snap);
    auto g = gpu_->create_sequence();
    ASSERT_TRUE(g.ok());
    Status st = gpu_->import_state(*g, spans(blocks), snap, kB);
    ASSERT_TRUE(st.ok()) << st.message();
    // The GPU holds the CPU's state byte for byte: it re-exports the CPU's payloads (the pending
    // group's a / b rows included).
    Blocks gb;
    std::vector<uint8_t> gs;
    export_state(*gpu_, *g, &gb, &gs);
    EXPECT_TRUE(gb == blocks);
    EXPECT_TRUE(gs == snap);
    const auto want = decode(*cpu_, c, next);
    const auto got = decode(*gpu_, *g, next);
    expect_continuation_close(want, got, std::string(GetParam().name) + " CPU export -> GPU import");
  }
  // GPU export -> CPU import, against the GPU's own continuation.
  {
    const engine::SeqId g = prefill(*gpu_, prompt);
    Blocks blocks;
    std::vector<uint8_t> snap;
    export_state(*gpu_, g, &blocks, &snap);
    auto c = cpu_->create_sequence();
    ASSERT_TRUE(c.ok());
    Status st = cpu_->import_state(*c, spans(blocks), snap, kB);
    ASSERT_TRUE(st.ok()) << st.message();
    Blocks cb;
    std::vector<uint8_t> cs;
    export_state(*cpu_, *c, &cb, &cs);
    EXPECT_TRUE(cb == blocks);
    EXPECT_TRUE(cs == snap);
    const auto want = decode(*gpu_, g, next);
    const auto got = decode(*cpu_, *c, next);
    expect_continuation_close(want, got, std::string(GetParam().name) + " GPU export -> CPU import");
  }
}

TEST_P(GpuStateExport, ReplayWindowMatchesTheCpu) {
  auto t = tokens(len_ + 8, 41);
  std::span<const int32_t> T(t);
  const std::span<const int32_t> prompt = T.first(len_), next = T.subspan(len_);
  // One set of blocks (the CPU's) for both engines, so the global KV is the same.
  const engine::SeqId src = prefill(*cpu_, prompt);
  Blocks blocks;
  export_state(*cpu_, src, &blocks, nullptr);
  const int64_t H = static_cast<int64_t>(blocks.size()) * kB;  // blocks-only: position n * B
  const std::span<const int32_t> prefix = prompt.first(H);
  auto c = cpu_->create_sequence();
  auto g = gpu_->create_sequence();
  ASSERT_TRUE(c.ok() && g.ok());
  ASSERT_TRUE(cpu_->import_state(*c, spans(blocks), {}, kB).ok());
  Status st = gpu_->import_state(*g, spans(blocks), {}, kB);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(*gpu_->sequence_position(*g), H);
  // Replay errors as the CPU's.
  for (std::span<const int32_t> bad : {prefix.first(0), prefix.first(H - 1)}) {
    Status ce = cpu_->replay_window(*c, bad), ge = gpu_->replay_window(*g, bad);
    EXPECT_EQ(ge.code(), ce.code()) << ge.message();
    EXPECT_EQ(ge.message(), ce.message());
    EXPECT_EQ(*gpu_->sequence_position(*g), H);
  }
  ASSERT_TRUE(cpu_->replay_window(*c, prefix).ok());
  st = gpu_->replay_window(*g, prefix);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(*gpu_->sequence_position(*g), H);
  // The snapshots after the replay agree on the header, the Engram look-back, the window floors
  // and the source table (the rows are float results: compared through the continuation).
  auto cs = cpu_->export_swa_snapshot(*c, kB, true);
  auto gs = gpu_->export_swa_snapshot(*g, kB, true);
  ASSERT_TRUE(cs.ok() && gs.ok());
  const model::KvLayout& L = dev_->kv_layout();
  const size_t fixed = swa_snapshot_fixed_bytes(L);
  ASSERT_GE(cs->size(), fixed);
  ASSERT_EQ(cs->size(), gs->size());
  EXPECT_TRUE(std::equal(cs->begin(), cs->begin() + fixed, gs->begin()))
      << "replay state (position, Engram look-back, floors, tail counts) differs from the CPU's";
  // Continue with the rest of the prompt and the next tokens.
  std::vector<int32_t> rest(prompt.begin() + H, prompt.end());
  rest.insert(rest.end(), next.begin(), next.end());
  const auto want = decode(*cpu_, *c, rest);
  const auto got = decode(*gpu_, *g, rest);
  // Strict on the first 12 rows: everything the replay rebuilt (window rings from b, pending
  // groups, Engram look-back) is read within the first window (8 rows on the golden model) of
  // the continuation. Past that both engines continue from an approximate window state in float;
  // on the H200 the golden continuation parted from the CPU's at row 14 (e_r 0.0058, then a
  // top-k flip at row 15: 0.13), a fake-quant flip like the parity test's (golden README
  // "Discontinuities"), not a state difference.
  expect_continuation_close(want, got, std::string(GetParam().name) + " replay_window", 12);
}

TEST_P(GpuStateExport, BadPayloadsGiveTheCpuErrorsAndLeaveTheSequenceFresh) {
  auto t = tokens(len_, 51);
  const engine::SeqId src = prefill(*cpu_, t);
  Blocks blocks;
  std::vector<uint8_t> snap;
  export_state(*cpu_, src, &blocks, &snap);
  auto c = cpu_->create_sequence();
  auto g = gpu_->create_sequence();
  ASSERT_TRUE(c.ok() && g.ok());
  const int64_t free0 = gpu_->pool().pages().free_pages(), bytes0 = *gpu_->sequence_bytes(*g);
  auto check = [&](const std::string& what, const Blocks& b, std::span<const uint8_t> s, int64_t B) {
    Status ce = cpu_->import_state(*c, spans(b), s, B);
    Status ge = gpu_->import_state(*g, spans(b), s, B);
    EXPECT_FALSE(ge.ok()) << what;
    EXPECT_EQ(ge.code(), ce.code()) << what << ": " << ge.message() << " vs " << ce.message();
    EXPECT_EQ(ge.message(), ce.message()) << what;
    EXPECT_EQ(*gpu_->sequence_position(*g), 0) << what;
    EXPECT_EQ(*gpu_->sequence_bytes(*g), bytes0) << what;
    EXPECT_EQ(gpu_->pool().pages().free_pages(), free0) << what;
  };
  std::vector<uint8_t> s2(snap.begin(), snap.end() - 1);
  check("truncated snapshot", blocks, s2, kB);
  s2 = snap;
  s2.push_back(0);
  check("trailing snapshot bytes", blocks, s2, kB);
  s2 = snap;
  s2[20] ^= 1;  // n_layers (after version, flags, position, block_tokens)
  check("wrong layout (n_layers)", blocks, s2, kB);
  Blocks b2(blocks.begin(), blocks.end() - 1);
  check("wrong block count", b2, snap, kB);
  b2 = blocks;
  b2[1].pop_back();
  check("truncated block", b2, snap, kB);
  check("block size not a multiple of the ratios", blocks, snap, 3);
  check("another block size", blocks, snap, 64);
  // Exports of what the sequence has not consumed (or a bad block size) answer as the CPU's.
  for (auto [i, B] : {std::pair<int64_t, int64_t>{2, kB}, {-1, kB}, {0, 3}}) {
    auto ce = cpu_->export_kv_block(src, i, B);
    const engine::SeqId gs = prefill(*gpu_, t);
    auto ge = gpu_->export_kv_block(gs, i, B);
    ASSERT_FALSE(ge.ok());
    EXPECT_EQ(ge.status().code(), ce.status().code());
    EXPECT_EQ(ge.status().message(), ce.status().message());
    ASSERT_TRUE(gpu_->free_sequence(gs).ok());
  }
  // A non-fresh sequence.
  ASSERT_TRUE(gpu_->import_state(*g, spans(blocks), snap, kB).ok());
  ASSERT_TRUE(cpu_->import_state(*c, spans(blocks), snap, kB).ok());
  const int64_t free1 = gpu_->pool().pages().free_pages();
  Status ce = cpu_->import_state(*c, spans(blocks), snap, kB);
  Status ge = gpu_->import_state(*g, spans(blocks), snap, kB);
  EXPECT_EQ(ge.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ge.message(), ce.message());
  EXPECT_EQ(gpu_->pool().pages().free_pages(), free1);
  EXPECT_EQ(*gpu_->sequence_position(*g), len_);
  ASSERT_TRUE(gpu_->free_sequence(*g).ok());
  EXPECT_EQ(gpu_->pool().pages().free_pages(), gpu_->pool().pages().total_pages());
}

INSTANTIATE_TEST_SUITE_P(Models, GpuStateExport, ::testing::Values(ExportCase{"golden", false}, ExportCase{"small", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace ds41::testing
