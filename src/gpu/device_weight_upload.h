// ds41 gpu: streaming checkpoint bytes from disk to the device (issue 10 "Loading"). The byte
// ranges wanted from each shard are merged into spans and cut into work units; `io_threads`
// workers take units in turn, each with its own CUDA stream and two pinned staging buffers of a
// few MB: while buffer A's host-to-device copy runs, the next pread fills buffer B (disk reads
// overlapped with copies, several shards read in parallel). Destinations are device memory, or
// host memory (mapped pinned Engram tables: a plain memcpy). Progress counts wanted bytes and is
// reported on the calling thread. Errors (I/O, CUDA) are values naming the file and offset.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds41::gpu {

struct UploadJob {
  int file = 0;         // index into the paths passed to upload_file_ranges
  uint64_t offset = 0;  // byte offset in the file
  uint64_t bytes = 0;
  void* dst = nullptr;  // device address (or host address when dst_host); null: read and discard
  bool dst_host = false;
};

struct UploadOptions {
  int device = 0;
  int io_threads = 4;
  uint64_t stage_bytes = 8ull << 20;   // per staging buffer (two per worker)
  uint64_t unit_bytes = 256ull << 20;  // work unit (a worker reads one unit sequentially)
  // false: read only (the raw-disk baseline of `bench load`). CUDA (a stream, pinned staging) is
  // used only when some job has a device destination.
  bool copy = true;
  std::function<void(uint64_t done, uint64_t total)> progress;  // on the calling thread
};

struct UploadStats {
  uint64_t bytes = 0;       // wanted bytes moved
  uint64_t read_bytes = 0;  // bytes read from disk (spans include small gaps)
  double seconds = 0;
  int threads = 0;
};

// Moves every job's bytes; returns when all copies have completed (streams synchronised).
Status upload_file_ranges(const std::vector<std::string>& paths, const std::vector<UploadJob>& jobs,
                          const UploadOptions& opt, UploadStats* stats = nullptr);

}  // namespace ds41::gpu
