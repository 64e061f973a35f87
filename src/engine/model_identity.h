// ds41 engine: the model identity a prefix cache keys its blocks with (issue 13: "different models
// or different weights never share blocks"). Built from the bytes that decide the KV a model
// computes: config.json, the checkpoint's weights (every *.safetensors file's name, size, header
// and 16 samples of 64 KiB spread over it: two checkpoints of the same shapes but other weights
// differ in every sample), and the KV layout with the state payload version. Reading the samples
// costs ~1 MiB per file, not the whole checkpoint.
#pragma once

#include <string>

#include "core/status.h"
#include "model/kv_layout.h"

namespace ds41::engine {

// "ds41-kv1 config=<xxh3-64> weights=<xxh3-64> layout=<...>". Errors name the file.
Result<std::string> model_identity(const std::string& model_dir, const model::KvLayout& layout);

}  // namespace ds41::engine
