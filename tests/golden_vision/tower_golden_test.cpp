// Golden: the vision tower, the aligner, the span embeddings and the text model with images
// (golden README "Vision set": vit_out / aligner_out / span_embeds / inputs_embeds e_r <= 1e-4 per
// row; logits e_r <= 5e-3 per row; routing sets equal; Engram delta exactly 0 on spans).
#include <gtest/gtest.h>

#include <set>

#include "golden_vision/vision_golden_support.h"
#include "image/image_decode.h"
#include "image/preprocess.h"
#include "model/vision_span.h"

namespace ds41::testing {
namespace {

struct VisionModel {
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<backends::cpu::CpuBackend> backend;
  std::unique_ptr<model::Model> model;
};

VisionModel load_vision_model() {
  VisionModel t;
  t.pool = std::make_unique<ThreadPool>(2);
  t.backend = std::make_unique<backends::cpu::CpuBackend>(t.pool.get());
  model::LoadOptions lo;
  lo.tokenizer_dir = tokenizer_dir();
  auto m = model::Model::load(vision_dir(), lo, t.backend.get());
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (m.ok()) t.model = std::move(m).value();
  return t;
}

double max_row_error(const Array<float>& g, const std::vector<float>& c) {
  EXPECT_EQ(g.v.size(), c.size());
  if (g.v.size() != c.size() || g.rows() == 0) return 1e30;
  double mx = 0;
  for (int64_t r = 0; r < g.rows(); ++r)
    mx = std::max(mx, row_error(&g.v[r * g.row_size()], &c[r * g.row_size()], g.row_size()));
  return mx;
}

// Every image through decode -> preprocess -> tower; span rows per image.
std::vector<std::vector<float>> encode_all(const VisionModel& vm,
                                           std::vector<model::VisionImageOutput>* outs) {
  std::vector<std::vector<float>> patches(kVisionImages);
  std::vector<model::VisionImageInput> in;
  for (int k = 0; k < kVisionImages; ++k) {
    auto d = image::decode_image_file(vision_image_path(k));
    EXPECT_TRUE(d.ok());
    auto p = image::prepare_image(d->rgb, vision_plan_config());
    EXPECT_TRUE(p.ok());
    patches[k] = image::image_patches(p->resized, 14);
    in.push_back({patches[k].data(), p->plan.box_h / 14, p->plan.box_w / 14});
  }
  auto r = vm.model->vision_tower()->encode(in, true);
  EXPECT_TRUE(r.ok()) << r.status().message();
  *outs = std::move(r).value();
  std::vector<std::vector<float>> spans;
  for (auto& o : *outs)
    spans.push_back(model::image_span_embeddings(*vm.model->vision_weights(), o.aligner_out, o.n_llm_h,
                                                 o.n_llm_w, vm.model->config().hidden_size));
  return spans;
}

TEST(VisionTowerGolden, VitAlignerAndSpansWithinTolerance) {
  VisionModel vm = load_vision_model();
  ASSERT_TRUE(vm.model && vm.model->vision_tower());
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  std::vector<model::VisionImageOutput> outs;
  auto spans = encode_all(vm, &outs);
  for (int k = 0; k < kVisionImages; ++k) {
    const std::string pre = "image" + std::to_string(k) + ".";
    const double ev = max_row_error(g.get<float>(pre + "vit_out"), outs[k].vit_out);
    const double ea = max_row_error(g.get<float>(pre + "aligner_out"), outs[k].aligner_out);
    const double es = max_row_error(g.get<float>(pre + "span_embeds"), spans[k]);
    EXPECT_LE(ev, 1e-4) << pre << "vit_out";
    EXPECT_LE(ea, 1e-4) << pre << "aligner_out";
    EXPECT_LE(es, 1e-4) << pre << "span_embeds";
    std::printf("image%d: vit %.3g aligner %.3g span %.3g\n", k, ev, ea, es);
  }
}

TEST(VisionTowerGolden, PromptsWithImagesMatchLogitsRoutingAndEngram) {
  VisionModel vm = load_vision_model();
  ASSERT_TRUE(vm.model && vm.model->vision_tower());
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  std::vector<model::VisionImageOutput> outs;
  auto spans = encode_all(vm, &outs);
  const model::ModelConfig& c = vm.model->config();
  for (int i = 0; i < 2; ++i) {
    const std::string pre = "prompt" + std::to_string(i) + ".";
    auto ids = g.get<int32_t>(pre + "input_ids");
    auto imgs = g.get<int32_t>(pre + "images");
    std::vector<std::vector<float>> sp;
    for (int32_t k : imgs.v) sp.push_back(spans[k]);
    auto placed = model::place_image_spans(ids.v, static_cast<int32_t>(c.image_token_id), sp, c.hidden_size);
    ASSERT_TRUE(placed.ok()) << placed.status().message();
    auto mask = g.get<uint8_t>(pre + "image_mask");
    EXPECT_EQ(placed->image_span, mask.v);
    auto starts = g.get<int32_t>(pre + "span_starts");
    EXPECT_EQ(std::vector<int32_t>(placed->span_starts.begin(), placed->span_starts.end()), starts.v);
    auto st = vm.model->new_sequence();
    model::SequenceInput in{st.get(), placed->tokens, placed->image_span, placed->span_embeds};
    model::ForwardOptions fo;
    fo.logits = model::LogitsRows::kAll;
    fo.record = true;
    std::vector<model::SequenceOutput> out;
    ASSERT_TRUE(vm.model->forward(std::span<const model::SequenceInput>(&in, 1), fo, &out).ok());
    const double el = max_row_error(g.get<float>(pre + "logits"), out[0].logits);
    EXPECT_LE(el, 5e-3) << pre << "logits";
    std::printf("%slogits max e_r %.3g\n", pre.c_str(), el);
    int differ = 0;
    for (auto& [l, ex] : out[0].record.router_experts) {
      auto ge = g.get<int32_t>(pre + "layer" + std::to_string(l) + ".router_experts");
      const int64_t k = ge.row_size();
      for (int64_t r = 0; r < ge.rows(); ++r) {
        std::set<int32_t> a(ge.v.begin() + r * k, ge.v.begin() + (r + 1) * k),
            b(ex.begin() + r * k, ex.begin() + (r + 1) * k);
        differ += a != b;
      }
    }
    EXPECT_EQ(differ, 0) << pre << "router_experts rows differing";
    if (i == 1) {
      // Decode steps after prompt1 (golden "decode.*"): feed the given ids.
      auto dids = g.get<int32_t>("decode.input_ids");
      auto dlog = g.get<float>("decode.logits");
      std::vector<float> mine;
      for (int32_t t : dids.v) {
        auto r = vm.model->decode_step(*st, t, model::ForwardOptions{});
        ASSERT_TRUE(r.ok()) << r.status().message();
        mine.insert(mine.end(), r->logits.begin(), r->logits.end());
      }
      const double ed = max_row_error(dlog, mine);
      EXPECT_LE(ed, 5e-3) << "decode.logits";
      std::printf("decode logits max e_r %.3g\n", ed);
    }
  }
}

}  // namespace
}  // namespace ds41::testing
