// The GPU engine against ../shared/golden/v41-tiny-public with the golden test's tolerances
// (tests/golden/forward_golden_test.cpp): every logits row of the 3 prompts and the 16 decode
// steps within e_r <= 5e-3, Engram hash ids and candidate masks equal, top-k and router selections
// equal as sets. prompt2 (297 tokens) exceeds every limit of the config.
#include <gtest/gtest.h>

#include "gpu/engine/gpu_test_util.h"

namespace ds41::testing {
namespace {

constexpr double kTolGoldenLogits = 5e-3;  // golden README table

TEST(GpuGolden, PromptsSelectionsAndDecode) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(golden_dir());
  ASSERT_TRUE(dev);
  const model::ModelConfig& c = dev->config();
  const int64_t V = c.vocab_size;
  auto eng = make_engine(*dev, 512);
  ASSERT_TRUE(eng);
  GoldenFile gold(golden_dir() + "/goldens.safetensors");
  engine::SeqId s2 = -1;
  for (int i = 0; i < 3; ++i) {
    const std::string P = "prompt" + std::to_string(i);
    SCOPED_TRACE(P);
    auto ids = gold.get<int32_t>(P + ".input_ids");
    const int64_t S = ids.rows();
    auto seq = eng->create_sequence();
    ASSERT_TRUE(seq.ok());
    std::vector<engine::StepItem> items{{*seq, ids.v, true}};
    std::vector<model::SequenceOutput> out;
    Status st = eng->forward(items, model::LogitsRows::kAll, true, &out);
    ASSERT_TRUE(st.ok()) << st.message();
    auto gl = gold.get<float>(P + ".logits");
    ASSERT_EQ(static_cast<int64_t>(out[0].logits.size()), S * V);
    expect_rows_close(gl.v, out[0].logits, V, kTolGoldenLogits, "gpu " + P + " logits");
    EXPECT_EQ(out[0].record.hash_ids, gold.get<int32_t>(P + ".engram_hash_ids").v);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string L = P + ".layer" + std::to_string(l);
      const model::LayerPlan& p = dev->schedule().layers[l];
      if (p.index_source) {
        auto g = gold.get<int32_t>(L + ".topk_indices");
        const auto& mine = out[0].record.topk.at(l);
        for (int64_t r = 0; r < S; ++r)
          EXPECT_EQ(id_set(&mine[r * c.index_topk], c.index_topk),
                    id_set(&g.v[r * g.row_size()], g.row_size()))
              << L << " row " << r;
      }
      if (p.candidate_source) {
        auto g = gold.get<uint8_t>(L + ".candidate_mask");
        const int64_t T = g.row_size(), B = c.candidate_block_size, nb = c.candidate_topk_blocks;
        const auto& blocks = out[0].record.cand_blocks.at(l);
        std::vector<uint8_t> mask(S * T, 0);
        for (int64_t r = 0; r < S; ++r)
          for (int64_t j = 0; j < nb; ++j)
            if (blocks[r * nb + j] >= 0)
              for (int64_t t = blocks[r * nb + j] * B; t < std::min(T, (blocks[r * nb + j] + 1) * B); ++t)
                mask[r * T + t] = 1;
        EXPECT_EQ(mask, g.v) << L;
      }
      auto ge = gold.get<int32_t>(L + ".router_experts");
      const auto& me = out[0].record.router_experts.at(l);
      const int64_t k = c.num_experts_per_tok;
      for (int64_t r = 0; r < S; ++r)
        EXPECT_EQ(id_set(&me[r * k], k), id_set(&ge.v[r * k], k)) << L << " row " << r;
    }
    if (i == 2) s2 = *seq;
  }
  // Decode after prompt2, one token per engine step (the serving path).
  auto dids = gold.get<int32_t>("decode.input_ids");
  auto dl = gold.get<float>("decode.logits");
  std::vector<float> got;
  for (int64_t t = 0; t < dids.rows(); ++t) {
    engine::StepItem it{s2, std::span<const int32_t>(&dids.v[t], 1), true};
    engine::StepOutput so;
    Status st = eng->step(std::span<const engine::StepItem>(&it, 1), &so);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(*eng->sequence_position(s2), 297 + t + 1);
    got.insert(got.end(), so.logits.begin(), so.logits.end());
  }
  expect_rows_close(dl.v, got, V, kTolGoldenLogits, "gpu decode logits");
}

}  // namespace
}  // namespace ds41::testing
