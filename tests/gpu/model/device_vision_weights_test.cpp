// gpu::DeviceModel's vision weights (issue 16, MODEL_SPEC 2.2 / 2.5): the golden vision set on the
// device equals its file bit for bit (the fused attn.wqkv / mlp.w1 matrices as stored, every BF16
// linear, and the float32 vectors equal to model::VisionWeights' conversion, the fused qkv bias
// included); `--load-format dummy` of tiny-vision generates the tower deterministically per seed;
// a text-only model has none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cuda/cuda_status.h"
#include "gpu/device_model.h"
#include "model/loader/safetensors.h"
#include "model/vision_weights.h"
#include "gpu/model/device_test_util.h"

namespace ds41::gpu {
namespace {

const std::string kShared = DS41_SHARED_DIR;
const std::string kVision = kShared + "/golden/v41-tiny-vision-public";

DeviceLoadOptions options(LoadFormat f, uint64_t seed = 0) {
  DeviceLoadOptions o;
  o.format = f;
  o.seed = seed;
  o.tokenizer_dir = kShared + "/tokenizer-v41";
  return o;
}

TEST(DeviceVisionWeights, GoldenVisionSetOnTheDeviceEqualsTheFile) {
  SKIP_WITHOUT_GPU();
  auto m = DeviceModel::load(kVision, options(LoadFormat::kSafetensors));
  ASSERT_TRUE(m.ok()) << m.status().message();
  const model::ModelConfig& c = (*m)->config();
  ASSERT_TRUE(c.has_vision);
  ASSERT_TRUE((*m)->weights().vision.has_value());
  const DeviceVisionWeights& d = *(*m)->weights().vision;
  auto ck = model::Checkpoint::open(kVision);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  auto vw = model::bind_vision_weights(**ck, c);
  ASSERT_TRUE(vw.ok()) << vw.status().message();
  int64_t checked = 0;
  auto lin = [&](const std::string& tensor, const cuda::DeviceWeight& w) {
    const model::TensorRef* t = (*ck)->find(tensor);
    ASSERT_NE(t, nullptr) << tensor;
    EXPECT_EQ(w.format, quant::WeightFormat::kBF16) << tensor;
    ASSERT_EQ(static_cast<size_t>(w.out_dim * w.in_dim * 2), t->info->nbytes()) << tensor;
    EXPECT_EQ(std::memcmp(from_device(w.data, t->info->nbytes()).data(), t->data, t->info->nbytes()), 0)
        << tensor << " differs from the file";
    ++checked;
  };
  auto vec = [&](const std::string& what, const DeviceVec& v, const std::vector<float>& host) {
    ASSERT_EQ(v.size, static_cast<int64_t>(host.size())) << what;
    EXPECT_EQ(std::memcmp(from_device(v.ptr, host.size() * 4).data(), host.data(), host.size() * 4), 0)
        << what << " differs from the loader's float32 conversion";
    ++checked;
  };
  lin("vision.patch_embed.proj.weight", d.patch_embed);
  vec("patch_bias", d.patch_bias, (*vw)->patch_bias);
  vec("norm", d.norm, (*vw)->norm);
  ASSERT_EQ(d.blocks.size(), (*vw)->blocks.size());
  for (size_t i = 0; i < d.blocks.size(); ++i) {
    const std::string p = "vision.blocks." + std::to_string(i) + ".";
    const model::VisionBlockWeights& h = (*vw)->blocks[i];
    lin(p + "attn.wqkv.weight", d.blocks[i].wqkv);
    lin(p + "attn.wo.weight", d.blocks[i].wo);
    lin(p + "mlp.w1.weight", d.blocks[i].w1);
    lin(p + "mlp.w2.weight", d.blocks[i].w2);
    vec(p + "bqkv", d.blocks[i].bqkv, h.bqkv);
    vec(p + "bo", d.blocks[i].bo, h.bo);
    vec(p + "norm1", d.blocks[i].norm1, h.norm1);
    vec(p + "norm2", d.blocks[i].norm2, h.norm2);
    // The CPU's q / k / v slices are the fused bias's thirds.
    std::vector<float> qkv = h.bq;
    qkv.insert(qkv.end(), h.bk.begin(), h.bk.end());
    qkv.insert(qkv.end(), h.bv.begin(), h.bv.end());
    EXPECT_EQ(qkv, h.bqkv);
  }
  lin("aligner.w1.weight", d.aligner_w1);
  lin("aligner.w2.weight", d.aligner_w2);
  vec("aligner_b1", d.aligner_b1, (*vw)->aligner_b1);
  vec("aligner_b2", d.aligner_b2, (*vw)->aligner_b2);
  vec("image_start", d.image_start, (*vw)->image_start);
  vec("image_end", d.image_end, (*vw)->image_end);
  vec("image_newline", d.image_newline, (*vw)->image_newline);
  std::printf("vision weights on the device: %lld ranges equal the file\n", static_cast<long long>(checked));
  EXPECT_EQ(checked, 3 + 8 * static_cast<int64_t>(d.blocks.size()) + 7);
}

TEST(DeviceVisionWeights, DummyTinyVisionIsGeneratedPerSeed) {
  SKIP_WITHOUT_GPU();
  DeviceLoadOptions o = options(LoadFormat::kDummy, 3);
  o.preset = "tiny-vision";
  auto a = DeviceModel::load("", o);
  auto b = DeviceModel::load("", o);
  o.seed = 4;
  auto c = DeviceModel::load("", o);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok() && c.ok());
  ASSERT_TRUE((*a)->weights().vision.has_value());
  const DeviceVisionWeights &va = *(*a)->weights().vision, &vb = *(*b)->weights().vision,
                            &vc = *(*c)->weights().vision;
  ASSERT_EQ(va.blocks.size(), static_cast<size_t>((*a)->config().vision_num_layers));
  const cuda::DeviceWeight& wa = va.blocks[0].wqkv;
  const size_t bytes = static_cast<size_t>(wa.out_dim * wa.in_dim * 2);
  EXPECT_EQ(from_device(wa.data, bytes), from_device(vb.blocks[0].wqkv.data, bytes));
  EXPECT_NE(from_device(wa.data, bytes), from_device(vc.blocks[0].wqkv.data, bytes));
  const size_t nb = static_cast<size_t>(va.norm.size) * 4;
  EXPECT_EQ(from_device(va.norm.ptr, nb), from_device(vb.norm.ptr, nb));
  // Norm weights follow the recipe (1 + 0.15 N, clipped to [0.5, 1.5]).
  std::vector<float> norm(static_cast<size_t>(va.norm.size));
  std::memcpy(norm.data(), from_device(va.norm.ptr, nb).data(), nb);
  for (float v : norm) {
    EXPECT_GE(v, 0.5f);
    EXPECT_LE(v, 1.5f);
  }
}

TEST(DeviceVisionWeights, TextOnlyModelHasNone) {
  SKIP_WITHOUT_GPU();
  auto m = DeviceModel::load(kShared + "/golden/v41-tiny-public", options(LoadFormat::kSafetensors));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE((*m)->weights().vision.has_value());
}

}  // namespace
}  // namespace ds41::gpu
