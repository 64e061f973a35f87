// The GPU engine with images (issue 16) on ../shared/golden/v41-tiny-vision-public (golden README
// "Vision set"): the GPU tower against the goldens (vit_out / aligner_out / span_embeds, e_r <= 1e-4
// per row) and against the CPU tower; the batch split of the tower; the text model with image spans
// (span rows, router bias_vl, Engram DEAD) against the goldens (logits e_r <= 5e-3, routing sets
// equal, hash ids equal at text positions) and against the CPU engine; chunked prefill across spans,
// a two-sequence batch, and bad span input. Every comparison prints its error and tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <set>

#include "engine/cpu_engine.h"
#include "gpu/engine/gpu_test_util.h"
#include "image/image_decode.h"
#include "image/preprocess.h"
#include "model/image_input.h"
#include "model/vision_span.h"

namespace ds41::testing {
namespace {

std::string vision_dir() { return std::string(DS41_SHARED_DIR) + "/golden/v41-tiny-vision-public"; }
constexpr int kImages = 6;
// Golden README "Vision set": the tower's arrays per row, the logits per row.
constexpr double kTolTower = 1e-4;
constexpr double kTolVisionLogits = 5e-3;
// GPU tower vs the CPU tower: both float32 with exact products (BF16 weights; the GPU splits the
// activations into three bf16 parts), sums in other orders and a float32 online softmax; the CPU
// meets the goldens at <= 5.2e-6 (docs/vision.md), so 2e-5 still leaves a 5x margin to the
// golden bound while a real bug (golden README "Margin against real bugs") is >= 4.6e-4.
constexpr double kTolTowerVsCpu = 2e-5;

double max_row_error(const std::vector<float>& want, const std::vector<float>& got, int64_t width) {
  EXPECT_EQ(want.size(), got.size());
  if (want.size() != got.size() || width <= 0) return 1e30;
  double mx = 0;
  for (size_t r = 0; r * width < want.size(); ++r)
    mx = std::max(mx, row_error(&want[r * width], &got[r * width], width));
  return mx;
}

void check(const std::string& what, double err, double tol) {
  std::printf("%-44s max e_r %-10.3g tol %g\n", what.c_str(), err, tol);
  std::fflush(stdout);
  EXPECT_LE(err, tol) << what;
}

struct Images {
  std::vector<image::PreparedImage> prepared;
  std::vector<std::vector<float>> patches;
  std::vector<model::VisionImageInput> in;
};

Images load_images(const model::ModelConfig& c) {
  Images im;
  for (int k = 0; k < kImages; ++k) {
    auto d = image::decode_image_file(vision_dir() + "/images/image" + std::to_string(k) + ".png");
    EXPECT_TRUE(d.ok()) << d.status().message();
    auto p = image::prepare_image(d->rgb, model::vision_plan_config(c));
    EXPECT_TRUE(p.ok()) << p.status().message();
    im.prepared.push_back(std::move(p).value());
  }
  const int64_t ps = c.vision_patch_size;
  for (const auto& p : im.prepared) im.patches.push_back(image::image_patches(p.resized, ps));
  for (size_t k = 0; k < im.prepared.size(); ++k)
    im.in.push_back({im.patches[k].data(), im.prepared[k].plan.box_h / ps, im.prepared[k].plan.box_w / ps});
  return im;
}

std::vector<const image::PreparedImage*> ptrs(const Images& im) {
  std::vector<const image::PreparedImage*> p;
  for (const auto& x : im.prepared) p.push_back(&x);
  return p;
}

TEST(GpuVision, TowerMatchesTheGoldensAndTheCpuTower) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  ASSERT_TRUE(dev->weights().vision.has_value());
  TestModel cpu = load_cpu_model(vision_dir(), 4);
  ASSERT_TRUE(cpu.model && cpu.model->vision_tower());
  auto eng = make_engine(*dev, 64);
  ASSERT_TRUE(eng && eng->vision_tower());
  EXPECT_TRUE(eng->info().has_vision);
  const model::ModelConfig& c = dev->config();
  const int64_t D = c.vision_hidden_size, H = c.hidden_size;
  Images im = load_images(c);
  auto gpu = eng->vision_tower()->encode(im.in, true);
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  auto ref = cpu.model->vision_tower()->encode(im.in, true);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  // The engine interface: span rows of all six images in one batch.
  auto spans = eng->encode_images(ptrs(im));
  ASSERT_TRUE(spans.ok()) << spans.status().message();
  ASSERT_EQ(spans->size(), static_cast<size_t>(kImages));
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  for (int k = 0; k < kImages; ++k) {
    const std::string pre = "image" + std::to_string(k) + ".";
    const model::VisionImageOutput& o = (*gpu)[k];
    EXPECT_EQ(o.n_llm_h, im.prepared[k].plan.n_llm_h) << pre;
    EXPECT_EQ(o.n_llm_w, im.prepared[k].plan.n_llm_w) << pre;
    check("gpu " + pre + "vit_out vs golden", max_row_error(g.get<float>(pre + "vit_out").v, o.vit_out, D),
          kTolTower);
    check("gpu " + pre + "aligner_out vs golden",
          max_row_error(g.get<float>(pre + "aligner_out").v, o.aligner_out, H), kTolTower);
    check("gpu " + pre + "span_embeds vs golden",
          max_row_error(g.get<float>(pre + "span_embeds").v, (*spans)[k], H), kTolTower);
    check("gpu " + pre + "vit_out vs cpu", max_row_error((*ref)[k].vit_out, o.vit_out, D), kTolTowerVsCpu);
    check("gpu " + pre + "aligner_out vs cpu", max_row_error((*ref)[k].aligner_out, o.aligner_out, H),
          kTolTowerVsCpu);
  }
}

TEST(GpuVision, TowerBatchesAreSplitExactlyAndOversizedImagesRefused) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  const model::ModelConfig& c = dev->config();
  Images im = load_images(c);
  gpu::CudaEngineOptions o;
  o.model_name = "test";
  o.limits.max_step_tokens = 256;
  o.limits.max_step_seqs = 4;
  o.limits.max_context = 512;
  o.max_sequences = 4;
  o.kv_bytes = int64_t{64} << 20;
  // All six images (708 patches) in one batch.
  o.vision_limits.max_patches = 1000;
  auto big_e = gpu::CudaEngine::create(dev.get(), o);
  ASSERT_TRUE(big_e.ok()) << big_e.status().message();
  gpu::CudaEngine* big = big_e->get();
  auto all = big->vision_tower()->encode(im.in, false);
  ASSERT_TRUE(all.ok()) << all.status().message();
  // 300 patches per batch: images {0,1,2} (192), {3} (261), {4,5} (255).
  o.vision_limits.max_patches = 300;
  o.vision_limits.gemm_rows = 64;  // several GEMM chunks per linear too
  auto small = gpu::CudaEngine::create(dev.get(), o);
  ASSERT_TRUE(small.ok()) << small.status().message();
  EXPECT_EQ((*small)->vision_tower()->max_patches(), 300);
  auto split = (*small)->vision_tower()->encode(im.in, false);
  ASSERT_TRUE(split.ok()) << split.status().message();
  for (int k = 0; k < kImages; ++k)
    check("split batch image" + std::to_string(k) + " aligner_out vs one batch",
          max_row_error((*all)[k].aligner_out, (*split)[k].aligner_out, c.hidden_size), kTolTowerVsCpu);
  // One image alone: the same rows as in the batch (attention stays inside each image).
  auto one = big->vision_tower()->encode(std::span<const model::VisionImageInput>(&im.in[3], 1), false);
  ASSERT_TRUE(one.ok()) << one.status().message();
  check("image3 alone vs in the batch",
        max_row_error((*all)[3].aligner_out, (*one)[0].aligner_out, c.hidden_size), kTolTowerVsCpu);
  // 200 patches per batch: image 3 (3 x 87 = 261) cannot run.
  o.vision_limits.max_patches = 200;
  auto tiny = gpu::CudaEngine::create(dev.get(), o);
  ASSERT_TRUE(tiny.ok()) << tiny.status().message();
  auto r = (*tiny)->vision_tower()->encode(im.in, false);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().message();
  EXPECT_NE(r.status().message().find("image 3"), std::string::npos) << r.status().message();
  // Without the tower: encode_images refuses, steps with given span rows still run.
  o.vision = false;
  auto none = gpu::CudaEngine::create(dev.get(), o);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ((*none)->vision_tower(), nullptr);
  EXPECT_FALSE((*none)->info().has_vision);
  EXPECT_EQ((*none)->encode_images(ptrs(im)).status().code(), StatusCode::kFailedPrecondition);
  // Bad patch grids: the CPU tower's checks and messages.
  model::VisionImageInput empty{im.patches[0].data(), 0, 7};
  auto e = big->vision_tower()->encode(std::span<const model::VisionImageInput>(&empty, 1), false);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
}

// A golden prompt with its images placed: the GPU tower's spans, or the goldens' inputs_embeds rows.
model::ImagePromptInput place(const GoldenFile& g, int i, const model::ModelConfig& c,
                              const std::vector<std::vector<float>>& spans) {
  const std::string pre = "prompt" + std::to_string(i) + ".";
  auto ids = g.get<int32_t>(pre + "input_ids");
  auto imgs = g.get<int32_t>(pre + "images");
  std::vector<std::vector<float>> sp;
  for (int32_t k : imgs.v) sp.push_back(spans[k]);
  auto placed = model::place_image_spans(ids.v, static_cast<int32_t>(c.image_token_id), sp, c.hidden_size);
  EXPECT_TRUE(placed.ok()) << placed.status().message();
  return placed.ok() ? std::move(placed).value() : model::ImagePromptInput{};
}

TEST(GpuVision, PromptsWithImagesMatchTheGoldensAndTheCpuEngine) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  TestModel cpu = load_cpu_model(vision_dir(), 4);
  ASSERT_TRUE(cpu.model);
  engine::CpuEngine ceng(cpu.model.get(), "cpu");
  const model::ModelConfig& c = dev->config();
  const int64_t V = c.vocab_size, H = c.hidden_size, k = c.num_experts_per_tok;
  auto eng = make_engine(*dev, 64);
  ASSERT_TRUE(eng);
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  Images im = load_images(c);
  auto spans = eng->encode_images(ptrs(im));
  ASSERT_TRUE(spans.ok()) << spans.status().message();
  for (int i = 0; i < 2; ++i) {
    const std::string pre = "prompt" + std::to_string(i) + ".";
    SCOPED_TRACE(pre);
    model::ImagePromptInput p = place(g, i, c, *spans);
    EXPECT_EQ(p.image_span, g.get<uint8_t>(pre + "image_mask").v);
    const int64_t S = static_cast<int64_t>(p.tokens.size());
    // (a) The whole model: GPU tower spans through the GPU text model.
    auto seq = eng->create_sequence();
    ASSERT_TRUE(seq.ok());
    engine::StepItem it{*seq, p.tokens, true, p.image_span, p.span_embeds};
    std::vector<model::SequenceOutput> out;
    Status st = eng->forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kAll, true, &out);
    ASSERT_TRUE(st.ok()) << st.message();
    ASSERT_EQ(static_cast<int64_t>(out[0].logits.size()), S * V);
    auto gl = g.get<float>(pre + "logits");
    // The CPU reference on the same tokens and the GPU tower's span rows, every row: the GPU text
    // model is held to it strictly; against the goldens the GPU is held to the golden tolerance or,
    // where the span rows' ~5e-6 difference from the goldens' own (the tower rows above) moves a
    // fake-quant midpoint of the tiny model, to what the CPU reference gets from the same rows
    // (measured on the H200: prompt1 6.2e-3 with the GPU tower's rows, 5.6e-6 with the goldens').
    std::vector<float> cpu_all;
    {
      auto cst = cpu.model->new_sequence();
      model::SequenceInput cin{cst.get(), p.tokens, p.image_span, p.span_embeds};
      model::ForwardOptions cfo;
      cfo.logits = model::LogitsRows::kAll;
      std::vector<model::SequenceOutput> cout_;
      ASSERT_TRUE(cpu.model->forward(std::span<const model::SequenceInput>(&cin, 1), cfo, &cout_).ok());
      cpu_all = std::move(cout_[0].logits);
    }
    check("gpu " + pre + "logits vs cpu reference (same span rows)", max_row_error(cpu_all, out[0].logits, V),
          kTolGpuLogits);
    const double cpu_vs_golden = max_row_error(gl.v, cpu_all, V);
    std::printf("cpu reference %slogits (GPU tower's span rows) vs golden max e_r %.3g\n", pre.c_str(), cpu_vs_golden);
    check("gpu " + pre + "logits vs golden", max_row_error(gl.v, out[0].logits, V),
          std::max(kTolVisionLogits, cpu_vs_golden + kTolGpuLogits));
    // Routing: spans select with bias_vl (golden README: it changes 28-100% of span selections).
    int64_t differ = 0, rows = 0;
    for (const auto& [l, ex] : out[0].record.router_experts) {
      auto ge = g.get<int32_t>(pre + "layer" + std::to_string(l) + ".router_experts");
      for (int64_t r = 0; r < S; ++r, ++rows) differ += id_set(&ex[r * k], k) != id_set(&ge.v[r * k], k);
    }
    std::printf("gpu %srouter_experts: %lld rows, %lld differ (tol 0)\n", pre.c_str(),
                static_cast<long long>(rows), static_cast<long long>(differ));
    EXPECT_GT(rows, 0);
    EXPECT_EQ(differ, 0);
    // Engram hash ids at text positions (spans are DEAD: HF hashes all-pad n-grams there, unused).
    auto gh = g.get<int32_t>(pre + "engram_hash_ids");
    const int64_t per = gh.row_size();
    ASSERT_EQ(out[0].record.hash_ids.size(), gh.v.size());
    int64_t hdiff = 0;
    for (int64_t r = 0; r < S; ++r)
      if (!p.image_span[r])
        for (int64_t j = 0; j < per; ++j) hdiff += out[0].record.hash_ids[r * per + j] != gh.v[r * per + j];
    EXPECT_EQ(hdiff, 0) << "engram hash ids differing at text positions";
    // (b) The text model alone: the goldens' inputs_embeds rows at the span positions.
    auto ie = g.get<float>(pre + "inputs_embeds");
    std::vector<float> gold_rows;
    for (int64_t r = 0; r < S; ++r)
      if (p.image_span[r])
        gold_rows.insert(gold_rows.end(), ie.v.begin() + r * H, ie.v.begin() + (r + 1) * H);
    auto seq2 = eng->create_sequence();
    ASSERT_TRUE(seq2.ok());
    engine::StepItem it2{*seq2, p.tokens, true, p.image_span, gold_rows};
    std::vector<model::SequenceOutput> out2;
    ASSERT_TRUE(
        eng->forward(std::span<const engine::StepItem>(&it2, 1), model::LogitsRows::kAll, false, &out2).ok());
    check("gpu " + pre + "logits (golden span rows) vs golden", max_row_error(gl.v, out2[0].logits, V),
          kTolVisionLogits);
    // (c) Against the CPU engine on the same tokens and span rows: the last row (step()).
    auto cs = ceng.create_sequence();
    ASSERT_TRUE(cs.ok());
    engine::StepItem cit{*cs, p.tokens, true, p.image_span, p.span_embeds};
    engine::StepOutput cso;
    ASSERT_TRUE(ceng.step(std::span<const engine::StepItem>(&cit, 1), &cso).ok());
    check("gpu " + pre + "last row vs cpu engine",
          max_row_error(cso.logits, std::vector<float>(out[0].logits.end() - V, out[0].logits.end()), V),
          kTolGpuLogits);
    if (i == 1) {
      // Decode after prompt1 (its last positions are a span: the Engram look-back runs into DEAD
      // positions), one token per engine step; golden decode.* feeds the given ids.
      auto dids = g.get<int32_t>("decode.input_ids");
      std::vector<float> got, want_cpu;
      for (int64_t t = 0; t < dids.rows(); ++t) {
        engine::StepItem d{*seq, std::span<const int32_t>(&dids.v[t], 1), true};
        engine::StepOutput so;
        ASSERT_TRUE(eng->step(std::span<const engine::StepItem>(&d, 1), &so).ok());
        got.insert(got.end(), so.logits.begin(), so.logits.end());
        engine::StepItem cd{*cs, std::span<const int32_t>(&dids.v[t], 1), true};
        ASSERT_TRUE(ceng.step(std::span<const engine::StepItem>(&cd, 1), &so).ok());
        want_cpu.insert(want_cpu.end(), so.logits.begin(), so.logits.end());
      }
      check("gpu decode.logits vs golden", max_row_error(g.get<float>("decode.logits").v, got, V),
            kTolVisionLogits);
      check("gpu decode.logits vs cpu engine", max_row_error(want_cpu, got, V), kTolGpuLogits);
    }
  }
}

TEST(GpuVision, ChunkedPrefillAcrossSpansAndBatchesEqualOneShot) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  const model::ModelConfig& c = dev->config();
  const int64_t V = c.vocab_size;
  auto eng = make_engine(*dev, 64);
  ASSERT_TRUE(eng);
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  Images im = load_images(c);
  auto spans = eng->encode_images(ptrs(im));
  ASSERT_TRUE(spans.ok()) << spans.status().message();
  model::ImagePromptInput p0 = place(g, 0, c, *spans), p1 = place(g, 1, c, *spans);
  auto one_shot = [&](const model::ImagePromptInput& p) {
    auto s = eng->create_sequence();
    engine::StepItem it{*s, p.tokens, true, p.image_span, p.span_embeds};
    engine::StepOutput so;
    EXPECT_TRUE(eng->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    return so.logits;
  };
  const std::vector<float> l0 = one_shot(p0), l1 = one_shot(p1);
  // Engine steps of 5 tokens (boundaries inside the spans; each step carries its slice of rows,
  // as the engine loop and `ds41 generate` do).
  {
    auto s = eng->create_sequence();
    const int64_t S = static_cast<int64_t>(p1.tokens.size()), Hd = c.hidden_size;
    engine::StepOutput so;
    for (int64_t b = 0, before = 0; b < S; b += 5) {
      const int64_t e = std::min(S, b + 5);
      int64_t inside = 0;
      for (int64_t t = b; t < e; ++t) inside += p1.image_span[t];
      engine::StepItem it{*s, std::span<const int32_t>(p1.tokens).subspan(b, e - b), e == S,
                          std::span<const uint8_t>(p1.image_span).subspan(b, e - b),
                          std::span<const float>(p1.span_embeds).subspan(before * Hd, inside * Hd)};
      ASSERT_TRUE(eng->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
      before += inside;
    }
    check("prompt1 in 5-token steps vs one shot", max_row_error(l1, so.logits, V), kTolGpuLogits);
  }
  // The engine's own split (max_step_tokens 8 < the prompts): CudaEngine::forward slices the rows.
  {
    auto small = make_engine(*dev, 64, 4096, /*step_tokens=*/8);
    ASSERT_TRUE(small);
    auto s = small->create_sequence();
    engine::StepItem it{*s, p1.tokens, true, p1.image_span, p1.span_embeds};
    engine::StepOutput so;
    ASSERT_TRUE(small->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    check("prompt1 split by max_step_tokens 8 vs one shot", max_row_error(l1, so.logits, V), kTolGpuLogits);
  }
  // Both prompts in one step (two sequences, spans in each).
  {
    auto a = eng->create_sequence(), b = eng->create_sequence();
    std::vector<engine::StepItem> items{{*a, p0.tokens, true, p0.image_span, p0.span_embeds},
                                        {*b, p1.tokens, true, p1.image_span, p1.span_embeds}};
    engine::StepOutput so;
    ASSERT_TRUE(eng->step(items, &so).ok());
    check("prompt0 batched with prompt1 vs alone",
          max_row_error(l0, std::vector<float>(so.logits.begin(), so.logits.begin() + V), V), kTolGpuLogits);
    check("prompt1 batched with prompt0 vs alone",
          max_row_error(l1, std::vector<float>(so.logits.begin() + V, so.logits.end()), V), kTolGpuLogits);
  }
  // The spans matter: the same ids without span rows (flags only) change the last row.
  {
    auto s = eng->create_sequence();
    engine::StepItem it{*s, p1.tokens, true, p1.image_span, {}};
    engine::StepOutput so;
    ASSERT_TRUE(eng->step(std::span<const engine::StepItem>(&it, 1), &so).ok());
    const double e = max_row_error(l1, so.logits, V);
    std::printf("prompt1 without span rows vs with: max e_r %.3g (must be > 0.1)\n", e);
    EXPECT_GT(e, 0.1);
  }
}

TEST(GpuVision, BadSpanInputLeavesTheSequenceUnchanged) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  const model::ModelConfig& c = dev->config();
  auto eng = make_engine(*dev, 64);
  ASSERT_TRUE(eng);
  auto s = eng->create_sequence();
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> toks{0, 5, 6, 2047, 2047, 7};
  std::vector<uint8_t> flags{0, 0, 0, 1, 1, 0};
  std::vector<float> rows(2 * c.hidden_size, 0.5f);
  engine::StepOutput so;
  // Flags of another length.
  engine::StepItem a{*s, toks, true, std::span<const uint8_t>(flags).first(5), rows};
  Status st = eng->step(std::span<const engine::StepItem>(&a, 1), &so);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("image_span has 5 flags for 6 tokens"), std::string::npos) << st.message();
  // Rows for another number of flagged positions.
  engine::StepItem b{*s, toks, true, flags, std::span<const float>(rows).first(c.hidden_size)};
  st = eng->step(std::span<const engine::StepItem>(&b, 1), &so);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find("span_embeds"), std::string::npos) << st.message();
  EXPECT_EQ(*eng->sequence_position(*s), 0);
  // The valid step then runs.
  engine::StepItem ok{*s, toks, true, flags, rows};
  st = eng->step(std::span<const engine::StepItem>(&ok, 1), &so);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(*eng->sequence_position(*s), 6);
  // A text-only model has no tower.
  auto text = load_device_model(golden_dir());
  ASSERT_TRUE(text);
  auto te = make_engine(*text, 8);
  ASSERT_TRUE(te);
  EXPECT_EQ(te->vision_tower(), nullptr);
  EXPECT_FALSE(te->info().has_vision);
  std::vector<const image::PreparedImage*> none;
  EXPECT_EQ(te->encode_images(none).status().code(), StatusCode::kFailedPrecondition);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Issue 16, encoder/prefill overlap: encode_images on a second thread (as the engine loop's
// ImageEncoder calls it) runs the tower on the engine's encoder stream while step() runs prefills
// with image spans and decodes on the engine stream. The span rows and every logits row are
// bit-identical to the serial path (the two streams share only the read-only weights).
TEST(GpuVision, EncodeConcurrentWithStepsIsBitIdenticalToSerial) {
  DS41_SKIP_WITHOUT_GPU();
  auto dev = load_device_model(vision_dir());
  ASSERT_TRUE(dev);
  const model::ModelConfig& c = dev->config();
  auto eng = make_engine(*dev, 64);
  ASSERT_TRUE(eng);
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  Images im = load_images(c);
  const auto t0 = std::chrono::steady_clock::now();
  auto serial = eng->encode_images(ptrs(im));
  const double encode_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(serial.ok()) << serial.status().message();
  const model::ImagePromptInput p0 = place(g, 0, c, *serial), p1 = place(g, 1, c, *serial);
  auto dids = g.get<int32_t>("decode.input_ids");
  // Two sequences: both image prompts in one step, then the golden decode ids, one token each.
  auto run_steps = [&]() {
    std::vector<float> all;
    auto a = eng->create_sequence(), b = eng->create_sequence();
    EXPECT_TRUE(a.ok() && b.ok());
    if (!a.ok() || !b.ok()) return all;
    engine::StepOutput so;
    std::vector<engine::StepItem> items{{*a, p0.tokens, true, p0.image_span, p0.span_embeds},
                                        {*b, p1.tokens, true, p1.image_span, p1.span_embeds}};
    Status st = eng->step(items, &so);
    EXPECT_TRUE(st.ok()) << st.message();
    all.insert(all.end(), so.logits.begin(), so.logits.end());
    for (int64_t t = 0; t < dids.rows(); ++t) {
      std::vector<engine::StepItem> dec{{*a, std::span<const int32_t>(&dids.v[t], 1), true},
                                        {*b, std::span<const int32_t>(&dids.v[t], 1), true}};
      st = eng->step(dec, &so);
      EXPECT_TRUE(st.ok()) << st.message();
      all.insert(all.end(), so.logits.begin(), so.logits.end());
    }
    EXPECT_TRUE(eng->free_sequence(*a).ok());
    EXPECT_TRUE(eng->free_sequence(*b).ok());
    return all;
  };
  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<float> serial_logits = run_steps();
  const double steps_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  ASSERT_FALSE(serial_logits.empty());
  // The encoder thread encodes at least 3 times and until this thread has stepped 3 rounds, so the
  // rounds overlap encodes.
  std::atomic<int> rounds{0};
  std::atomic<bool> encoding_done{false};
  std::vector<Result<std::vector<std::vector<float>>>> concurrent;
  const auto t2 = std::chrono::steady_clock::now();
  std::thread encoder([&] {
    while (concurrent.size() < 3 || rounds.load() < 3) concurrent.push_back(eng->encode_images(ptrs(im)));
    encoding_done.store(true);
  });
  while (!encoding_done.load() || rounds.load() < 3) {
    EXPECT_TRUE(same_bits(run_steps(), serial_logits)) << "step round " << rounds.load();
    ++rounds;
  }
  encoder.join();
  const double both_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t2).count();
  ASSERT_GE(concurrent.size(), 3u);
  for (size_t r = 0; r < concurrent.size(); ++r) {
    ASSERT_TRUE(concurrent[r].ok()) << concurrent[r].status().message();
    ASSERT_EQ(concurrent[r]->size(), serial->size());
    for (size_t k = 0; k < serial->size(); ++k)
      EXPECT_TRUE(same_bits((*concurrent[r])[k], (*serial)[k])) << "encode " << r << " image " << k;
  }
  std::printf("serial: encode %.2f ms, step round %.2f ms; concurrently: %d step rounds and %zu encodes in %.2f ms\n",
              encode_ms, steps_ms, rounds.load(), concurrent.size(), both_ms);
}

}  // namespace
}  // namespace ds41::testing
