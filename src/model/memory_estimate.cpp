#include "model/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "model/config.h"
#include "model/kv_layout.h"
#include "model/layer_schedule.h"

namespace ds41::model {

Result<MemoryEstimate> estimate_model_memory(const std::string& dir, int64_t context_tokens,
                                             int64_t sequences) {
  DS41_ASSIGN_OR_RETURN(ModelConfig c, load_model_config(dir));
  DS41_ASSIGN_OR_RETURN(LayerSchedule s, derive_layer_schedule(c));
  DS41_ASSIGN_OR_RETURN(KvLayout kv, make_kv_layout(c, s));
  MemoryEstimate e;
  e.context_tokens = context_tokens;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    if (f.path().extension() != ".safetensors") continue;
    const uintmax_t n = std::filesystem::file_size(f.path(), ec);
    if (!ec) e.weights_bytes += n;
  }
  if (ec) return io_error("cannot list " + dir + ": " + ec.message());
  const double per_seq =
      kv.global_bytes_per_token() * static_cast<double>(std::max<int64_t>(context_tokens, 0)) +
      static_cast<double>(kv.window_ring_bytes());
  e.kv_bytes = static_cast<uint64_t>(per_seq * static_cast<double>(std::max<int64_t>(sequences, 1)));
  // Activations, logits rows and scratch: 256 MiB or 1% of the weights, whichever is larger.
  e.workspace_bytes = std::max<uint64_t>(256ULL << 20, e.weights_bytes / 100);
  return e;
}

std::string format_gb(uint64_t bytes) {
  char b[32];
  if (bytes < 1'000'000'000ULL)
    std::snprintf(b, sizeof b, "%.1f MB", static_cast<double>(bytes) / 1e6);
  else
    std::snprintf(b, sizeof b, "%.1f GB", static_cast<double>(bytes) / 1e9);
  return b;
}

Status check_memory_fits(const MemoryEstimate& e, uint64_t available_bytes, const std::string& where) {
  if (e.total() <= available_bytes) return ok_status();
  return resource_exhausted(
      "the model needs about " + format_gb(e.total()) + " (weights " + format_gb(e.weights_bytes) +
      ", KV for " + std::to_string(e.context_tokens) + " tokens " + format_gb(e.kv_bytes) + ", workspaces " +
      format_gb(e.workspace_bytes) + ") but only " + format_gb(available_bytes) + " is available " + where);
}

}  // namespace ds41::model
