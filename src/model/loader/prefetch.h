// ds41 model/loader: bringing a read-only file mapping into memory fast (cold page cache).
// A checkpoint shard is mmapped (safetensors.h) and then streamed to the device; a single thread
// faulting 4 KB pages one by one reaches well under the disk's sequential bandwidth (issue 2 §6:
// 0.68x dd on the H200 host). prefetch_mapped() splits the range into one contiguous,
// page-aligned slice per thread of the caller's ThreadPool (model code never starts threads,
// ARCHITECTURE.md); each slice advises MADV_SEQUENTIAL on its slice and then populates it in
// 64 MB steps with MADV_POPULATE_READ (Linux >= 5.14: page-cache read + page-table fill in one
// call), keeping one step of MADV_WILLNEED readahead in flight. Where MADV_POPULATE_READ is
// unsupported (EINVAL) the slice is touched one byte per page instead. The data is not changed.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "core/thread_pool.h"

namespace ds41::model {

struct PrefetchStats {
  int threads_used = 0;
  bool used_populate_read = false;  // false: fell back to touching every page
  size_t bytes = 0;
};

// Populates [p, p+n) of a readable mapping (p need not be page aligned) with pool.size() slices
// (clamped to the number of pages) run through pool.parallel_for. Errors: p == nullptr with n > 0,
// or the kernel refusing the range (EFAULT/ENOMEM: not mapped, or beyond the end of the file) —
// the message names the failing offset. n == 0 is ok and does nothing.
Status prefetch_mapped(const void* p, size_t n, ThreadPool& pool, PrefetchStats* stats = nullptr);

}  // namespace ds41::model
