// ds41 CLI: engine construction per device (engine_factory.h).
#include "engine_factory.h"

#include <algorithm>
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "engine/cpu_engine.h"
#include "engine/forwarding_engine.h"
#include "forward_cli_util.h"
#include "load_progress.h"

#ifdef DS41_HAVE_CUDA_ENGINE
#include "backends/cuda/cuda_status.h"
#include "gpu/cuda_engine.h"
#include "gpu/gpu_dspark_score.h"
#endif

namespace ds41::cli {
namespace {

#ifdef DS41_HAVE_CUDA_ENGINE
constexpr bool kHaveCudaEngine = true;
#else
constexpr bool kHaveCudaEngine = false;
#endif

[[maybe_unused]] std::string default_device_name() {
#ifdef DS41_HAVE_CUDA_ENGINE
  return cuda::cuda_device_count() > 0 ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

Result<gpu::LoadFormat> load_format_of(const DeviceFlags& f) {
  if (f.load_format == "auto" || f.load_format.empty()) return gpu::LoadFormat::kAuto;
  if (f.load_format == "safetensors") return gpu::LoadFormat::kSafetensors;
  if (f.load_format == "dummy") return gpu::LoadFormat::kDummy;
  return invalid_argument("--load-format must be auto, safetensors or dummy, got '" + f.load_format + "'");
}

// An engine that owns what it computes with (the model and its backend), destroyed after it.
class OwningEngine final : public engine::ForwardingEngine {
 public:
  OwningEngine(std::shared_ptr<void> keep, std::unique_ptr<engine::Engine> inner)
      : engine::ForwardingEngine(inner.get()), keep_(std::move(keep)), owned_(std::move(inner)) {}

 private:
  std::shared_ptr<void> keep_;  // declared first: destroyed after the engine
  std::unique_ptr<engine::Engine> owned_;
};

Result<EngineHandle> make_cpu_engine(const EngineRequest& r, quant::ActNumerics act) {
  auto lm = std::make_shared<LoadedModel>();
  DS41_RETURN_IF_ERROR(check_model_fits(r.model_dir, r.context_tokens, r.memory_limit));
  const auto t0 = std::chrono::steady_clock::now();
  lm->pool = std::make_unique<ThreadPool>(r.threads);
  backends::cpu::CpuBackendOptions bo;
  bo.act = act;
  lm->backend = std::make_unique<backends::cpu::CpuBackend>(lm->pool.get(), bo);
  model::LoadOptions lo;
  lo.tokenizer_dir = r.tokenizer_dir;
  LoadProgress progress(stderr, LoadProgress::mode_for(stderr, r.quiet), r.who + ": weights");
  lo.progress = [&progress](uint64_t done, uint64_t total) { progress.update(done, total); };
  DS41_ASSIGN_OR_RETURN(lm->model, model::Model::load(r.model_dir, lo, lm->backend.get()));
  if (!r.quiet)
    std::fprintf(stderr, "%s: model loaded in %.1f s (cpu, %d threads, numerics %s)\n", r.who.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), r.threads,
                 quant::act_numerics_name(act));
  EngineHandle h;
  h.numerics = act;
  h.config = lm->model->config();
  h.schedule = lm->model->schedule();
  h.cpu_pool = lm->pool.get();
  h.cpu_model = lm->model.get();
  auto e = std::make_unique<engine::CpuEngine>(lm->model.get(), r.model_name, r.max_context);
  h.engine = std::make_unique<OwningEngine>(lm, std::move(e));
  return h;
}

#ifdef DS41_HAVE_CUDA_ENGINE
Result<EngineHandle> make_gpu_engine(const DeviceFlags& f, const EngineRequest& r, quant::ActNumerics act) {
  const auto t0 = std::chrono::steady_clock::now();
  gpu::DeviceLoadOptions o;
  DS41_ASSIGN_OR_RETURN(o.format, load_format_of(f));
  o.seed = f.seed;
  o.preset = r.preset;
  o.tokenizer_dir = r.tokenizer_dir;
  o.engram_host_pinned = f.engram_host_pinned;
  LoadProgress progress(stderr, LoadProgress::mode_for(stderr, r.quiet), r.who + ": weights (cuda)");
  o.progress = [&progress](uint64_t done, uint64_t total) { progress.update(done, total); };
  DS41_ASSIGN_OR_RETURN(std::unique_ptr<gpu::DeviceModel> dm, gpu::DeviceModel::load(r.model_dir, o));
  std::shared_ptr<gpu::DeviceModel> model(std::move(dm));
  gpu::CudaEngineOptions eo;
  eo.model_name = r.model_name;
  eo.limits.max_step_tokens = r.max_batch_tokens;
  eo.limits.max_step_seqs = r.max_sequences;
  eo.limits.max_context = r.max_context;
  eo.limits.max_logit_rows = r.max_logit_rows;
  eo.limits.numerics = act;
  // DSpark (issue 17): a verification returns B + 1 logits rows per sequence; room for every
  // sequence's in one forward (unless the caller sized the rows).
  const model::ModelConfig& mc = model->config();
  if (r.max_logit_rows == 0 && mc.num_nextn_predict_layers > 0 && mc.dspark_block_size > 0)
    eo.limits.max_logit_rows = std::min(r.max_batch_tokens, r.max_sequences * (mc.dspark_block_size + 1));
  eo.max_sequences = r.max_sequences;
  eo.kv_bytes = r.kv_bytes;
  DS41_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaEngine> ce, gpu::CudaEngine::create(model.get(), eo));
  if (!r.quiet)
    std::fprintf(stderr, "%s: model loaded in %.1f s (%s, %.2f GiB of weights)\n", r.who.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 ce->info().device.c_str(), static_cast<double>(model->weight_bytes()) / (1 << 30));
  EngineHandle h;
  h.config = model->config();
  h.schedule = model->schedule();
  h.numerics = act;
  gpu::CudaEngine* raw = ce.get();
  const size_t H = static_cast<size_t>(model->config().hidden_size);
  h.forward_all = [raw, H](engine::SeqId seq, std::span<const int32_t> tokens, int64_t chunk, bool record,
                           std::span<const uint8_t> image_span,
                           std::span<const float> span_embeds) -> Result<model::SequenceOutput> {
    model::SequenceOutput all;
    size_t flagged_all = 0;
    for (uint8_t f : image_span) flagged_all += f != 0;
    if ((!image_span.empty() && image_span.size() != tokens.size()) ||
        (!span_embeds.empty() && span_embeds.size() != flagged_all * H))
      return invalid_argument("image spans: " + std::to_string(image_span.size()) + " flags for " +
                              std::to_string(tokens.size()) + " tokens, " +
                              std::to_string(span_embeds.size()) + " span values for " +
                              std::to_string(flagged_all) + " flagged positions");
    const size_t step = chunk > 0 ? static_cast<size_t>(chunk) : tokens.size();
    size_t rows_done = 0;
    for (size_t b = 0; b < tokens.size(); b += step) {
      const size_t n = std::min(step, tokens.size() - b);
      engine::StepItem it{seq, tokens.subspan(b, n), true};
      if (!image_span.empty()) {  // this chunk's flags and the rows of its flagged positions
        it.image_span = image_span.subspan(b, n);
        size_t flagged = 0;
        for (uint8_t f : it.image_span) flagged += f != 0;
        if (!span_embeds.empty()) it.span_embeds = span_embeds.subspan(rows_done * H, flagged * H);
        rows_done += flagged;
      }
      std::vector<model::SequenceOutput> out;
      DS41_RETURN_IF_ERROR(
          raw->forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kAll, record, &out));
      all.append(std::move(out[0]));
    }
    return all;
  };
  h.dspark_score = [raw](const engine::DsparkScoreInput& in) { return gpu::gpu_dspark_score(*raw, in); };
  h.decoder_replay_all = [raw](engine::SeqId seq,
                               std::span<const int32_t> tokens) -> Result<model::SequenceOutput> {
    model::SequenceOutput out;
    DS41_RETURN_IF_ERROR(raw->decoder_replay(seq, tokens, model::LogitsRows::kAll, &out));
    return out;
  };
  h.engine = std::make_unique<OwningEngine>(model, std::move(ce));
  return h;
}
#endif

}  // namespace

void add_engine_device_flags(CLI::App* cmd, DeviceFlags* f, bool seed_flag) {
#if __has_include("device_flags.h")
  add_device_flags(cmd, f, true, seed_flag);
#else
  (void)seed_flag;
  cmd->add_option("--device", f->device, "cpu or cuda (default: cuda when a GPU is found)");
  cmd->add_option(
      "--load-format", f->load_format,
      "--device cuda: auto (default), safetensors, or dummy (seeded random weights on the device)");
#endif
  cmd->add_option("--numerics", f->numerics,
                  "exact (default: activations in float32, the goldens' numerics) | fp8-act (the official path: "
                  "activations quantized to FP8 per 32 before every FP8 / FP4 linear, prefill GEMMs in one pass)");
}

Result<std::string> engine_device(const DeviceFlags& f) {
  std::string dev;
#if __has_include("device_flags.h")
  DS41_ASSIGN_OR_RETURN(DeviceKind k, resolve_device(f));
  dev = k == DeviceKind::kCuda ? "cuda" : "cpu";
#else
  dev = f.device.empty() ? default_device_name() : f.device;
  if (dev != "cpu" && dev != "cuda")
    return invalid_argument("--device must be cpu or cuda, got '" + dev + "'");
  if (dev == "cuda" && !kHaveCudaEngine)
    return failed_precondition("--device cuda: this ds41 was built without CUDA");
#endif
  DS41_ASSIGN_OR_RETURN(gpu::LoadFormat fmt, load_format_of(f));
  if (dev == "cpu" && fmt == gpu::LoadFormat::kDummy)
    return invalid_argument("--load-format dummy needs --device cuda (the CPU reference reads checkpoints)");
  return dev;
}

Result<gpu::LoadFormat> engine_load_format(const DeviceFlags& f) { return load_format_of(f); }

std::string device_name(const DeviceFlags& f) {
  auto d = engine_device(f);
  return d.ok() ? *d : std::string("cpu");
}

Result<EngineHandle> make_engine(const DeviceFlags& flags, const EngineRequest& req) {
  DS41_ASSIGN_OR_RETURN(const std::string dev, engine_device(flags));
  Result<quant::ActNumerics> act = quant::parse_act_numerics(flags.numerics);
  if (!act.ok()) return act.status().with_context("--numerics");
  if (dev == "cpu") return make_cpu_engine(req, *act);
#ifdef DS41_HAVE_CUDA_ENGINE
  return make_gpu_engine(flags, req, *act);
#else
  return failed_precondition("--device cuda: this ds41 was built without CUDA");
#endif
}

}  // namespace ds41::cli
