// Tensor contract (MODEL_SPEC 2): the golden checkpoint passes exactly; the released config gives
// the MODEL_SPEC 2.6 totals from the contract alone; every mismatch kind is reported at once.
#include "model/loader/tensor_contract.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "model/layer_schedule.h"
#include "model/loader/checkpoint_writer.h"
#include "model/loader/safetensors.h"
#include "model/presets.h"

namespace ds41::model {
namespace {

const std::string kGolden = std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-public";

TensorContract contract_for(const ModelConfig& c) {
  auto s = derive_layer_schedule(c);
  EXPECT_TRUE(s.ok()) << s.status().message();
  auto k = derive_tensor_contract(c, *s);
  EXPECT_TRUE(k.ok()) << k.status().message();
  return std::move(k).value();
}

TEST(TensorContract, GoldenCheckpointMatchesExactly) {
  auto c = load_model_config(kGolden);
  ASSERT_TRUE(c.ok()) << c.status().message();
  TensorContract k = contract_for(*c);
  auto ck = Checkpoint::open(kGolden);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  ContractReport r = check_checkpoint(**ck, k);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.expected_tensors, 657u);
  EXPECT_EQ(r.found_tensors, 657u);
  EXPECT_EQ(r.matched_tensors, 657u);
  EXPECT_EQ((*ck)->payload_bytes(), k.payload_bytes());
  EXPECT_TRUE(validate_checkpoint(**ck, k).ok());
  // Shapes that depend on the config's constant relations (MODEL_SPEC 2.3).
  ASSERT_NE(k.find("layers.1.engram.wkv.weight"), nullptr);
  EXPECT_EQ(k.find("layers.1.engram.wkv.weight")->shape, (std::vector<int64_t>{960, 384}));
  EXPECT_EQ(k.find("layers.3.engram.embed.weight")->shape, (std::vector<int64_t>{3904, 64}));
  EXPECT_EQ(k.find("layers.2.attn.compressor.wgate.weight")->shape, (std::vector<int64_t>{128, 192}));
  EXPECT_EQ(k.find("layers.4.attn.compressor.wgate.weight"), nullptr);  // ratio 1: no gate
  EXPECT_EQ(k.find("layers.6.attn.indexer.wk.weight"), nullptr);        // Reindex: query only
  EXPECT_NE(k.find("layers.6.attn.indexer.wq_b.scale"), nullptr);
}

TEST(TensorContract, ReleasedConfigTotalsFromContractAlone) {
  auto c = preset_config("v41-flash");
  ASSERT_TRUE(c.ok());
  TensorContract k = contract_for(*c);
  EXPECT_EQ(k.tensors.size(), 96085u);
  EXPECT_EQ(k.payload_bytes(), 510286023000ull);
  auto d = k.by_dtype();
  EXPECT_EQ(d[DType::kI8].count, 47232u);
  EXPECT_EQ(d[DType::kI8].bytes, 278585671680ull);
  EXPECT_EQ(d[DType::kF8E4M3].count, 357u);
  EXPECT_EQ(d[DType::kF8E4M3].bytes, 204015223296ull);
  EXPECT_EQ(d[DType::kF8E8M0].count, 47589u);
  EXPECT_EQ(d[DType::kF8E8M0].bytes, 23563015184ull);
  EXPECT_EQ(d[DType::kBF16].count, 520u);
  EXPECT_EQ(d[DType::kBF16].bytes, 3952883712ull);
  EXPECT_EQ(d[DType::kF32].count, 387u);
  EXPECT_EQ(d[DType::kF32].bytes, 169229128ull);
  EXPECT_EQ(d.size(), 5u);
  // MODEL_SPEC 2.6: per routed expert 18,800,640 B; Engram tables + scales 202,758,032,400 B.
  uint64_t expert0 = 0, engram = 0;
  for (const auto& t : k.tensors) {
    if (t.name.rfind("layers.7.ffn.experts.5.", 0) == 0) expert0 += t.nbytes();
    if (t.name.find(".engram.embed.") != std::string::npos) engram += t.nbytes();
  }
  EXPECT_EQ(expert0, 18800640u);
  EXPECT_EQ(engram, 202758032400ull);
  // Spot checks of MODEL_SPEC 2.3-2.5 shapes.
  EXPECT_EQ(k.find("layers.0.attn.wo_a.weight")->shape, (std::vector<int64_t>{8192, 4096}));
  EXPECT_EQ(k.find("layers.0.attn.wo_a.scale")->shape, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(k.find("layers.14.engram.wkv.weight")->shape, (std::vector<int64_t>{25600, 6144}));
  EXPECT_EQ(k.find("layers.14.engram.embed.scale")->shape, (std::vector<int64_t>{384016682, 8}));
  EXPECT_EQ(k.find("layers.3.ffn.experts.383.w2.weight")->shape, (std::vector<int64_t>{5120, 1152}));
  EXPECT_EQ(k.find("layers.3.ffn.experts.383.w2.scale")->shape, (std::vector<int64_t>{5120, 72}));
  EXPECT_EQ(k.find("mtp.0.main_proj.weight")->shape, (std::vector<int64_t>{5120, 15360}));
  EXPECT_EQ(k.find("mtp.2.confidence_head.proj.weight")->shape, (std::vector<int64_t>{1, 5376}));
  EXPECT_EQ(k.find("mtp.1.ffn.gate.weight")->shape, (std::vector<int64_t>{128, 5120}));
  EXPECT_EQ(k.find("mtp.1.ffn.experts.128.w1.weight"), nullptr);
  EXPECT_EQ(k.find("mtp.1.markov_head.embed.weight"), nullptr);
  EXPECT_EQ(k.find("vision.patch_embed.proj.weight")->shape, (std::vector<int64_t>{1024, 588}));
  EXPECT_EQ(k.find("aligner.w1.weight")->shape, (std::vector<int64_t>{5120, 9216}));
  EXPECT_EQ(k.find("layers.20.attn.compressor.wgate.weight"), nullptr);
  EXPECT_NE(k.find("layers.14.attn.compressor.wgate.weight"), nullptr);
  EXPECT_EQ(k.find("layers.24.attn.indexer.wk.weight"), nullptr);
  EXPECT_NE(k.find("layers.24.attn.indexer.weights_proj.weight"), nullptr);
  // "_scale" (mHC) is F32, ".scale" is E8M0 (MODEL_SPEC 7.18).
  EXPECT_EQ(k.find("layers.0.hc_attn_scale")->dtype, DType::kF32);
  EXPECT_EQ(k.find("layers.0.attn.wq_a.scale")->dtype, DType::kF8E8M0);
}

TEST(TensorContract, ShapesFollowTheConfigNotConstants) {
  // Change every size in the tiny preset; the contract must follow.
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  ModelConfig m = *c;
  m.hidden_size = 256;
  m.n_routed_experts = 5;
  m.num_experts_per_tok = 2;
  m.moe_intermediate_size = 96;
  m.hc_mult = 3;
  m.engram_n_heads = 3;
  m.engram_max_ngram_size = 3;
  m.engram_num_embeddings = engram_table_rows(2, 2, 3, 600);
  TensorContract k = contract_for(m);
  EXPECT_EQ(k.find("layers.1.engram.wkv.weight")->shape, (std::vector<int64_t>{4 * 256, 2 * 3 * 64}));
  EXPECT_EQ(k.find("layers.1.engram.q_weight")->shape, (std::vector<int64_t>{3, 256}));
  EXPECT_EQ(k.find("layers.0.hc_ffn_fn")->shape, (std::vector<int64_t>{15, 768}));
  EXPECT_EQ(k.find("layers.0.ffn.experts.4.w2.weight")->shape, (std::vector<int64_t>{256, 48}));
  EXPECT_EQ(k.find("layers.0.ffn.experts.5.w2.weight"), nullptr);
  EXPECT_EQ(k.find("layers.0.ffn.experts.4.w1.scale")->shape, (std::vector<int64_t>{96, 8}));
  EXPECT_EQ(k.find("layers.0.ffn.shared_experts.w2.scale")->shape, (std::vector<int64_t>{8, 3}));
}

TEST(TensorContract, ImpossibleShapesAreErrorsNamingTheTensor) {
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  ModelConfig m = *c;
  m.moe_intermediate_size = 48;  // FP4 w2 input not a multiple of 32
  auto s = derive_layer_schedule(m);
  ASSERT_TRUE(s.ok());
  auto k = derive_tensor_contract(m, *s);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("ffn.experts.0.w2: FP4 input width 48"), std::string::npos)
      << k.status().message();
  m = *c;
  m.num_nextn_predict_layers = 1;
  m.dspark_n_routed_experts = 0;
  k = derive_tensor_contract(m, *s);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("dspark_n_routed_experts"), std::string::npos);
}

// Writes the contract with a few tensors changed and checks that every change is reported.
TEST(TensorContract, ReportsEveryMismatchAtOnce) {
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  TensorContract k = contract_for(*c);
  std::vector<TensorSpec> specs;
  for (const auto& t : k.tensors) {
    if (t.name == "layers.5.ffn.gate.bias") continue;        // missing
    if (t.name == "layers.3.attn.kv_norm.weight") continue;  // missing
    TensorSpec s{t.name, t.dtype, t.shape};
    if (t.name == "layers.2.attn.wq_a.weight") s.dtype = DType::kI8;     // wrong dtype (same size)
    if (t.name == "layers.0.attn.attn_sink") s.shape = {2, 2};           // wrong shape
    if (t.name == "layers.4.ffn.experts.3.w1.scale") s.shape = {64, 3};  // wrong shape
    if (t.name == "norm.weight") {
      s.dtype = DType::kF32;
      s.shape = {96};
    }  // wrong dtype + shape
    specs.push_back(s);
  }
  specs.push_back({"layers.0.attn.compressor.wgate.weight", DType::kBF16, {128, 192}});  // extra
  specs.push_back({"lm_head.weight", DType::kBF16, {4, 4}});                             // extra
  std::string dir = testing::TempDir() + "/contract_mismatch";
  std::filesystem::remove_all(dir);
  CheckpointWriteOptions o;
  o.shards = 3;
  o.layout_only = true;
  ASSERT_TRUE(write_checkpoint(dir, specs, o, nullptr).ok());
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  ContractReport r = check_checkpoint(**ck, k);
  EXPECT_FALSE(r.ok());
  std::string text = r.to_string(1000);
  EXPECT_EQ(r.mismatches.size(), 9u) << text;
  for (const char* want : {
           "missing: tensor 'layers.5.ffn.gate.bias', expected F32 [8]",
           "missing: tensor 'layers.3.attn.kv_norm.weight', expected BF16 [128]",
           "wrong dtype: tensor 'layers.2.attn.wq_a.weight' in ",
           "expected F8_E4M3 [96, 192], found I8 [96, 192]",
           "wrong shape: tensor 'layers.0.attn.attn_sink' in ",
           "expected F32 [4], found F32 [2, 2]",
           "expected F8_E8M0 [64, 6], found F8_E8M0 [64, 3]",
           "wrong dtype: tensor 'norm.weight'",
           "wrong shape: tensor 'norm.weight'",
           "unexpected: tensor 'layers.0.attn.compressor.wgate.weight' in ",
           "unexpected: tensor 'lm_head.weight' in ",
           "model-00001-of-00003.safetensors",
       })
    EXPECT_NE(text.find(want), std::string::npos) << "missing '" << want << "' in:\n" << text;
  Status v = validate_checkpoint(**ck, k);
  EXPECT_FALSE(v.ok());
  EXPECT_NE(v.message().find("lm_head.weight"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds41::model
