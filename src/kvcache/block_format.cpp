// ds41 kvcache: encode/verify the stored block format (docs/formats/kv_block.md).
#include "kvcache/block_format.h"

#include <xxhash.h>

#include <cstring>
#include <string>

namespace ds41::kvcache {
namespace {

constexpr uint8_t kMagic[8] = {'D', 'S', '4', '1', 'K', 'V', 'B', 0};
constexpr size_t kChecksumOffset = 56;

void put_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t checksum(const uint8_t* header, std::span<const uint8_t> payload) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, header, kChecksumOffset);
  if (!payload.empty()) XXH3_64bits_update(st, payload.data(), payload.size());
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

std::array<uint8_t, kBlockHeaderBytes> encode_block_header(const BlockMeta& meta,
                                                           std::span<const uint8_t> payload) {
  std::array<uint8_t, kBlockHeaderBytes> h{};
  std::memcpy(h.data(), kMagic, 8);
  put_le(h.data() + 8, kBlockFormatVersion, 2);
  put_le(h.data() + 10, kBlockHeaderBytes, 2);
  h[12] = static_cast<uint8_t>(meta.kind);
  put_le(h.data() + 16, meta.model_fingerprint, 8);
  put_le(h.data() + 24, meta.key.hi, 8);
  put_le(h.data() + 32, meta.key.lo, 8);
  put_le(h.data() + 40, meta.token_count, 4);
  put_le(h.data() + 48, payload.size(), 8);
  put_le(h.data() + kChecksumOffset, checksum(h.data(), payload), 8);
  return h;
}

std::vector<uint8_t> encode_block(const BlockMeta& meta, std::span<const uint8_t> payload) {
  auto h = encode_block_header(meta, payload);
  std::vector<uint8_t> out(kBlockHeaderBytes + payload.size());
  std::memcpy(out.data(), h.data(), kBlockHeaderBytes);
  if (!payload.empty()) std::memcpy(out.data() + kBlockHeaderBytes, payload.data(), payload.size());
  return out;
}

Result<BlockHeaderInfo> peek_block_header(std::span<const uint8_t> bytes) {
  if (bytes.size() < kBlockHeaderBytes)
    return data_loss("kv block: " + std::to_string(bytes.size()) + " bytes is shorter than the " +
                     std::to_string(kBlockHeaderBytes) + "-byte header (torn file)");
  const uint8_t* h = bytes.data();
  if (std::memcmp(h, kMagic, 8) != 0) return data_loss("kv block: bad magic (not a ds41 block or corrupt)");
  BlockHeaderInfo info;
  info.version = static_cast<uint16_t>(get_le(h + 8, 2));
  if (info.version != kBlockFormatVersion)
    return unimplemented("kv block: format version " + std::to_string(info.version) + " (this build reads " +
                         std::to_string(kBlockFormatVersion) + ")");
  if (get_le(h + 10, 2) != kBlockHeaderBytes) return data_loss("kv block: header size field is corrupt");
  uint8_t kind = h[12];
  if (kind != static_cast<uint8_t>(BlockKind::kGlobalKv) &&
      kind != static_cast<uint8_t>(BlockKind::kSwaSnapshot))
    return data_loss("kv block: unknown kind " + std::to_string(kind));
  info.meta.kind = static_cast<BlockKind>(kind);
  info.meta.model_fingerprint = get_le(h + 16, 8);
  info.meta.key = BlockKey{get_le(h + 24, 8), get_le(h + 32, 8)};
  info.meta.token_count = static_cast<uint32_t>(get_le(h + 40, 4));
  info.payload_bytes = get_le(h + 48, 8);
  if (info.payload_bytes > kBlockMaxPayloadBytes) return data_loss("kv block: payload size field is corrupt");
  return info;
}

Result<BlockMeta> decode_block(std::span<const uint8_t> bytes, const BlockMeta& expect) {
  DS41_ASSIGN_OR_RETURN(BlockHeaderInfo info, peek_block_header(bytes));
  if (bytes.size() != kBlockHeaderBytes + info.payload_bytes)
    return data_loss("kv block " + info.meta.key.hex() + ": size " + std::to_string(bytes.size()) +
                     " != header " + std::to_string(kBlockHeaderBytes) + " + payload " +
                     std::to_string(info.payload_bytes) + " (torn file)");
  uint64_t stored = get_le(bytes.data() + kChecksumOffset, 8);
  if (stored != checksum(bytes.data(), bytes.subspan(kBlockHeaderBytes)))
    return data_loss("kv block " + info.meta.key.hex() + ": checksum mismatch (corrupt)");
  // A valid block under the wrong name is still wrong content for that name: kDataLoss.
  if (info.meta.key != expect.key)
    return data_loss("kv block: holds key " + info.meta.key.hex() + ", expected " + expect.key.hex());
  if (info.meta.kind != expect.kind) return data_loss("kv block " + expect.key.hex() + ": wrong kind");
  if (info.meta.model_fingerprint != expect.model_fingerprint)
    return failed_precondition("kv block " + expect.key.hex() + ": model fingerprint " +
                               std::to_string(info.meta.model_fingerprint) + " != expected " +
                               std::to_string(expect.model_fingerprint));
  return info.meta;
}

}  // namespace ds41::kvcache
