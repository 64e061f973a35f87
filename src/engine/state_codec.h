// ds41 engine: the byte layouts of a sequence's exported state (docs/formats/kv_block.md "Engine
// state payloads"): global-KV blocks (the growing state, MODEL_SPEC 5.2-5.3, cut into fixed token
// blocks) and SWA snapshots (everything else a restore needs, MODEL_SPEC 4.1 / 5.4). Pure
// functions between the payloads and the engine-neutral state forms of state_view.h: every engine
// encodes from a StateView and decodes through parse_state into a ParsedState that it applies, so
// a block written by one engine restores in another (the CPU engine's SequenceState overloads
// below are thin wrappers).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/state_view.h"
#include "model/kv_layout.h"
#include "model/sequence_state.h"

namespace ds41::engine {

// kInvalidArgument unless block_tokens > 0 and every KV source's ratio divides it.
Status check_block_tokens(const model::KvLayout& layout, int64_t block_tokens);
// Payload bytes of one global-KV block: block_tokens x the global bytes per token (113,920 B for
// the released config at 128 tokens).
int64_t kv_block_payload_bytes(const model::KvLayout& layout, int64_t block_tokens);

// The view of a SequenceState (rings and rows point into `st`; valid while it is unchanged).
StateView view_of(const model::SequenceState& st);

// Block `index` (tokens [index * B, (index + 1) * B)) of the state; kOutOfRange when not yet
// consumed. The view's sources must hold entries [index * B / ratio, (index + 1) * B / ratio).
Result<std::vector<uint8_t>> encode_kv_block(const StateView& v, int64_t index, int64_t block_tokens);
Result<std::vector<uint8_t>> encode_kv_block(const model::SequenceState& st, int64_t index,
                                             int64_t block_tokens);

// The SWA snapshot at the view's position with `flags` (kSwaFlagApproximate). The view's sources
// must hold the partial last block's entries [floor(L / B) * B / ratio, count) and the pending
// groups; its rings the rows of positions [max(0, L - window), L).
Result<std::vector<uint8_t>> encode_swa_snapshot(const StateView& v, int64_t block_tokens, uint32_t flags);
Result<std::vector<uint8_t>> encode_swa_snapshot(const model::SequenceState& st, int64_t block_tokens,
                                                 uint32_t flags);

// Fixed header fields of a snapshot payload (checked for size, not for layout).
struct SwaSnapshotInfo {
  uint32_t flags = 0;
  int64_t position = 0;
  int64_t block_tokens = 0;
};
Result<SwaSnapshotInfo> peek_swa_snapshot(std::span<const uint8_t> payload);

// Checks a restore of a fresh state (`position` must be 0) from blocks 0..n-1 and, when
// `snapshot` is not empty, the snapshot at L with floor(L / B) == n: every size and layout field
// (kInvalidArgument / kDataLoss naming the field, kFailedPrecondition for a non-fresh state).
// The result points into the payloads. Without a snapshot the restore ends at position n * B with
// the global rows only (window rings empty).
Result<ParsedState> parse_state(const model::KvLayout& layout, int64_t position,
                                std::span<const std::span<const uint8_t>> blocks,
                                std::span<const uint8_t> snapshot, int64_t block_tokens);
// Writes a parsed restore into a fresh SequenceState of the same layout.
void apply_state(model::SequenceState& st, const ParsedState& p);

// parse_state + apply_state: on error `st` is unchanged.
Status decode_state(model::SequenceState& st, std::span<const std::span<const uint8_t>> blocks,
                    std::span<const uint8_t> snapshot, int64_t block_tokens);

}  // namespace ds41::engine
