// ds41 model/loader: multi-threaded prefault of read-only mappings (see prefetch.h).
#include "model/loader/prefetch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ds41::model {
namespace {

#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;  // linux/mman.h, Linux >= 5.14
#endif

constexpr size_t kStep = size_t{64} << 20;

// Reads one byte per page; returns a value so the loads are not optimised away.
uint8_t touch_pages(const uint8_t* b, size_t len, size_t page) {
  uint8_t acc = 0;
  for (size_t off = 0; off < len; off += page) acc ^= *static_cast<const volatile uint8_t*>(b + off);
  if (len > 0) acc ^= *static_cast<const volatile uint8_t*>(b + len - 1);
  return acc;
}

struct SliceResult {
  int err = 0;             // errno of the failing madvise, 0 when fine
  size_t err_offset = 0;   // offset (from the page-aligned start) of the failing step
  bool fell_back = false;  // MADV_POPULATE_READ returned EINVAL
};

void prefetch_slice(uint8_t* base, size_t begin, size_t end, size_t page, SliceResult* r,
                    std::atomic<uint8_t>* sink) {
  if (begin >= end) return;
  madvise(base + begin, end - begin, MADV_SEQUENTIAL);  // advice only; failure is harmless
  uint8_t acc = 0;
  for (size_t s = begin; s < end; s += kStep) {
    const size_t len = std::min(kStep, end - s);
    const size_t next = s + len;
    if (next < end) madvise(base + next, std::min(kStep, end - next), MADV_WILLNEED);
    if (!r->fell_back) {
      if (madvise(base + s, len, kMadvPopulateRead) == 0) continue;
      if (errno != EINVAL) {
        r->err = errno;
        r->err_offset = s;
        return;
      }
      r->fell_back = true;  // kernel without MADV_POPULATE_READ
    }
    acc ^= touch_pages(base + s, len, page);
  }
  sink->fetch_xor(acc, std::memory_order_relaxed);
}

}  // namespace

Status prefetch_mapped(const void* p, size_t n, ThreadPool& pool, PrefetchStats* stats) {
  if (n == 0) {
    if (stats) *stats = PrefetchStats{0, false, 0};
    return ok_status();
  }
  if (p == nullptr)
    return invalid_argument("prefetch_mapped: null pointer with " + std::to_string(n) + " bytes");
  const size_t page = static_cast<size_t>(std::max(4096L, sysconf(_SC_PAGESIZE)));
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = addr / page * page;
  uint8_t* base = reinterpret_cast<uint8_t*>(first);
  const size_t total = ((addr + n + page - 1) / page * page) - first;  // whole pages covering [p, p+n)
  const size_t pages = total / page;
  const size_t t = std::min<size_t>(static_cast<size_t>(pool.size()), pages);
  // Contiguous slices of whole pages, the first (pages % t) one page longer.
  std::vector<SliceResult> results(t);
  std::atomic<uint8_t> sink{0};
  std::vector<size_t> starts(t + 1, 0);
  for (size_t i = 0; i < t; ++i) starts[i + 1] = starts[i] + (pages / t + (i < pages % t ? 1 : 0)) * page;
  pool.parallel_for(static_cast<int64_t>(t), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      prefetch_slice(base, starts[static_cast<size_t>(i)], starts[static_cast<size_t>(i) + 1], page,
                     &results[static_cast<size_t>(i)], &sink);
  });
  bool fell_back = false;
  for (size_t i = 0; i < t; ++i) {
    fell_back |= results[i].fell_back;
    if (results[i].err != 0) {
      const size_t off = results[i].err_offset - std::min<size_t>(results[i].err_offset, addr - first);
      return io_error("prefetch_mapped: madvise(MADV_POPULATE_READ) failed at byte " + std::to_string(off) +
                      " of " + std::to_string(n) + " (" + std::strerror(results[i].err) +
                      "; range not mapped or beyond the end of the file?)");
    }
  }
  if (stats) *stats = PrefetchStats{static_cast<int>(t), !fell_back, n};
  return ok_status();
}

}  // namespace ds41::model
