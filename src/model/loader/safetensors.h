// ds41 model/loader: safetensors files (single and sharded), memory-mapped and lazy.
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"__metadata__": {...}, "NAME": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...},
// then the data section; offsets are relative to the data section start.
// Validation here is structural (sizes, offsets, overlap, dtype names); the model's tensor
// contract (names/shapes/dtypes derived from config.json) is checked in tensor_contract.h.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offset in the data section
  uint64_t end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// Largest header we accept (the released shards have headers of a few MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 256ull << 20;

struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates a header JSON against a data section of data_size bytes: every entry has
// a known dtype, non-negative shape, end-begin == numel*size, end <= data_size, and no two
// tensors overlap. Errors name the tensor and the numbers involved. Safe on arbitrary input
// (fuzzed).
Result<SafetensorsHeader> parse_safetensors_header(std::string_view json, uint64_t data_size);

// One memory-mapped safetensors file. Pages are touched only when data() is read.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  uint64_t file_size() const { return file_size_; }
  // Pointer to the tensor's bytes inside the mapping (valid while the file lives).
  const uint8_t* data(const TensorInfo& t) const { return data_base_ + t.begin; }
  // File offset of the data section (8 + header length): a tensor's bytes are at
  // data_section_offset() + begin in the file (readers that pread instead of mapping).
  uint64_t data_section_offset() const {
    return static_cast<uint64_t>(data_base_ - static_cast<const uint8_t*>(map_));
  }

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  uint64_t file_size_ = 0;
  void* map_ = nullptr;
  const uint8_t* data_base_ = nullptr;
};

// A tensor of a checkpoint: its info and a pointer to its bytes.
struct TensorRef {
  const TensorInfo* info = nullptr;
  const uint8_t* data = nullptr;
  const SafetensorsFile* file = nullptr;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json with its shards.
// Every tensor name must be unique across shards and, for a sharded checkpoint, listed in the
// index's weight_map with the shard that holds it.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorRef* find(const std::string& name) const;
  uint64_t payload_bytes() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> tensors_;
};

}  // namespace ds41::model
