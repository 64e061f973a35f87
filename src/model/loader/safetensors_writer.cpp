// ds41 model/loader: SafetensorsWriter implementation.
#include "model/loader/safetensors_writer.h"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace ds41::model {

void SafetensorsWriter::add(const std::string& name, DType dt, const std::vector<int64_t>& shape,
                            const void* data) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Entry e{dt, shape, std::vector<uint8_t>(static_cast<size_t>(n) * dtype_size(dt))};
  if (!e.bytes.empty()) std::memcpy(e.bytes.data(), data, e.bytes.size());
  tensors_[name] = std::move(e);
}

Status SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json h;
  if (!metadata_.empty()) {
    nlohmann::ordered_json md;
    for (auto& [k, v] : metadata_) md[k] = v;
    h["__metadata__"] = md;
  }
  uint64_t off = 0;
  for (auto& [name, e] : tensors_) {
    h[name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  std::string hs = h.dump();
  while (hs.size() % 8 != 0) hs.push_back(' ');
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return io_error(tmp + ": cannot open for writing");
  uint64_t hl = hs.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hl >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(hs.data(), 1, hs.size(), f) == hs.size();
  for (auto& [name, e] : tensors_)
    ok = ok && (e.bytes.empty() || std::fwrite(e.bytes.data(), 1, e.bytes.size(), f) == e.bytes.size());
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return io_error(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error(path + ": rename from " + tmp + " failed");
  return ok_status();
}

}  // namespace ds41::model
