// ds41 model/loader: writing safetensors checkpoints (used by `ds41 make-checkpoint` and tests).
// A SafetensorsStreamWriter streams one file: the header (computed up front from the tensor list, padded
// with spaces to a multiple of 8 bytes) and then every tensor's bytes in list order, contiguous.
// A tensor can be skipped instead of written: the file keeps a hole there (lseek past it, and
// ftruncate to the final size at the end), which reads back as zeros and costs no disk blocks —
// this is how `--layout-only` writes the 510 GB released layout in a few MB.
// write_checkpoint() splits a tensor list over K shards (contiguous runs, balanced by bytes) and
// writes model.safetensors (K = 1) or model-0000i-of-0000K.safetensors plus
// model.safetensors.index.json (weight_map + metadata.total_size), as the release does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds41::model {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

class SafetensorsStreamWriter {
 public:
  // Creates (truncates) path and writes the header. Fails on duplicate names or an unwritable path.
  static Result<std::unique_ptr<SafetensorsStreamWriter>> create(
      const std::string& path, std::vector<TensorSpec> tensors,
      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Index of the tensor the next write_next/skip_next refers to.
  size_t next_index() const { return next_; }
  size_t tensor_count() const { return tensors_.size(); }
  const TensorSpec& tensor(size_t i) const { return tensors_[i]; }
  // Writes the next tensor; n must equal its byte size.
  Status write_next(const uint8_t* data, uint64_t n);
  // Leaves the next tensor as a hole (zeros, no disk blocks).
  Status skip_next();
  // Requires every tensor written or skipped; sets the final size (holes at the end stay holes)
  // and closes the file.
  Status finish();
  uint64_t header_bytes() const { return header_len_; }
  uint64_t file_size() const { return 8 + header_len_ + data_size_; }

 private:
  SafetensorsStreamWriter() = default;
  std::string path_;
  int fd_ = -1;
  std::vector<TensorSpec> tensors_;
  uint64_t header_len_ = 0;
  uint64_t data_size_ = 0;
  uint64_t cursor_ = 0;  // data-section offset of the next tensor
  size_t next_ = 0;
};

// Shard of each tensor for K shards: contiguous runs in list order, balanced by bytes, every
// shard non-empty when there are at least K tensors (otherwise min(K, n) shards).
std::vector<int> assign_shards(const std::vector<uint64_t>& sizes, int shards);

// Called for each tensor in list order with a buffer of exactly its byte size to fill.
using TensorFillFn = std::function<Status(size_t index, uint8_t* out, uint64_t nbytes)>;

struct CheckpointWriteOptions {
  int shards = 1;
  bool layout_only = false;  // every tensor a hole; fill is not called
  // Optional progress callback (bytes done, bytes total).
  std::function<void(uint64_t, uint64_t)> progress;
};

// Writes the shards (and the index when shards > 1) into dir (created if absent). Existing
// safetensors files of another layout in dir are not removed; callers use a fresh directory.
Status write_checkpoint(const std::string& dir, const std::vector<TensorSpec>& tensors,
                        const CheckpointWriteOptions& options, const TensorFillFn& fill);

// Writes a text file atomically enough for tools (write + close, error names the path).
Status write_text_file(const std::string& path, const std::string& text);

// Name of shard i (0-based) of k: "model-00001-of-00048.safetensors"; "model.safetensors" if k == 1.
std::string shard_file_name(int i, int k);

}  // namespace ds41::model
