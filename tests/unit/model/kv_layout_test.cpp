// KV accounting for the released config (MODEL_SPEC 5.2-5.4), computed from a ModelConfig
// filled with the released values, without allocating a model.
#include "model/kv_layout.h"

#include <gtest/gtest.h>

#include "model/sequence_state.h"

namespace ds41::model {
namespace {

ModelConfig released_config() {
  ModelConfig c;
  c.num_hidden_layers = 40;
  c.hidden_size = 5120;
  c.head_dim = 512;
  c.index_head_dim = 128;
  c.sliding_window = 128;
  c.compress_ratios.assign(43, 0);
  for (int l = 2; l < 20; ++l) c.compress_ratios[l] = 2;
  for (int l = 20; l < 40; ++l) c.compress_ratios[l] = 1;
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer_id = 20;
  c.engram_layer_ids = {1, 14};
  return c;
}

TEST(KvLayout, ReleasedConfigIs890BytesPerToken) {
  ModelConfig c = released_config();
  auto s = derive_layer_schedule(c);
  ASSERT_TRUE(s.ok()) << s.status().message();
  auto k = make_kv_layout(c, *s);
  ASSERT_TRUE(k.ok()) << k.status().message();
  ASSERT_EQ(k->sources.size(), 4u);
  EXPECT_EQ(k->sources[0].kv_row_bytes, 288);
  EXPECT_EQ(k->sources[0].key_row_bytes, 68);
  EXPECT_EQ(k->window_row_bytes, 528);
  EXPECT_DOUBLE_EQ(k->global_bytes_per_token(), 890.0);
  EXPECT_EQ(k->window_ring_bytes(), 2703360);  // MODEL_SPEC 5.4
}

TEST(KvLayout, SequenceStateSpendsWhatTheLayoutSays) {
  ModelConfig c = released_config();
  auto s = derive_layer_schedule(c);
  ASSERT_TRUE(s.ok());
  auto k = make_kv_layout(c, *s);
  ASSERT_TRUE(k.ok());
  SequenceState st(*k);
  EXPECT_EQ(st.global_kv_bytes(), 0);
  // Append 1000 tokens' worth of entries the way the compressor does.
  for (auto& src : st.sources()) {
    src.count = 1000 / src.layout.ratio;
    src.kv_rows.resize(src.count * src.layout.kv_row_bytes);
    src.key_rows.resize(src.count * src.layout.key_row_bytes);
  }
  EXPECT_EQ(st.global_kv_bytes(), 890 * 1000);
}

TEST(KvLayout, RejectsDimsOffTheQuantBlocks) {
  ModelConfig c = released_config();
  c.index_head_dim = 100;
  auto s = derive_layer_schedule(c);
  ASSERT_TRUE(s.ok());
  auto k = make_kv_layout(c, *s);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("index_head_dim"), std::string::npos);
}

}  // namespace
}  // namespace ds41::model
