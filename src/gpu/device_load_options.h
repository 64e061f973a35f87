// ds41 gpu: how a DeviceModel is loaded (format, dummy seed / preset, Engram placement, I/O
// threads, progress). A plain header (no CUDA types), so the command-line tools can build these
// options in a ds41 built without CUDA (engine_factory.h, device_flags.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ds41::gpu {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

struct DeviceLoadOptions {
  LoadFormat format = LoadFormat::kAuto;  // kAuto: safetensors when the folder has them
  std::string preset;                     // dummy without a config.json: a preset name (model/presets.h)
  uint64_t seed = 0;                      // dummy weights
  std::string tokenizer_dir;              // as model::LoadOptions (Engram's compressed vocabulary)
  bool engram_host_pinned = false;        // Engram tables in mapped host-pinned memory
  int device = 0;
  int io_threads = 4;  // shards read in parallel
  // Called on the loading thread with bytes done / total (as model::LoadOptions::progress).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

}  // namespace ds41::gpu
