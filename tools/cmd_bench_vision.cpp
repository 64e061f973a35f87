// ds41 bench vision (issue 16): images per second through preprocessing (plan, Pillow-exact
// bicubic, pad, patches) and through the tower (ViT + aligner + span rows) on the CPU reference,
// the share of a request's time to first token spent on the image (tower vs the prefill of a
// prompt holding the image's span), and a vision-feature cache hit against a miss, in one run.
// The model is --model DIR (any checkpoint with vision_config) or a preset generated with dummy
// weights under --work-dir (default tiny-vision; `small` has a 256-wide 2-block tower). The
// released widths (1024 x 32 blocks) are a GPU measurement: on the CPU reference use small sizes.
// Prints one JSON object with --json (tools/bench_header.h), else indented.
#include <filesystem>
#include <iostream>
#include <random>

#include "bench_header.h"
#include "bench_model.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "engine/vision_feature_cache.h"
#include "forward_cli_util.h"
#include "image/preprocess.h"
#include "model/checkpoint_maker.h"
#include "model/image_input.h"
#include "model/presets.h"
#include "model/vision_span.h"

namespace ds41::cli {
namespace {

struct VisionBenchArgs {
  std::string model_dir, tokenizer_dir, preset = "tiny-vision", work_dir = "/tmp/ds41-bench";
  int64_t width = 640, height = 480, repeats = 3, text_tokens = 64;
  int threads = 2;
  bool json = false;
};

image::RgbImage synthetic_image(int64_t w, int64_t h) {
  image::RgbImage im;
  im.width = w;
  im.height = h;
  im.rgb.resize(static_cast<size_t>(w * h * 3));
  std::mt19937 rng(16);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        im.rgb[static_cast<size_t>((y * w + x) * 3 + c)] =
            static_cast<uint8_t>((x * (c + 1) + y * (3 - c)) % 256 ^ (rng() & 15));
  return im;
}

Status run_bench(const VisionBenchArgs& a) {
  if (a.model_dir.empty()) {
    DS41_ASSIGN_OR_RETURN(model::ModelConfig pc, model::preset_config(a.preset));
    if (!pc.has_vision) return invalid_argument("--preset " + a.preset + " has no vision tower");
  }
  std::string dir;
  DS41_ASSIGN_OR_RETURN(LoadedModel lm,
                        load_bench_model({a.model_dir, a.preset, a.work_dir, a.tokenizer_dir, a.threads}, &dir));
  model::Model& m = *lm.model;
  const model::ModelConfig& c = m.config();
  if (!m.vision_tower()) return failed_precondition(dir + ": the model has no vision_config");
  SystemClock clock;
  const image::RgbImage src = synthetic_image(a.width, a.height);
  // Preprocessing.
  image::PreparedImage prepared;
  int64_t t0 = clock.now_mono_ns();
  for (int64_t i = 0; i < a.repeats; ++i) {
    DS41_ASSIGN_OR_RETURN(prepared, image::prepare_image(src, model::vision_plan_config(c)));
  }
  const double pre_s = (clock.now_mono_ns() - t0) * 1e-9 / static_cast<double>(a.repeats);
  // Tower (cache miss path).
  std::vector<model::EncodedImage> enc;
  t0 = clock.now_mono_ns();
  for (int64_t i = 0; i < a.repeats; ++i) {
    DS41_ASSIGN_OR_RETURN(enc, model::encode_images(m, std::span<const image::PreparedImage>(&prepared, 1)));
  }
  const double tower_s = (clock.now_mono_ns() - t0) * 1e-9 / static_cast<double>(a.repeats);
  // Cache hit: the lookup that replaces preprocessing + tower for a resent image.
  engine::VisionFeatureCache cache(int64_t{256} << 20);
  cache.insert("k", std::make_shared<const std::vector<float>>(enc[0].span_embeds));
  t0 = clock.now_mono_ns();
  int64_t found = 0;
  for (int i = 0; i < 1000; ++i) found += cache.find("k") != nullptr;
  const double hit_s = (clock.now_mono_ns() - t0) * 1e-9 / 1000.0;
  // Time to first token of a request holding the image: prefill of text + span + text.
  const int64_t n_img = prepared.plan.n_tokens;
  std::vector<int32_t> ids;
  ids.push_back(static_cast<int32_t>(c.bos_token_id));
  for (int64_t i = 0; i < a.text_tokens / 2; ++i) ids.push_back(static_cast<int32_t>(100 + i));
  ids.insert(ids.end(), static_cast<size_t>(n_img), static_cast<int32_t>(c.image_token_id));
  for (int64_t i = 0; i < a.text_tokens / 2; ++i) ids.push_back(static_cast<int32_t>(300 + i));
  std::vector<std::vector<float>> spans{enc[0].span_embeds};
  DS41_ASSIGN_OR_RETURN(auto placed, model::place_image_spans(ids, static_cast<int32_t>(c.image_token_id),
                                                              spans, c.hidden_size));
  auto st = m.new_sequence();
  model::SequenceInput in{st.get(), placed.tokens, placed.image_span, placed.span_embeds};
  std::vector<model::SequenceOutput> out;
  t0 = clock.now_mono_ns();
  DS41_RETURN_IF_ERROR(
      m.forward(std::span<const model::SequenceInput>(&in, 1), model::ForwardOptions{}, &out));
  const double prefill_s = (clock.now_mono_ns() - t0) * 1e-9;
  const double miss_ttft = pre_s + tower_s + prefill_s, hit_ttft = hit_s + prefill_s;

  nlohmann::ordered_json j = bench_header("vision", {{"backend", "cpu-reference"}},
                                          {{"model", a.model_dir.empty() ? "preset:" + a.preset : dir},
                                           {"vision_hidden", c.vision_hidden_size},
                                           {"vision_layers", c.vision_num_layers},
                                           {"max_image_tokens", c.vision_max_image_tokens},
                                           {"image_wh", {a.width, a.height}},
                                           {"repeats", a.repeats},
                                           {"threads", a.threads}});
  j["plan"] = {
      {"box_hw", {prepared.plan.box_h, prepared.plan.box_w}},
      {"patches", (prepared.plan.box_h / c.vision_patch_size) * (prepared.plan.box_w / c.vision_patch_size)},
      {"span_tokens", n_img}};
  j["preprocess_images_per_s"] = 1.0 / pre_s;
  j["tower_images_per_s"] = 1.0 / tower_s;
  j["end_to_end_images_per_s"] = 1.0 / (pre_s + tower_s);
  j["prefill_s"] = prefill_s;
  j["prompt_tokens"] = static_cast<int64_t>(ids.size());
  j["ttft_image_share_miss"] = (pre_s + tower_s) / miss_ttft;
  j["ttft_s_cache_miss"] = miss_ttft;
  j["ttft_s_cache_hit"] = hit_ttft;
  j["cache_hit_lookup_us"] = hit_s * 1e6;
  j["cache_hit_speedup_of_image_part"] = (pre_s + tower_s) / hit_s;
  j["cache_hits_checked"] = found;
  std::cout << (a.json ? j.dump() : j.dump(2)) << "\n";
  return ok_status();
}

void setup_bench(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<VisionBenchArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "vision",
      "Images/s through preprocessing and the tower, TTFT share of an image, feature-cache hit vs miss");
  cmd->add_option("--model", a->model_dir,
                  "Model directory with vision_config (default: --preset generated)");
  cmd->add_option("--preset", a->preset, "Preset with a vision tower, dummy weights (default tiny-vision)");
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json (default: the shared V4.1 one)");
  cmd->add_option("--work-dir", a->work_dir, "Where the preset is generated (default /tmp/ds41-bench)");
  cmd->add_option("--width", a->width, "Synthetic image width (default 640)");
  cmd->add_option("--height", a->height, "Synthetic image height (default 480)");
  cmd->add_option("--repeats", a->repeats, "Timed repetitions (default 3)");
  cmd->add_option("--text-tokens", a->text_tokens,
                  "Text tokens around the image in the TTFT prompt (default 64)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  cmd->add_flag("--json", a->json, "One-line JSON");
  cmd->callback([a, &exit_code] {
    if (a->width < 1 || a->height < 1 || a->repeats < 1 || a->threads < 1 || a->text_tokens < 0) {
      std::cerr << "ds41 bench vision: --width, --height, --repeats, --threads must be >= 1\n";
      exit_code = 2;
      return;
    }
    Status s = run_bench(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench vision: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace

DS41_REGISTER_BENCH("vision", setup_bench);

}  // namespace ds41::cli
