// ds41 kvcache: chain hashing of token blocks with streaming XXH3-128 (one pass over the
// tokens; the digest at each block boundary is that block's key).
#include "kvcache/block_key.h"

#include <xxhash.h>

#include <cstring>
#include <memory>

#include "core/check.h"

namespace ds41::kvcache {
namespace {

constexpr char kDomain[8] = {'d', 's', '4', '1', 'k', 'v', '1', 0};

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using StatePtr = std::unique_ptr<XXH3_state_t, StateDeleter>;

void put_u32le(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Preamble: domain tag, u64 identity length, identity bytes, u32 block size (all LE) — the
// length prefix makes (identity, block size) unambiguous.
StatePtr start_state(const std::string& identity, uint32_t block_tokens) {
  StatePtr st(XXH3_createState());
  DS41_CHECK(st != nullptr, "XXH3_createState failed");
  XXH3_128bits_reset(st.get());
  uint8_t buf[8];
  XXH3_128bits_update(st.get(), kDomain, sizeof(kDomain));
  put_u64le(buf, identity.size());
  XXH3_128bits_update(st.get(), buf, 8);
  XXH3_128bits_update(st.get(), identity.data(), identity.size());
  put_u32le(buf, block_tokens);
  XXH3_128bits_update(st.get(), buf, 4);
  return st;
}

// Token ids are hashed as u32 little-endian, in chunks to keep the update calls large.
void update_tokens(XXH3_state_t* st, std::span<const int32_t> tokens) {
  uint8_t buf[4 * 256];
  size_t i = 0;
  while (i < tokens.size()) {
    size_t n = std::min<size_t>(256, tokens.size() - i);
    for (size_t j = 0; j < n; ++j) put_u32le(buf + 4 * j, static_cast<uint32_t>(tokens[i + j]));
    XXH3_128bits_update(st, buf, 4 * n);
    i += n;
  }
}

// The 40-byte records of images[next, ...) that start before `end` (docs/formats/kv_block.md
// "Prompts with images"); returns the index of the first span not recorded.
size_t update_images(XXH3_state_t* st, std::span<const ImageSpanKey> images, size_t next, int64_t end) {
  static constexpr char kImageTag[8] = {'d', 's', '4', '1', 'i', 'm', 'g', '\0'};
  for (; next < images.size() && images[next].start < end; ++next) {
    uint8_t rec[40];
    std::memcpy(rec, kImageTag, 8);
    put_u64le(rec + 8, static_cast<uint64_t>(images[next].start));
    put_u64le(rec + 16, static_cast<uint64_t>(images[next].length));
    put_u64le(rec + 24, images[next].hash_hi);
    put_u64le(rec + 32, images[next].hash_lo);
    XXH3_128bits_update(st, rec, sizeof(rec));
  }
  return next;
}

BlockKey digest(XXH3_state_t* st) {
  XXH128_hash_t h = XXH3_128bits_digest(st);
  return BlockKey{h.high64, h.low64};
}

}  // namespace

std::string BlockKey::hex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) s[i] = kDigits[(hi >> (60 - 4 * i)) & 0xf];
  for (int i = 0; i < 16; ++i) s[16 + i] = kDigits[(lo >> (60 - 4 * i)) & 0xf];
  return s;
}

std::optional<BlockKey> BlockKey::from_hex(std::string_view s) {
  if (s.size() != 32) return std::nullopt;
  uint64_t parts[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    char c = s[i];
    uint64_t d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return std::nullopt;
    parts[i / 16] = (parts[i / 16] << 4) | d;
  }
  return BlockKey{parts[0], parts[1]};
}

Result<BlockChainHasher> BlockChainHasher::create(std::string model_identity, uint32_t block_tokens) {
  if (block_tokens == 0) return invalid_argument("block hasher: block_tokens must be > 0");
  if (model_identity.empty()) return invalid_argument("block hasher: model_identity must not be empty");
  return BlockChainHasher(std::move(model_identity), block_tokens);
}

std::vector<BlockKey> BlockChainHasher::chain_keys(std::span<const int32_t> tokens) const {
  std::vector<BlockKey> keys;
  size_t n_blocks = tokens.size() / block_tokens_;
  keys.reserve(n_blocks);
  StatePtr st = start_state(model_identity_, block_tokens_);
  for (size_t b = 0; b < n_blocks; ++b) {
    update_tokens(st.get(), tokens.subspan(b * block_tokens_, block_tokens_));
    keys.push_back(digest(st.get()));
  }
  return keys;
}

std::vector<BlockKey> BlockChainHasher::chain_keys_with_images(std::span<const int32_t> tokens,
                                                               std::span<const ImageSpanKey> images) const {
  std::vector<BlockKey> keys;
  const size_t n_blocks = tokens.size() / block_tokens_;
  keys.reserve(n_blocks);
  StatePtr st = start_state(model_identity_, block_tokens_);
  size_t next = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    update_tokens(st.get(), tokens.subspan(b * block_tokens_, block_tokens_));
    next = update_images(st.get(), images, next, static_cast<int64_t>((b + 1) * block_tokens_));
    keys.push_back(digest(st.get()));
  }
  return keys;
}

BlockKey BlockChainHasher::prefix_key_with_images(std::span<const int32_t> tokens,
                                                  std::span<const ImageSpanKey> images) const {
  // The stream of chain_keys_with_images up to the last full block, then the partial block's ids
  // and the records of the spans starting inside it (one that runs past the prefix end too).
  StatePtr st = start_state(model_identity_, block_tokens_);
  const size_t n_full = tokens.size() / block_tokens_;
  size_t next = 0;
  for (size_t b = 0; b < n_full; ++b) {
    update_tokens(st.get(), tokens.subspan(b * block_tokens_, block_tokens_));
    next = update_images(st.get(), images, next, static_cast<int64_t>((b + 1) * block_tokens_));
  }
  if (tokens.size() > n_full * block_tokens_) {
    update_tokens(st.get(), tokens.subspan(n_full * block_tokens_));
    update_images(st.get(), images, next, static_cast<int64_t>(tokens.size()));
  }
  return digest(st.get());
}

BlockKey BlockChainHasher::prefix_key(std::span<const int32_t> tokens) const {
  StatePtr st = start_state(model_identity_, block_tokens_);
  update_tokens(st.get(), tokens);
  return digest(st.get());
}

}  // namespace ds41::kvcache
