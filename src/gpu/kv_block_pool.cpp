// ds41 gpu: KvBlockPool (kv_block_pool.h).
#include "gpu/kv_block_pool.h"

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "core/check.h"

namespace ds41::gpu {

PageAllocator::PageAllocator(int64_t n_pages) : refs_(static_cast<size_t>(n_pages), 0) {
  free_.reserve(static_cast<size_t>(n_pages));
  for (int64_t p = n_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

Result<int32_t> PageAllocator::allocate() {
  if (free_.empty())
    return resource_exhausted("KV block pool: all " + std::to_string(refs_.size()) +
                              " pages are in use (raise the KV memory of the engine)");
  const int32_t p = free_.back();
  free_.pop_back();
  refs_[p] = 1;
  return p;
}

void PageAllocator::retain(int32_t page) {
  DS41_CHECK(page >= 0 && page < total_pages() && refs_[page] > 0, "retain of a free or unknown page");
  ++refs_[page];
}

void PageAllocator::release(int32_t page) {
  DS41_CHECK(page >= 0 && page < total_pages() && refs_[page] > 0, "release of a free or unknown page");
  if (--refs_[page] == 0) free_.push_back(page);
}

Result<KvBlockPool> KvBlockPool::create(const model::KvLayout& layout, int64_t n_pages,
                                        int64_t entries_per_page) {
  if (entries_per_page <= 0) return invalid_argument("KV block pool: entries_per_page must be > 0");
  if (n_pages < 0 || n_pages > INT32_MAX) return invalid_argument("KV block pool: page count out of range");
  KvBlockPool p;
  p.geo_.entries_per_page = entries_per_page;
  for (const model::KvSourceLayout& s : layout.sources) {
    if ((p.geo_.kv_row_bytes != 0 && p.geo_.kv_row_bytes != s.kv_row_bytes) ||
        (p.geo_.key_row_bytes != 0 && p.geo_.key_row_bytes != s.key_row_bytes))
      return invalid_argument("KV block pool: KV sources with different row sizes");
    p.geo_.kv_row_bytes = s.kv_row_bytes;
    p.geo_.key_row_bytes = s.key_row_bytes;
  }
  if (layout.sources.empty()) n_pages = 0;  // window-only model: nothing grows
  p.alloc_ = PageAllocator(n_pages);
  DS41_ASSIGN_OR_RETURN(p.buf_,
                        DeviceBuffer::allocate(static_cast<size_t>(n_pages * p.geo_.page_bytes()),
                                               "KV block pool (" + std::to_string(n_pages) + " pages)"));
  return p;
}

int64_t KvBlockPool::pages_for_tokens(const model::KvLayout& layout, int64_t tokens,
                                      int64_t entries_per_page) {
  int64_t pages = 0;
  for (const model::KvSourceLayout& s : layout.sources)
    pages += (tokens / s.ratio + entries_per_page - 1) / entries_per_page;
  return pages;
}

int64_t KvBlockPool::kv_row_offset(const std::vector<int32_t>& pages, int64_t k) const {
  return pages[k / geo_.entries_per_page] * geo_.page_bytes() + geo_.kv_offset_in_page() +
         (k % geo_.entries_per_page) * geo_.kv_row_bytes;
}

int64_t KvBlockPool::key_row_offset(const std::vector<int32_t>& pages, int64_t k) const {
  return pages[k / geo_.entries_per_page] * geo_.page_bytes() + geo_.key_offset_in_page() +
         (k % geo_.entries_per_page) * geo_.key_row_bytes;
}

namespace {

// Calls f(k, run) for the runs of entries [first, first + n) that lie in one page each.
template <class F>
Status for_page_runs(int64_t E, int64_t first, int64_t n, F f) {
  for (int64_t k = first; k < first + n;) {
    const int64_t run = std::min(E - k % E, first + n - k);
    DS41_RETURN_IF_ERROR(f(k, run));
    k += run;
  }
  return ok_status();
}

}  // namespace

Status KvBlockPool::download_entries(const std::vector<int32_t>& pages, int64_t first, int64_t n, uint8_t* kv,
                                     uint8_t* key, cudaStream_t stream) const {
  DS41_CHECK(first >= 0 && first + n <= static_cast<int64_t>(pages.size()) * geo_.entries_per_page,
             "KV entries beyond the sequence's pages");
  return for_page_runs(geo_.entries_per_page, first, n, [&](int64_t k, int64_t run) {
    const int64_t o = k - first;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(kv + o * geo_.kv_row_bytes, base() + kv_row_offset(pages, k),
                        static_cast<size_t>(run * geo_.kv_row_bytes), cudaMemcpyDeviceToHost, stream),
        "download KV rows"));
    return cuda::cuda_status(
        cudaMemcpyAsync(key + o * geo_.key_row_bytes, base() + key_row_offset(pages, k),
                        static_cast<size_t>(run * geo_.key_row_bytes), cudaMemcpyDeviceToHost, stream),
        "download index key rows");
  });
}

Status KvBlockPool::upload_entries(const std::vector<int32_t>& pages, int64_t first, int64_t n, const uint8_t* kv,
                                   const uint8_t* key, cudaStream_t stream) const {
  DS41_CHECK(first >= 0 && first + n <= static_cast<int64_t>(pages.size()) * geo_.entries_per_page,
             "KV entries beyond the sequence's pages");
  return for_page_runs(geo_.entries_per_page, first, n, [&](int64_t k, int64_t run) {
    const int64_t o = k - first;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(base() + kv_row_offset(pages, k), kv + o * geo_.kv_row_bytes,
                        static_cast<size_t>(run * geo_.kv_row_bytes), cudaMemcpyHostToDevice, stream),
        "upload KV rows"));
    return cuda::cuda_status(
        cudaMemcpyAsync(base() + key_row_offset(pages, k), key + o * geo_.key_row_bytes,
                        static_cast<size_t>(run * geo_.key_row_bytes), cudaMemcpyHostToDevice, stream),
        "upload index key rows");
  });
}

double KvBlockPool::bytes_per_token(const model::KvLayout& layout, const KvPageGeometry& geo) {
  double b = 0;
  for (const model::KvSourceLayout& s : layout.sources)
    b += static_cast<double>(geo.page_bytes() / geo.entries_per_page) / static_cast<double>(s.ratio);
  return b;
}

}  // namespace ds41::gpu
