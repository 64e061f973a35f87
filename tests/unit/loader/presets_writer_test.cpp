// Presets (config.json round trip, Engram prime sums), the streaming safetensors writer (holes,
// shards, index) and the random weights (deterministic, sane scales).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "model/layer_schedule.h"
#include "model/loader/checkpoint_writer.h"
#include "model/loader/safetensors.h"
#include "model/loader/tensor_contract.h"
#include "model/presets.h"
#include "model/random_weights.h"
#include "quant/weight_formats.h"

namespace ds41::model {
namespace {

TEST(Presets, EngramPrimeSumsReproduceGoldenAndReleasedConfigs) {
  // Golden: primes from 601 upward (engram_vocab_size 600), 3 orders x 2 heads (README).
  EXPECT_EQ(engram_table_rows(2, 3, 2, 600), (std::vector<int64_t>{3688, 3904}));
  // Released: MODEL_SPEC 1.3 engram_num_embeddings from engram_vocab_size 16,000,000.
  EXPECT_EQ(engram_table_rows(2, 3, 8, 16000000), (std::vector<int64_t>{384006168, 384016682}));
}

TEST(Presets, ConfigJsonRoundTripsForEveryPreset) {
  for (const std::string& name : preset_names()) {
    SCOPED_TRACE(name);
    auto c = preset_config(name);
    ASSERT_TRUE(c.ok()) << c.status().message();
    std::string text = model_config_to_json(*c);
    auto back = parse_model_config(text);
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(model_config_to_json(*back), text);
    EXPECT_EQ(back->engram_compressed_vocab_size, 99092);
    auto s = derive_layer_schedule(*back);
    ASSERT_TRUE(s.ok()) << s.status().message();
    // Every layer kind is present in every preset.
    bool window = false, full2 = false, full1 = false, reuse = false, reindex = false, cand = false,
         engram = false;
    for (const auto& p : s->layers) {
      window |= p.mode == AttnMode::kWindowOnly;
      full2 |= p.mode == AttnMode::kFull && p.ratio == 2;
      full1 |= p.mode == AttnMode::kFull && p.ratio == 1;
      reuse |= p.mode == AttnMode::kReuse;
      reindex |= p.mode == AttnMode::kReindex && p.candidate_restricted;
      cand |= p.candidate_source;
      engram |= p.engram;
    }
    EXPECT_TRUE(window && full2 && full1 && reuse && reindex && cand && engram);
    auto k = derive_tensor_contract(*back, *s);
    ASSERT_TRUE(k.ok()) << k.status().message();
  }
  EXPECT_FALSE(preset_config("huge").ok());
  EXPECT_NE(preset_config("huge").status().message().find("tiny, tiny-vision, small, v41-flash"), std::string::npos);
}

TEST(Presets, TinyMatchesTheGoldenStructure) {
  auto tiny = preset_config("tiny");
  auto golden = load_model_config(std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-public");
  ASSERT_TRUE(tiny.ok() && golden.ok());
  auto st = derive_layer_schedule(*tiny);
  auto sg = derive_layer_schedule(*golden);
  ASSERT_TRUE(st.ok() && sg.ok());
  EXPECT_EQ(st->describe(), sg->describe());
  EXPECT_EQ(tiny->engram_num_embeddings, golden->engram_num_embeddings);
  auto kt = derive_tensor_contract(*tiny, *st);
  auto kg = derive_tensor_contract(*golden, *sg);
  ASSERT_TRUE(kt.ok() && kg.ok());
  EXPECT_EQ(kt->payload_bytes(), kg->payload_bytes());
  // Limits small enough that ~100 tokens exceed them (MODEL_SPEC 7.1).
  EXPECT_LE(tiny->sliding_window, 16);
  EXPECT_LE(tiny->index_topk, 16);
  EXPECT_LE(tiny->candidate_topk_blocks * tiny->candidate_block_size, 32);
}

TEST(CheckpointWriter, AssignShardsIsContiguousBalancedAndNeverEmpty) {
  std::vector<uint64_t> sizes = {100, 1, 1, 1000000, 1, 1, 1, 50, 50, 50};
  for (int k = 1; k <= 10; ++k) {
    auto s = assign_shards(sizes, k);
    ASSERT_EQ(s.size(), sizes.size());
    EXPECT_EQ(s.front(), 0);
    EXPECT_EQ(s.back(), k - 1);
    for (size_t i = 1; i < s.size(); ++i) EXPECT_TRUE(s[i] == s[i - 1] || s[i] == s[i - 1] + 1) << "k=" << k;
  }
  auto s = assign_shards({10, 10, 10, 10}, 9);  // fewer tensors than shards
  EXPECT_EQ(s, (std::vector<int>{0, 1, 2, 3}));
  s = assign_shards({10, 10, 10, 10, 10, 10}, 3);
  EXPECT_EQ(s, (std::vector<int>{0, 0, 1, 1, 2, 2}));
}

TEST(CheckpointWriter, WritesDataAndSparseHolesThatReadBack) {
  std::string dir = testing::TempDir() + "/writer_holes";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.safetensors";
  std::vector<TensorSpec> specs = {
      {"a", DType::kF32, {3}}, {"big", DType::kI8, {64, 1 << 20}}, {"c", DType::kBF16, {2, 2}}};
  auto w = SafetensorsStreamWriter::create(path, specs);
  ASSERT_TRUE(w.ok()) << w.status().message();
  float a[3] = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE((*w)->write_next(reinterpret_cast<uint8_t*>(a), 12).ok());
  EXPECT_FALSE((*w)->write_next(reinterpret_cast<uint8_t*>(a), 12).ok());  // wrong size for 'big'
  ASSERT_TRUE((*w)->skip_next().ok());
  EXPECT_FALSE((*w)->finish().ok());  // 'c' not written yet
  uint16_t cdat[4] = {1, 2, 3, 4};
  ASSERT_TRUE((*w)->write_next(reinterpret_cast<uint8_t*>(cdat), 8).ok());
  EXPECT_EQ((*w)->header_bytes() % 8, 0u);
  ASSERT_TRUE((*w)->finish().ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const auto& h = (*f)->header();
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  const float* ra = reinterpret_cast<const float*>((*f)->data(h.tensors.at("a")));
  EXPECT_EQ(ra[2], 3.25f);
  const uint8_t* rb = (*f)->data(h.tensors.at("big"));
  EXPECT_EQ(rb[0] + rb[(64 << 20) - 1], 0);
  EXPECT_EQ(reinterpret_cast<const uint16_t*>((*f)->data(h.tensors.at("c")))[3], 4);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 64 << 20);
  EXPECT_LT(st.st_blocks * 512, 1 << 20) << "the 64 MiB hole must not be allocated";
  std::filesystem::remove_all(dir);
}

TEST(CheckpointWriter, ShardedCheckpointHasIndexAndOpens) {
  std::string dir = testing::TempDir() + "/writer_sharded";
  std::filesystem::remove_all(dir);
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 10; ++i) specs.push_back({"t" + std::to_string(i), DType::kF32, {i + 1}});
  CheckpointWriteOptions o;
  o.shards = 4;
  auto fill = [&](size_t i, uint8_t* out, uint64_t n) {
    for (uint64_t j = 0; j < n / 4; ++j) reinterpret_cast<float*>(out)[j] = static_cast<float>(i * 100 + j);
    return ok_status();
  };
  ASSERT_TRUE(write_checkpoint(dir, specs, o, fill).ok());
  std::ifstream in(dir + "/model.safetensors.index.json");
  auto idx = nlohmann::json::parse(in);
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), 4u * 55);
  EXPECT_EQ(idx["weight_map"]["t0"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(idx["weight_map"]["t9"], "model-00004-of-00004.safetensors");
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->files().size(), 4u);
  EXPECT_EQ((*ck)->payload_bytes(), 4u * 55);
  const TensorRef* t7 = (*ck)->find("t7");
  ASSERT_NE(t7, nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>(t7->data)[5], 705.0f);
  std::filesystem::remove_all(dir);
}

TEST(RandomWeights, DeterministicPerSeedAndPassesTheContract) {
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  auto s = derive_layer_schedule(*c);
  auto k = derive_tensor_contract(*c, *s);
  ASSERT_TRUE(k.ok());
  auto bytes_of = [&](uint64_t seed, const std::string& name) {
    RandomWeights rw(*c, *k, seed);
    for (size_t i = 0; i < k->tensors.size(); ++i)
      if (k->tensors[i].name == name) {
        std::vector<uint8_t> b(k->tensors[i].nbytes());
        EXPECT_TRUE(rw.fill(i, b.data(), b.size()).ok());
        return b;
      }
    return std::vector<uint8_t>{};
  };
  // Same seed, same bytes, regardless of what else was generated; other seed, other bytes.
  EXPECT_EQ(bytes_of(7, "layers.3.attn.wq_b.scale"), bytes_of(7, "layers.3.attn.wq_b.scale"));
  EXPECT_NE(bytes_of(7, "layers.3.attn.wq_b.weight"), bytes_of(8, "layers.3.attn.wq_b.weight"));
  // FP8 tile scales really differ (per-tile gains).
  auto sc = bytes_of(7, "layers.3.attn.wq_b.scale");
  EXPECT_GT(std::set<uint8_t>(sc.begin(), sc.end()).size(), 1u);
}

// Golden README recipe: ~1% of expert gate/up pre-activations pass the SwiGLU clamp for inputs
// of RMS 1 — exercised, far from saturated. Logits std about 2.
TEST(RandomWeights, SwigluClampExercisedButNotSaturated) {
  auto c = preset_config("tiny");
  ASSERT_TRUE(c.ok());
  auto s = derive_layer_schedule(*c);
  auto k = derive_tensor_contract(*c, *s);
  ASSERT_TRUE(k.ok());
  RandomWeights rw(*c, *k, 3);
  const int64_t D = c->hidden_size, M = c->moe_intermediate_size;
  // Dequantize expert 0's w1 of layer 2 from the generated bytes.
  size_t wi = 0;
  for (size_t i = 0; i < k->tensors.size(); ++i)
    if (k->tensors[i].name == "layers.2.ffn.experts.0.w1.weight") wi = i;
  std::vector<uint8_t> q(k->tensors[wi].nbytes()), sc(k->tensors[wi + 1].nbytes());
  ASSERT_TRUE(rw.fill(wi, q.data(), q.size()).ok());
  ASSERT_TRUE(rw.fill(wi + 1, sc.data(), sc.size()).ok());
  std::vector<float> w(static_cast<size_t>(M * D));
  quant::fp4_rows_dequant_rows(q.data(), sc.data(), M, D, 0, M, w.data());
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  int64_t over = 0, total = 0;
  for (int t = 0; t < 400; ++t) {
    std::vector<float> x(static_cast<size_t>(D));
    for (float& v : x) v = nd(gen);
    for (int64_t o = 0; o < M; ++o) {
      double h = 0;
      for (int64_t i = 0; i < D; ++i) h += w[static_cast<size_t>(o * D + i)] * x[static_cast<size_t>(i)];
      over += std::fabs(h) > c->swiglu_limit;
      ++total;
    }
  }
  double frac = static_cast<double>(over) / total;
  EXPECT_GT(frac, 0.001);
  EXPECT_LT(frac, 0.05);
  // Head: logits of an RMS-1 input have std about 2.
  size_t hp = 0;
  for (size_t p = 0; p < k->params.size(); ++p)
    if (k->params[p].name == "head.weight") hp = p;
  std::vector<float> head = rw.master(hp);
  std::vector<float> x(static_cast<size_t>(D));
  for (float& v : x) v = nd(gen);
  double ss = 0;
  for (int64_t v = 0; v < c->vocab_size; ++v) {
    double l = 0;
    for (int64_t i = 0; i < D; ++i) l += head[static_cast<size_t>(v * D + i)] * x[static_cast<size_t>(i)];
    ss += l * l;
  }
  double std_logit = std::sqrt(ss / c->vocab_size);
  EXPECT_GT(std_logit, 1.5);
  EXPECT_LT(std_logit, 2.6);
}

}  // namespace
}  // namespace ds41::model
