// libFuzzer target: model::parse_model_config on arbitrary text (issue 2, §3), followed by the
// layer-schedule derivation on every accepted config (the next consumer of the parsed values).
// Rejections must carry a message; accepted configs must pass validate_model_config again.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/config.h"
#include "model/layer_schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = ds41::model::parse_model_config(text);
  if (!c.ok()) {
    if (c.status().message().empty()) std::abort();
    return 0;
  }
  if (!ds41::model::validate_model_config(*c).ok()) std::abort();
  auto s = ds41::model::derive_layer_schedule(*c);
  if (!s.ok()) {
    if (s.status().message().empty()) std::abort();
    return 0;
  }
  if (static_cast<int64_t>(s->layers.size()) != c->num_hidden_layers) std::abort();
  (void)s->describe();
  return 0;
}
