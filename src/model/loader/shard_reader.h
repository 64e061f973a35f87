// ds41 model/loader: reads a rank's part of a checkpoint (model/parallel_plan.h) with pread, so a
// rank reads exactly its bytes from disk and nothing of the other ranks' experts or slices (the
// memory map of SafetensorsFile would also touch only the pages read, but pread makes the count
// exact and keeps the page cache out of the way on a node where 8 ranks read one checkpoint).
// A row slice is one contiguous read; a column slice is one read per row.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/loader/safetensors.h"
#include "model/loader/tensor_contract.h"
#include "model/parallel_plan.h"

namespace ds41::model {

struct SliceReadStats {
  uint64_t bytes_read = 0;
  uint64_t reads = 0;
};

// The slice's bytes in row-major order of the sliced shape ([rows, cols] of the part). Errors
// name the tensor and the file (missing tensor, short read, slice outside the shape).
Status read_tensor_slice(const Checkpoint& ck, const TensorContract& contract, const TensorSlice& s,
                         std::vector<uint8_t>* out, SliceReadStats* stats = nullptr);

}  // namespace ds41::model
