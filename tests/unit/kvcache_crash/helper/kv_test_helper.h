// Shared between the multi-process kvcache tests and their helper binary: the deterministic
// block content for an index, so any process can check what any other process wrote.
#pragma once

#include <cstdint>
#include <vector>

#include "kvcache/block_key.h"
#include "unit/kvcache/test_util.h"

namespace ds41::testing {

inline kvcache::BlockKey helper_key(uint64_t i) {
  return kvcache::BlockKey{0xc0ffee00ULL + i, i * 2654435761ULL};
}
// Sizes vary (1 KiB .. ~114 KB) so torn writes can land anywhere.
inline size_t helper_payload_size(uint64_t i) { return 1024 + (i * 7919) % (113920 - 1024); }
inline std::vector<uint8_t> helper_payload(uint64_t i) {
  return make_payload(i + 77, helper_payload_size(i));
}
inline constexpr uint64_t kHelperFingerprint = 0x4b56;

}  // namespace ds41::testing
