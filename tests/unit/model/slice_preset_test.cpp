// The v41-flash-slice preset (issue 10): released widths on 8 layers with one of every CSA2 kind
// in schedule order (MODEL_SPEC 1.5), its global KV bytes per token (MODEL_SPEC 5.3), its weight
// bytes (the tensor contract, MODEL_SPEC 2), and that it fits one H200 (139 GiB) with 1M tokens
// of global KV.
#include <gtest/gtest.h>

#include "model/kv_layout.h"
#include "model/layer_schedule.h"
#include "model/loader/tensor_contract.h"
#include "model/presets.h"

namespace ds41::model {
namespace {

// Payload bytes of the slice's tensor contract (64.65 GB = 60.2 GiB; `ds41 inspect` of
// `make-checkpoint --preset v41-flash-slice --layout-only`): FP4 experts 54.36 GB + their E8M0
// scales, BF16 2.70 GB (embedding 1.32 GB), E4M3 4.09 GB (head, attention, shared experts, Engram
// tables of 4,803,306 and 4,810,604 rows x 256), F32 31 MB (mHC, sinks, router biases).
constexpr uint64_t kSliceWeightBytes = 64'649'508'208ULL;

TEST(SlicePreset, ParsesWithTheReleasedWidths) {
  auto c = preset_config("v41-flash-slice");
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto back = parse_model_config(model_config_to_json(*c));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_TRUE(validate_model_config(*back).ok()) << validate_model_config(*back).message();
  auto r = preset_config("v41-flash");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(back->hidden_size, 5120);
  EXPECT_EQ(back->num_attention_heads, 64);
  EXPECT_EQ(back->head_dim, 512);
  EXPECT_EQ(back->q_lora_rank, 1280);
  EXPECT_EQ(back->o_groups, r->o_groups);
  EXPECT_EQ(back->o_lora_rank, r->o_lora_rank);
  EXPECT_EQ(back->index_n_heads, 32);
  EXPECT_EQ(back->index_head_dim, 128);
  EXPECT_EQ(back->index_topk, 512);
  EXPECT_EQ(back->candidate_topk_blocks, 2048);
  EXPECT_EQ(back->candidate_block_size, 8);
  EXPECT_EQ(back->n_routed_experts, 384);
  EXPECT_EQ(back->num_experts_per_tok, 6);
  EXPECT_EQ(back->moe_intermediate_size, 2304);
  EXPECT_EQ(back->n_shared_experts, 1);
  EXPECT_EQ(back->vocab_size, 129280);
  EXPECT_EQ(back->sliding_window, 128);
  EXPECT_EQ(back->hc_mult, 4);
  EXPECT_EQ(back->num_hidden_layers, 8);
  EXPECT_EQ(back->num_nextn_predict_layers, 0);
  EXPECT_FALSE(back->has_vision);
  // Engram: the released heads and dim, fewer rows (primes from 200,000).
  EXPECT_EQ(back->engram_n_heads, r->engram_n_heads);
  EXPECT_EQ(back->engram_head_dim, r->engram_head_dim);
  ASSERT_EQ(back->engram_num_embeddings.size(), 2u);
  for (int64_t rows : back->engram_num_embeddings) {
    EXPECT_GT(rows, 4'000'000);
    EXPECT_LT(rows, r->engram_num_embeddings[0] / 50);
  }
  EXPECT_EQ(preset_default_shards("v41-flash-slice"), 8);
}

TEST(SlicePreset, ScheduleHasEveryKindInOrder) {
  auto c = preset_config("v41-flash-slice");
  ASSERT_TRUE(c.ok());
  auto s = derive_layer_schedule(*c);
  ASSERT_TRUE(s.ok()) << s.status().message();
  struct Want {
    AttnMode mode;
    int64_t ratio;
    bool engram, candidate_source, candidate_restricted;
  };
  const std::vector<Want> want = {
      {AttnMode::kWindowOnly, 0, false, false, false},  // window-only
      {AttnMode::kWindowOnly, 0, true, false, false},   // Engram (window-only, as released layer 1)
      {AttnMode::kFull, 2, true, false, false},         // ratio-2 Full (+ Engram, as released layer 14)
      {AttnMode::kReuse, 2, false, false, false},       // ratio-2 Reuse
      {AttnMode::kFull, 1, false, true, false},         // ratio-1 Full + candidate source
      {AttnMode::kReuse, 1, false, false, false},       // Reuse
      {AttnMode::kReindex, 1, false, false, true},      // Reindex, restricted to the candidate pool
      {AttnMode::kReuse, 1, false, false, false},       // Reuse
  };
  ASSERT_EQ(s->layers.size(), want.size());
  for (size_t l = 0; l < want.size(); ++l) {
    SCOPED_TRACE(l);
    const LayerPlan& p = s->layers[l];
    EXPECT_EQ(p.mode, want[l].mode);
    EXPECT_EQ(p.ratio, want[l].ratio);
    EXPECT_EQ(p.engram, want[l].engram);
    EXPECT_EQ(p.candidate_source, want[l].candidate_source);
    EXPECT_EQ(p.candidate_restricted, want[l].candidate_restricted);
  }
  EXPECT_TRUE(s->layers[2].has_gate);
  EXPECT_FALSE(s->layers[4].has_gate);
}

TEST(SlicePreset, KvBytesPerTokenWeightBytesAndItFitsOneH200) {
  auto c = preset_config("v41-flash-slice");
  ASSERT_TRUE(c.ok());
  auto s = derive_layer_schedule(*c);
  ASSERT_TRUE(s.ok());
  auto kv = make_kv_layout(*c, *s);
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  // MODEL_SPEC 5.3: (288 + 68) / 2 for the ratio-2 source + (288 + 68) / 1 for the ratio-1 source.
  EXPECT_DOUBLE_EQ(kv->global_bytes_per_token(), 534.0);
  EXPECT_EQ(kv->window_ring_bytes(), 8 * 128 * 528);
  auto k = derive_tensor_contract(*c, *s);
  ASSERT_TRUE(k.ok()) << k.status().message();
  const uint64_t weights = k->payload_bytes();
  EXPECT_EQ(weights, kSliceWeightBytes);
  // One H200: 139 GiB usable. Weights + 1M tokens of global KV + the window rings + 4 GiB of
  // activations and workspaces must fit, leaving room.
  const double h200 = 139.0 * (1ull << 30);
  const double need = static_cast<double>(weights) + kv->global_bytes_per_token() * 1048576.0 +
                      static_cast<double>(kv->window_ring_bytes()) + 4.0 * (1ull << 30);
  EXPECT_LT(need, h200) << "needs " << need / (1ull << 30) << " GiB";
  // ... with room for far more than 1M tokens of global KV.
  const double kv_tokens =
      (h200 - static_cast<double>(weights) - 4.0 * (1ull << 30)) / kv->global_bytes_per_token();
  EXPECT_GT(kv_tokens, 1e8);
}

}  // namespace
}  // namespace ds41::model
