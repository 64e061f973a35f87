// Tests for model/config and model/layer_schedule on the golden config and the released values.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/presets.h"

namespace ds41::model {
namespace {

const std::string kGoldenDir = std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-public";

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Config, ParsesGoldenConfig) {
  auto c = load_model_config(kGoldenDir);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->hidden_size, 192);
  EXPECT_EQ(c->num_hidden_layers, 8);
  EXPECT_EQ(c->engram_pad_token_id, 2);
  EXPECT_EQ(c->engram_num_embeddings, (std::vector<int64_t>{3688, 3904}));
  EXPECT_EQ(c->candidate_source_layer_id, 4);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 16);
}

TEST(Config, AcceptsBothPadKeySpellings) {
  auto j = nlohmann::json::parse(read_file(kGoldenDir + "/config.json"));
  j["text_config"].erase("engram_pad_token_id");
  j["text_config"]["engram_pad_id"] = 5;
  auto c = parse_model_config(j.dump());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engram_pad_token_id, 5);
  j["text_config"]["engram_pad_token_id"] = 6;
  auto d = parse_model_config(j.dump());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("disagree"), std::string::npos);
}

TEST(Config, ReportsEveryBadKeyAtOnce) {
  auto j = nlohmann::json::parse(read_file(kGoldenDir + "/config.json"));
  j["text_config"]["hidden_size"] = "wide";
  j["text_config"].erase("index_topk");
  j["text_config"]["compress_ratios"] = {0, 1};
  auto c = parse_model_config(j.dump());
  ASSERT_FALSE(c.ok());
  const std::string& m = c.status().message();
  EXPECT_NE(m.find("text_config.hidden_size: expected an integer"), std::string::npos) << m;
  EXPECT_NE(m.find("text_config.index_topk: missing"), std::string::npos) << m;
  EXPECT_FALSE(parse_model_config("{not json").ok());
  EXPECT_FALSE(parse_model_config("[1,2]").ok());
}

TEST(Schedule, GoldenScheduleMatchesReadme) {
  auto c = load_model_config(kGoldenDir);
  ASSERT_TRUE(c.ok());
  auto s = derive_layer_schedule(*c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const auto& L = s->layers;
  ASSERT_EQ(L.size(), 8u);
  EXPECT_EQ(L[0].mode, AttnMode::kWindowOnly);
  EXPECT_EQ(L[1].mode, AttnMode::kWindowOnly);
  EXPECT_TRUE(L[1].engram);
  EXPECT_EQ(L[2].mode, AttnMode::kFull);
  EXPECT_TRUE(L[2].has_gate);
  EXPECT_EQ(L[3].mode, AttnMode::kReuse);
  EXPECT_EQ(L[3].kv_owner, 2);
  EXPECT_TRUE(L[3].engram);
  EXPECT_EQ(L[4].mode, AttnMode::kFull);
  EXPECT_FALSE(L[4].has_gate);  // ratio 1 KV source: no wgate (MODEL_SPEC 7.7)
  EXPECT_TRUE(L[4].candidate_source);
  EXPECT_EQ(L[5].mode, AttnMode::kReuse);
  EXPECT_EQ(L[6].mode, AttnMode::kReindex);
  EXPECT_EQ(L[6].kv_owner, 4);
  EXPECT_TRUE(L[6].candidate_restricted);
  EXPECT_EQ(L[7].idx_owner, 6);
  EXPECT_EQ(L[7].kv_owner, 4);
}

TEST(Schedule, ReleasedScheduleMatchesSpecTable) {
  // The v41-flash preset is the released config (MODEL_SPEC 1.3); the table below is MODEL_SPEC 1.5.
  auto c = preset_config("v41-flash");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = derive_layer_schedule(*c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const auto& L = s->layers;
  EXPECT_EQ(L[13].kv_owner, 8);
  EXPECT_EQ(L[19].kv_owner, 14);
  EXPECT_FALSE(L[20].has_gate);
  EXPECT_TRUE(L[14].has_gate);
  EXPECT_EQ(L[25].idx_owner, 24);
  EXPECT_EQ(L[25].kv_owner, 20);
  EXPECT_EQ(L[39].idx_owner, 36);
  EXPECT_EQ(L[36].mode, AttnMode::kReindex);
  EXPECT_TRUE(L[36].candidate_restricted);
  EXPECT_FALSE(L[20].candidate_restricted);
  EXPECT_FALSE(L[14].candidate_restricted);
  EXPECT_EQ(L[23].mode, AttnMode::kReuse);
}

TEST(Schedule, RejectsContradictions) {
  ModelConfig c;
  c.num_hidden_layers = 4;
  c.compress_ratios = {0, 2, 2, 1};
  c.kv_source_layer_ids = {2};
  c.index_source_layer_ids = {2};
  auto s = derive_layer_schedule(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("layer 1"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("layer 3"), std::string::npos) << s.status().message();
}

TEST(Safetensors, OpensGoldenCheckpoint) {
  auto ck = Checkpoint::open(kGoldenDir);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const TensorRef* e = (*ck)->find("embed.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info->dtype, DType::kBF16);
  EXPECT_EQ(e->info->shape, (std::vector<int64_t>{2048, 192}));
  const TensorRef* w = (*ck)->find("layers.2.attn.wq_a.scale");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->info->dtype, DType::kF8E8M0);
}

TEST(Safetensors, HeaderErrorsNameTheProblem) {
  auto bad = [](std::string j, uint64_t size, const char* needle) {
    auto r = parse_safetensors_header(j, size);
    ASSERT_FALSE(r.ok()) << j;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "beyond the data section");
  bad(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 100, "needs 12 bytes");
  bad(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 100, "unknown dtype");
  bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      100, "overlap");
  bad(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 100, "non-negative");
  bad(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 100, "< begin");
  bad("{", 100, "not valid JSON");
  auto ok = parse_safetensors_header(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", 8);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->metadata.at("format"), "pt");
}

}  // namespace
}  // namespace ds41::model
