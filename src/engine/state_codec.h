// ds41 engine: the byte layouts of a sequence's exported state (docs/formats/kv_block.md "Engine
// state payloads"): global-KV blocks (the growing state, MODEL_SPEC 5.2-5.3, cut into fixed token
// blocks) and SWA snapshots (everything else a restore needs, MODEL_SPEC 4.1 / 5.4). Pure
// functions over model::SequenceState; the CPU engine calls them directly and the GPU engine
// writes the same bytes from its device pools, so a block written by one restores in the other.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/kv_layout.h"
#include "model/sequence_state.h"

namespace ds41::engine {

// kInvalidArgument unless block_tokens > 0 and every KV source's ratio divides it.
Status check_block_tokens(const model::KvLayout& layout, int64_t block_tokens);
// Payload bytes of one global-KV block: block_tokens x the global bytes per token (113,920 B for
// the released config at 128 tokens).
int64_t kv_block_payload_bytes(const model::KvLayout& layout, int64_t block_tokens);

// Block `index` (tokens [index * B, (index + 1) * B)) of `st`; kOutOfRange when not yet consumed.
Result<std::vector<uint8_t>> encode_kv_block(const model::SequenceState& st, int64_t index,
                                             int64_t block_tokens);

// The SWA snapshot at st.position() with `flags` (kSwaFlagApproximate).
Result<std::vector<uint8_t>> encode_swa_snapshot(const model::SequenceState& st, int64_t block_tokens,
                                                 uint32_t flags);

// Fixed header fields of a snapshot payload (checked for size, not for layout).
struct SwaSnapshotInfo {
  uint32_t flags = 0;
  int64_t position = 0;
  int64_t block_tokens = 0;
};
Result<SwaSnapshotInfo> peek_swa_snapshot(std::span<const uint8_t> payload);

// Fills a fresh state (position 0) from blocks 0..n-1 and, when `snapshot` is not empty, the
// snapshot at L with floor(L / B) == n. Without a snapshot the state ends at position n * B with
// the global rows only (window rings empty). Every size and layout field is checked first
// (kInvalidArgument / kDataLoss naming the field); on error `st` is unchanged.
Status decode_state(model::SequenceState& st, std::span<const std::span<const uint8_t>> blocks,
                    std::span<const uint8_t> snapshot, int64_t block_tokens);

}  // namespace ds41::engine
