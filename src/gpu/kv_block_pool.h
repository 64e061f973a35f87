// ds41 gpu: KvBlockPool — the device block pool that holds the growing part of every sequence's
// state (MODEL_SPEC 4.1, 5.2-5.3): the compressed Q_kv rows and Q_idx key rows of each KV source,
// in fixed-size pages of `entries_per_page` entries of ONE source of ONE sequence. A page holds its
// entries' Q_kv rows first, then their Q_idx rows, so the bytes per compressed entry are exactly
// KvSourceLayout::entry_bytes() and the bytes per token sum to KvLayout::global_bytes_per_token()
// (890 B for the released config), as on the CPU. Pages are refcounted (a fork or the prefix
// cache shares full pages; the engine copies a partial page before anyone appends to it) and
// come from a free list; nothing is allocated after creation.
//
// PageAllocator is the host bookkeeping alone (testable without a device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "gpu/device_buffer.h"
#include "model/kv_layout.h"

namespace ds41::gpu {

class PageAllocator {
 public:
  explicit PageAllocator(int64_t n_pages = 0);
  // A free page with refcount 1; resource_exhausted when none is left.
  Result<int32_t> allocate();
  void retain(int32_t page);   // refcount + 1
  void release(int32_t page);  // refcount - 1; back on the free list at 0
  int32_t refcount(int32_t page) const { return refs_[page]; }
  int64_t total_pages() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_pages() const { return total_pages() - free_pages(); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is reused first
};

struct KvPageGeometry {
  int64_t entries_per_page = 64;
  int64_t kv_row_bytes = 0;   // Q_kv row (288 B for head_dim 512)
  int64_t key_row_bytes = 0;  // Q_idx row (68 B for index_head_dim 128)
  int64_t page_bytes() const { return entries_per_page * (kv_row_bytes + key_row_bytes); }
  int64_t kv_offset_in_page() const { return 0; }
  int64_t key_offset_in_page() const { return entries_per_page * kv_row_bytes; }
  // Bytes one compressed entry costs in a page (= KvSourceLayout::entry_bytes()).
  int64_t entry_bytes() const { return kv_row_bytes + key_row_bytes; }
};

class KvBlockPool {
 public:
  KvBlockPool() = default;
  // A pool of n_pages pages for the layout's KV sources (all sources share one row geometry).
  static Result<KvBlockPool> create(const model::KvLayout& layout, int64_t n_pages,
                                    int64_t entries_per_page = 64);
  // Pages needed so that `tokens` tokens of every KV source fit (admission by capacity).
  static int64_t pages_for_tokens(const model::KvLayout& layout, int64_t tokens, int64_t entries_per_page);

  const KvPageGeometry& geometry() const { return geo_; }
  PageAllocator& pages() { return alloc_; }
  const PageAllocator& pages() const { return alloc_; }
  uint8_t* base() const { return buf_.as<uint8_t>(); }
  // Byte offsets (from base()) of entry k of a source whose pages are `pages`.
  int64_t kv_row_offset(const std::vector<int32_t>& pages, int64_t k) const;
  int64_t key_row_offset(const std::vector<int32_t>& pages, int64_t k) const;
  // Host transfers of entries [first, first + n) of a source whose pages are `pages` (state export
  // / import): Q_kv rows to / from kv (n x kv_row_bytes), Q_idx rows to / from key, one copy per
  // page run, on `stream` (the caller synchronises).
  Status download_entries(const std::vector<int32_t>& pages, int64_t first, int64_t n, uint8_t* kv,
                          uint8_t* key, cudaStream_t stream) const;
  Status upload_entries(const std::vector<int32_t>& pages, int64_t first, int64_t n, const uint8_t* kv,
                        const uint8_t* key, cudaStream_t stream) const;
  // Device bytes of the pool; bytes of the pages in use.
  int64_t capacity_bytes() const { return alloc_.total_pages() * geo_.page_bytes(); }
  int64_t used_bytes() const { return alloc_.used_pages() * geo_.page_bytes(); }
  // Global KV bytes per token as this pool stores the entries: sum over sources of the bytes of
  // one entry in a page / ratio. Equals layout.global_bytes_per_token() (tests check it).
  static double bytes_per_token(const model::KvLayout& layout, const KvPageGeometry& geo);

 private:
  KvPageGeometry geo_;
  PageAllocator alloc_;
  DeviceBuffer buf_;
};

}  // namespace ds41::gpu
