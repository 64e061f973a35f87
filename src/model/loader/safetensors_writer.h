// ds41 model/loader: SafetensorsWriter — builds a safetensors file in memory (tensors are copied
// in) and writes it atomically (temp file + rename). Used by `ds41 score` for engine outputs
// under the golden array names, and by the dump facility. The header is padded with spaces to a
// multiple of 8 bytes so every tensor is 8-byte aligned in the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41::model {

class SafetensorsWriter {
 public:
  // Copies bytes (numel(shape) * dtype_size(dt) of them). A repeated name replaces the tensor.
  void add(const std::string& name, DType dt, const std::vector<int64_t>& shape, const void* data);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    add(name, DType::kF32, shape, data);
  }
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
    add(name, DType::kI32, shape, data);
  }
  void add_u8(const std::string& name, const std::vector<int64_t>& shape, const uint8_t* data) {
    add(name, DType::kU8, shape, data);
  }
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  size_t size() const { return tensors_.size(); }
  Status write(const std::string& path) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace ds41::model
