// libFuzzer target: model::parse_safetensors_header on arbitrary bytes (issue 2, §3). The first
// 8 input bytes are the data-section size (little endian), the rest is the header text. Beyond
// "no crash / no sanitizer report", every accepted header is checked against the parser's own
// contract: offsets inside the data section, sizes = numel * dtype size, no overlap; and every
// rejection must carry a message.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "model/loader/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t data_size = 0;
  if (size >= 8) {
    for (int i = 7; i >= 0; --i) data_size = (data_size << 8) | data[i];
    data += 8;
    size -= 8;
  }
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = ds41::model::parse_safetensors_header(text, data_size);
  if (!r.ok()) {
    if (r.status().message().empty()) std::abort();
    return 0;
  }
  std::vector<const ds41::model::TensorInfo*> spans;
  for (const auto& [name, t] : r->tensors) {
    if (t.name != name || t.end < t.begin || t.end > data_size) std::abort();
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      n *= static_cast<uint64_t>(d);
    }
    if (n * ds41::dtype_size(t.dtype) != t.nbytes()) std::abort();
    if (t.nbytes()) spans.push_back(&t);
  }
  std::sort(spans.begin(), spans.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i]->begin < spans[i - 1]->end) std::abort();
  return 0;
}
