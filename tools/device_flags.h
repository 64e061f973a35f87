// ds41 CLI: the device flags shared by the commands that run the model (issue 10):
//   --device cpu|cuda        default: cuda when this ds41 was built with CUDA and a GPU is found
//   --load-format auto|safetensors|dummy   dummy: random weights generated on the device
//   --seed N                 dummy weights' seed
//   --engram-host-pinned     Engram tables in mapped host-pinned memory (the GPU reads them over PCIe)
// The parsing and the choice of the default are pure functions (tests/unit/tools); the CUDA half
// (DeviceLoadOptions) exists only when tools/CMakeLists.txt defines DS41_HAVE_CUDA_ENGINE (the
// ds41_gpu target exists). Without CUDA, --device cuda is the error "this ds41 was built without CUDA".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace CLI {
class App;
}

#ifdef DS41_HAVE_CUDA_ENGINE
#include "gpu/device_load_options.h"
#endif

namespace ds41::cli {

enum class DeviceKind { kCpu, kCuda };
enum class LoadFormatFlag { kAuto, kSafetensors, kDummy };

struct DeviceFlags {
  std::string device;  // "" = the default
  std::string load_format = "auto";
  uint64_t seed = 0;
  bool engram_host_pinned = false;
  // --numerics of the engine commands (add_engine_device_flags): exact | fp8-act (quant/act_quant.h).
  std::string numerics = "exact";
};

// Registers --device (and, with load_flags, --load-format, --seed, --engram-host-pinned) on `sub`.
// seed_flag: false when the command already has its own --seed (e.g. a sampling seed).
void add_device_flags(CLI::App* sub, DeviceFlags* f, bool load_flags = true, bool seed_flag = true);

// "cpu" / "cuda" / "" (default: cuda when built_with_cuda and gpus > 0, else cpu). InvalidArgument
// for another name; FailedPrecondition for cuda without CUDA ("this ds41 was built without CUDA")
// or without a GPU.
Result<DeviceKind> resolve_device(std::string_view flag, bool built_with_cuda, int gpus);
// The same with this binary's facts (built_with_cuda(), visible_gpus()).
Result<DeviceKind> resolve_device(const DeviceFlags& f);

// "auto" | "safetensors" | "dummy".
Result<LoadFormatFlag> parse_load_format(std::string_view s);
const char* device_kind_name(DeviceKind k);

bool built_with_cuda();
int visible_gpus();  // 0 without CUDA, driver or device

#ifdef DS41_HAVE_CUDA_ENGINE
// The flags as gpu::DeviceLoadOptions (format, seed, engram placement; preset / tokenizer / progress
// are the caller's).
Result<gpu::DeviceLoadOptions> device_load_options(const DeviceFlags& f);
#endif

}  // namespace ds41::cli
