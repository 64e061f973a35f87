// ds41 CLI: --device / --load-format / --seed / --engram-host-pinned (device_flags.h).
#include "device_flags.h"

#include <CLI/CLI.hpp>

#ifdef DS41_HAVE_CUDA_ENGINE
#include "backends/cuda/cuda_status.h"
#endif

namespace ds41::cli {

void add_device_flags(CLI::App* sub, DeviceFlags* f, bool load_flags, bool seed_flag) {
  sub->add_option("--device", f->device, "cpu | cuda (default: cuda when a GPU is found and ds41 has CUDA)");
  if (!load_flags) return;
  sub->add_option("--load-format", f->load_format,
                  "auto | safetensors | dummy (dummy: random weights generated on the device, any preset or "
                  "config.json)");
  if (seed_flag) sub->add_option("--seed", f->seed, "Seed of --load-format dummy weights");
  sub->add_flag("--engram-host-pinned", f->engram_host_pinned,
                "Keep Engram tables in host pinned memory (read by the GPU over the bus)");
}

Result<DeviceKind> resolve_device(std::string_view flag, bool with_cuda, int gpus) {
  if (flag.empty()) return with_cuda && gpus > 0 ? DeviceKind::kCuda : DeviceKind::kCpu;
  if (flag == "cpu") return DeviceKind::kCpu;
  if (flag == "cuda") {
    if (!with_cuda) return failed_precondition("--device cuda: this ds41 was built without CUDA");
    if (gpus <= 0) return failed_precondition("--device cuda: no CUDA device found");
    return DeviceKind::kCuda;
  }
  return invalid_argument("--device: unknown device '" + std::string(flag) + "' (cpu or cuda)");
}

Result<DeviceKind> resolve_device(const DeviceFlags& f) {
  return resolve_device(f.device, built_with_cuda(), visible_gpus());
}

Result<LoadFormatFlag> parse_load_format(std::string_view s) {
  if (s == "auto" || s.empty()) return LoadFormatFlag::kAuto;
  if (s == "safetensors") return LoadFormatFlag::kSafetensors;
  if (s == "dummy") return LoadFormatFlag::kDummy;
  return invalid_argument("--load-format: unknown format '" + std::string(s) +
                          "' (auto, safetensors or dummy)");
}

const char* device_kind_name(DeviceKind k) { return k == DeviceKind::kCuda ? "cuda" : "cpu"; }

bool built_with_cuda() {
#ifdef DS41_HAVE_CUDA_ENGINE
  return true;
#else
  return false;
#endif
}

int visible_gpus() {
#ifdef DS41_HAVE_CUDA_ENGINE
  return cuda::cuda_device_count();
#else
  return 0;
#endif
}

#ifdef DS41_HAVE_CUDA_ENGINE
Result<gpu::DeviceLoadOptions> device_load_options(const DeviceFlags& f) {
  DS41_ASSIGN_OR_RETURN(LoadFormatFlag lf, parse_load_format(f.load_format));
  gpu::DeviceLoadOptions o;
  o.format = lf == LoadFormatFlag::kDummy         ? gpu::LoadFormat::kDummy
             : lf == LoadFormatFlag::kSafetensors ? gpu::LoadFormat::kSafetensors
                                                  : gpu::LoadFormat::kAuto;
  o.seed = f.seed;
  o.engram_host_pinned = f.engram_host_pinned;
  return o;
}
#endif

}  // namespace ds41::cli
