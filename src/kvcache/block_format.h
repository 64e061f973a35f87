// ds41 kvcache: the versioned byte format of one stored block (global-KV block or SWA snapshot):
// a 64-byte little-endian header (magic, format version, kind, model fingerprint, key, token
// count, payload size, XXH3-64 checksum over header+payload) followed by the opaque payload.
// Every read verifies it; a torn or corrupt block never decodes. Layout: docs/formats/kv_block.md.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kvcache/block_key.h"

namespace ds41::kvcache {

inline constexpr size_t kBlockHeaderBytes = 64;
inline constexpr uint16_t kBlockFormatVersion = 1;
// Upper bound on a payload accepted by decode (guards against a corrupt size field).
inline constexpr uint64_t kBlockMaxPayloadBytes = 1ULL << 32;

enum class BlockKind : uint8_t { kGlobalKv = 1, kSwaSnapshot = 2 };

struct BlockMeta {
  BlockKey key;
  BlockKind kind = BlockKind::kGlobalKv;
  uint64_t model_fingerprint = 0;
  uint32_t token_count = 0;
  bool operator==(const BlockMeta&) const = default;
};

// Header for `payload` (the checksum covers header bytes [0,56) and the payload).
std::array<uint8_t, kBlockHeaderBytes> encode_block_header(const BlockMeta& meta,
                                                           std::span<const uint8_t> payload);
// Header + payload in one buffer.
std::vector<uint8_t> encode_block(const BlockMeta& meta, std::span<const uint8_t> payload);

// Verifies `bytes` (a whole stored block) and that it is the block `expect` names (key, kind,
// fingerprint). Errors: kDataLoss for anything corrupt or torn (bad magic, size mismatch,
// checksum, or a valid block of another key/kind), kUnimplemented for an unknown format
// version, kFailedPrecondition for a valid block written for another model fingerprint. On success returns
// the meta; the payload is bytes.subspan(kBlockHeaderBytes).
Result<BlockMeta> decode_block(std::span<const uint8_t> bytes, const BlockMeta& expect);

// Only the header fields (no checksum check): for tools and size accounting.
struct BlockHeaderInfo {
  BlockMeta meta;
  uint16_t version = 0;
  uint64_t payload_bytes = 0;
};
Result<BlockHeaderInfo> peek_block_header(std::span<const uint8_t> bytes);

}  // namespace ds41::kvcache
