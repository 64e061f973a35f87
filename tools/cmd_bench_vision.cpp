// ds41 bench vision (issue 16): images per second through preprocessing (plan, Pillow-exact
// bicubic, pad, patches) and through the engine's tower (ViT + aligner + span rows:
// Engine::encode_images, what a request's image costs the serving path), the share of a request's
// time to first token spent on the image (tower vs the prefill of a prompt holding the image's
// span), and a vision-feature cache hit against a miss, in one run. Runs on the engine of
// --device (engine_factory.h, as generate / serve): the CPU reference, or the GPU engine
// (GpuVisionTower on the device; its first encode and prefill are untimed warm-ups); and the
// encoder/prefill overlap: decode steps of a text sequence alone and while another thread runs
// the tower (the engine loop's ImageEncoder), against the stall of the tower on the loop thread.
// The model is --model DIR (any checkpoint with vision_config) or a preset: generated with
// make-checkpoint's recipe under --work-dir (default tiny-vision; `small` has a 256-wide 2-block
// tower), or with --device cuda --load-format dummy generated on the device (e.g.
// --preset v41-flash-slice-vision: the released tower widths, MODEL_SPEC 1.4, on one GPU).
// Prints one JSON object with --json (tools/bench_header.h), else indented.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "bench_header.h"
#include "cli_registry.h"
#include "core/clock.h"
#include "engine/vision_feature_cache.h"
#include "engine_factory.h"
#include "image/preprocess.h"
#include "model/checkpoint_maker.h"
#include "model/image_input.h"
#include "model/presets.h"
#include "model/vision_span.h"
#include "resource_paths.h"

namespace ds41::cli {
namespace {
namespace cmd_bench_vision {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct VisionBenchArgs {
  std::string model_dir, tokenizer_dir, preset = "tiny-vision", work_dir = "/tmp/ds41-bench";
  int64_t width = 640, height = 480, repeats = 3, text_tokens = 64;
  int threads = 2;
  bool json = false;
  DeviceFlags device;  // --device, --load-format, --seed (engine_factory.h)
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

// The preset's folder --work-dir/vision-PRESET: the preset with its vocabulary widened to
// hold image_token_id (the tiny presets keep the released id 129264 over a 2048-id vocabulary, so
// their spans could not run), as a make-checkpoint model (seed 1), or only its config.json when
// the GPU engine generates the weights (--load-format dummy).
Result<std::string> vision_preset_dir(const VisionBenchArgs& a, bool config_only) {
  DS41_ASSIGN_OR_RETURN(model::ModelConfig c, model::preset_config(a.preset));
  if (!c.has_vision) return invalid_argument("--preset " + a.preset + " has no vision tower");
  c.vocab_size = std::max(c.vocab_size, c.image_token_id + 1);
  const std::string dir = a.work_dir + "/vision-" + a.preset;
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  if (config_only) {
    std::filesystem::create_directories(dir);
    std::ofstream f(dir + "/config.json");
    f << model::model_config_to_json(c);
    if (!f) return internal_error(dir + "/config.json: write failed");
    return dir;
  }
  model::MakeCheckpointOptions mo;
  mo.seed = 1;
  DS41_ASSIGN_OR_RETURN(auto made, model::make_checkpoint(dir, c, mo));
  (void)made;
  return dir;
}

Status run_bench(const VisionBenchArgs& a) {
  DS41_ASSIGN_OR_RETURN(const std::string device, engine_device(a.device));
  DS41_ASSIGN_OR_RETURN(const gpu::LoadFormat fmt, engine_load_format(a.device));
  const bool generated = a.model_dir.empty() && fmt == gpu::LoadFormat::kDummy;  // weights on the device
  std::string dir = a.model_dir;
  if (dir.empty()) {
    DS41_ASSIGN_OR_RETURN(dir, vision_preset_dir(a, generated));
  }
  std::string tok_dir = a.tokenizer_dir;
  if (tok_dir.empty() && !std::filesystem::exists(dir + "/tokenizer.json")) {
    DS41_ASSIGN_OR_RETURN(tok_dir, default_tokenizer_dir());
  }
  DS41_ASSIGN_OR_RETURN(const model::ModelConfig c, model::load_model_config(dir));
  if (!c.has_vision) return failed_precondition(dir + ": the model has no vision_config");
  if (c.image_token_id < 0 || c.image_token_id >= c.vocab_size)
    return failed_precondition(dir + ": image_token_id " + std::to_string(c.image_token_id) +
                               " is outside the vocabulary of " + std::to_string(c.vocab_size));
  SystemClock clock;
  const image::RgbImage src = synthetic_image(a.width, a.height);
  // Preprocessing (host; the same on both engines).
  image::PreparedImage prepared;
  int64_t t0 = clock.now_mono_ns();
  for (int64_t i = 0; i < a.repeats; ++i) {
    DS41_ASSIGN_OR_RETURN(prepared, image::prepare_image(src, model::vision_plan_config(c)));
  }
  const double pre_s = (clock.now_mono_ns() - t0) * 1e-9 / static_cast<double>(a.repeats);
  // The TTFT prompt: text + the image's span + text.
  const int64_t n_img = prepared.plan.n_tokens;
  std::vector<int32_t> ids;
  ids.push_back(static_cast<int32_t>(c.bos_token_id));
  for (int64_t i = 0; i < a.text_tokens / 2; ++i)
    ids.push_back(static_cast<int32_t>((100 + i) % c.vocab_size));
  ids.insert(ids.end(), static_cast<size_t>(n_img), static_cast<int32_t>(c.image_token_id));
  for (int64_t i = 0; i < a.text_tokens / 2; ++i)
    ids.push_back(static_cast<int32_t>((300 + i) % c.vocab_size));
  const int64_t P = static_cast<int64_t>(ids.size());
  EngineRequest req;
  req.model_dir = dir;
  req.tokenizer_dir = tok_dir;
  req.model_name = "bench";
  req.who = "ds41 bench vision";
  req.threads = a.threads;
  // The decode sequence of the overlap measurement below runs up to kDecodeCap tokens.
  constexpr int64_t kDecodeCap = 2048;
  req.context_tokens = std::max<int64_t>(P + 16, kDecodeCap + 16);
  if (device == "cuda") req.max_context = req.context_tokens;  // sizes the GPU workspace
  req.max_batch_tokens = std::max<int64_t>(2048, P);
  req.max_sequences = 2;
  req.kv_bytes = int64_t{1} << 30;
  req.quiet = a.json || device == "cpu";  // the CPU model is small here; the GPU load shows progress
  DS41_ASSIGN_OR_RETURN(EngineHandle eh, make_engine(a.device, req));
  engine::Engine& eng = *eh.engine;
  if (!eng.info().has_vision) return failed_precondition("the " + device + " engine has no vision tower");
  const std::vector<const image::PreparedImage*> one{&prepared};
  const bool warm_up = device != "cpu";
  // Tower (cache-miss path): span rows through the engine.
  std::vector<std::vector<float>> spans;
  if (warm_up) {
    DS41_ASSIGN_OR_RETURN(spans, eng.encode_images(one));
  }
  t0 = clock.now_mono_ns();
  for (int64_t i = 0; i < a.repeats; ++i) {
    DS41_ASSIGN_OR_RETURN(spans, eng.encode_images(one));
  }
  const double tower_s = (clock.now_mono_ns() - t0) * 1e-9 / static_cast<double>(a.repeats);
  // Cache hit: the lookup that replaces preprocessing + tower for a resent image.
  engine::VisionFeatureCache cache(int64_t{256} << 20);
  cache.insert("k", std::make_shared<const std::vector<float>>(spans[0]));
  t0 = clock.now_mono_ns();
  int64_t found = 0;
  for (int i = 0; i < 1000; ++i) found += cache.find("k") != nullptr;
  const double hit_s = (clock.now_mono_ns() - t0) * 1e-9 / 1000.0;
  // Time to first token of a request holding the image: one prefill step of text + span + text.
  DS41_ASSIGN_OR_RETURN(auto placed, model::place_image_spans(ids, static_cast<int32_t>(c.image_token_id),
                                                              spans, c.hidden_size));
  auto prefill = [&]() -> Result<double> {
    DS41_ASSIGN_OR_RETURN(engine::SeqId seq, eng.create_sequence());
    engine::StepItem it{seq, placed.tokens, true, placed.image_span, placed.span_embeds};
    engine::StepOutput out;
    const int64_t b = clock.now_mono_ns();
    Status st = eng.step(std::span<const engine::StepItem>(&it, 1), &out);
    const double s = (clock.now_mono_ns() - b) * 1e-9;
    DS41_RETURN_IF_ERROR(eng.free_sequence(seq));
    DS41_RETURN_IF_ERROR(st);
    return s;
  };
  if (warm_up) DS41_RETURN_IF_ERROR(prefill().status());
  DS41_ASSIGN_OR_RETURN(const double prefill_s, prefill());
  const double miss_ttft = pre_s + tower_s + prefill_s, hit_ttft = hit_s + prefill_s;

  // Encoder/prefill overlap (docs/vision.md): a text sequence decodes one token per step, alone,
  // then while another thread runs the tower `repeats` times (what the engine loop's ImageEncoder
  // does; engine.h allows encode_images concurrently with step). With the tower on the loop thread
  // instead (--image-encoder-jobs 0) a decode step waits for the whole encode: tower_s.
  engine::SeqId dseq = -1;
  int64_t dpos = 0;
  auto decode_step = [&]() -> Result<double> {
    if (dseq < 0 || dpos >= kDecodeCap) {  // (re)start: a short text prefill, untimed
      if (dseq >= 0) DS41_RETURN_IF_ERROR(eng.free_sequence(dseq));
      DS41_ASSIGN_OR_RETURN(dseq, eng.create_sequence());
      const std::vector<int32_t> pre(ids.begin(), ids.begin() + 1 + a.text_tokens / 2);
      engine::StepItem it{dseq, pre, true};
      engine::StepOutput out;
      DS41_RETURN_IF_ERROR(eng.step(std::span<const engine::StepItem>(&it, 1), &out));
      dpos = static_cast<int64_t>(pre.size());
    }
    const int32_t tok = static_cast<int32_t>((500 + dpos) % c.vocab_size);
    engine::StepItem it{dseq, std::span<const int32_t>(&tok, 1), true};
    engine::StepOutput out;
    const int64_t b = clock.now_mono_ns();
    DS41_RETURN_IF_ERROR(eng.step(std::span<const engine::StepItem>(&it, 1), &out));
    ++dpos;
    return (clock.now_mono_ns() - b) * 1e-9;
  };
  DS41_RETURN_IF_ERROR(decode_step().status());  // warm-up
  double alone_sum = 0;
  constexpr int kAloneSteps = 16;
  for (int i = 0; i < kAloneSteps; ++i) {
    DS41_ASSIGN_OR_RETURN(const double d, decode_step());
    alone_sum += d;
  }
  std::atomic<bool> enc_done{false};
  Status enc_status = ok_status();
  double enc_overlap_s = 0;
  std::thread encoder([&] {
    const int64_t b = clock.now_mono_ns();
    for (int64_t i = 0; i < a.repeats && enc_status.ok(); ++i) {
      auto r = eng.encode_images(one);
      if (!r.ok()) enc_status = r.status();
    }
    enc_overlap_s = (clock.now_mono_ns() - b) * 1e-9 / static_cast<double>(a.repeats);
    enc_done.store(true);
  });
  int64_t during = 0;
  double during_sum = 0, during_max = 0;
  Status dec_status = ok_status();
  while (!enc_done.load()) {
    auto d = decode_step();
    if (!d.ok()) {
      dec_status = d.status();
      break;
    }
    ++during;
    during_sum += *d;
    during_max = std::max(during_max, *d);
  }
  encoder.join();
  DS41_RETURN_IF_ERROR(enc_status);
  DS41_RETURN_IF_ERROR(dec_status);
  if (dseq >= 0) DS41_RETURN_IF_ERROR(eng.free_sequence(dseq));

  const std::string backend = eng.info().device == "cpu" ? "cpu-reference" : eng.info().device;
  nlohmann::ordered_json j =
      bench_header("vision", {{"backend", backend}},
                   {{"model", a.model_dir.empty() ? "preset:" + a.preset + " (" + dir + ")" : dir},
                    {"load_format", generated ? "dummy" : "safetensors"},
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
  j["prompt_tokens"] = P;
  j["ttft_image_share_miss"] = (pre_s + tower_s) / miss_ttft;
  j["ttft_s_cache_miss"] = miss_ttft;
  j["ttft_s_cache_hit"] = hit_ttft;
  j["cache_hit_lookup_us"] = hit_s * 1e6;
  j["cache_hit_speedup_of_image_part"] = (pre_s + tower_s) / hit_s;
  j["cache_hits_checked"] = found;
  j["overlap"] = {{"decode_step_s_alone", alone_sum / kAloneSteps},
                  {"decode_steps_during_encode", during},
                  {"decode_step_s_during_encode_mean", during > 0 ? during_sum / static_cast<double>(during) : 0.0},
                  {"decode_step_s_during_encode_max", during_max},
                  {"tower_s_during_decode", enc_overlap_s},
                  {"decode_stall_s_on_loop_thread", tower_s}};
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
  cmd->add_option(
      "--preset", a->preset,
      "Preset with a vision tower (default tiny-vision; v41-flash-slice-vision: the released tower "
      "widths, with --device cuda --load-format dummy)");
  cmd->add_option("--tokenizer", a->tokenizer_dir,
                  "Folder with tokenizer.json (default: the shared V4.1 one)");
  cmd->add_option("--work-dir", a->work_dir, "Where the preset is generated (default /tmp/ds41-bench)");
  cmd->add_option("--width", a->width, "Synthetic image width (default 640)");
  cmd->add_option("--height", a->height, "Synthetic image height (default 480)");
  cmd->add_option("--repeats", a->repeats, "Timed repetitions (default 3)");
  cmd->add_option("--text-tokens", a->text_tokens,
                  "Text tokens around the image in the TTFT prompt (default 64)");
  cmd->add_option("--threads", a->threads, "CPU threads (default 2)");
  add_engine_device_flags(cmd, &a->device);
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

}  // namespace cmd_bench_vision
}  // namespace

DS41_REGISTER_BENCH("vision", ::ds41::cli::cmd_bench_vision::setup_bench);

}  // namespace ds41::cli
