// ds41 backends/cuda: weights brought into L2 ahead of the GEMV that reads them (issue 11, decode).
// A batch-1 decode layer alternates GEMVs, which stream weights from HBM, with chains of small
// kernels (the mHC sites, the attention, the router) that read little and leave HBM idle for tens of
// microseconds. run_l2_prefetch, enqueued at the start of such a chain, starts the next GEMVs'
// weights streaming into L2 meanwhile (bulk L2 prefetches: no register, no shared memory, no value
// changes), so that the GEMV then reads them from L2. Graph-capturable; no allocation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/device_weight.h"
#include "core/status.h"

namespace ds41::cuda {

// Byte ranges of device memory that no kernel writes while the prefetch runs (weights), in the
// order they will be read; the first cap bytes of them are prefetched.
struct L2Regions {
  static constexpr int kMax = 8;
  const void* ptr[kMax] = {};
  int64_t bytes[kMax] = {};
  int count = 0;
  // Appends w's payload, then its scales (both, if room is left: false when the regions are full).
  bool add(const DeviceWeight& w);
  bool add(const void* p, int64_t bytes);
  int64_t total() const;
};

// The regions' own errors: a region with bytes < 0, a null pointer with bytes > 0, a count out of range.
Status check_l2_regions(const L2Regions& r);

// One small launch (PDL: it waits for the previous kernel, then lets the next one start before it
// issues its prefetches): the first cap_bytes of r, in order. cap_bytes <= 0 or no regions: nothing
// is launched. Errors: a region with bytes < 0 or a null pointer with bytes > 0.
Status run_l2_prefetch(const L2Regions& r, int64_t cap_bytes, cudaStream_t stream);

}  // namespace ds41::cuda
