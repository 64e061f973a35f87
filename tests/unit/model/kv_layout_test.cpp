// KV accounting for the released config (MODEL_SPEC 5.2-5.4), computed from a ModelConfig
// filled with the released values, without allocating a model.
#include "model/kv_layout.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "model/presets.h"

#include "model/sequence_state.h"

namespace ds41::model {
namespace {

// The released config (MODEL_SPEC 1.3) is the v41-flash preset.
ModelConfig released_config() {
  auto c = preset_config("v41-flash");
  DS41_CHECK(c.ok());
  return *c;
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
