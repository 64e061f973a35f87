// ds41 engram: NumPy SeedSequence + PCG64 + Generator.integers(int64), bit-exact.
#include "engram/numpy_rng.h"

#include <string>

namespace ds41::engram {

namespace {

// SeedSequence hashing constants (NumPy bit_generator.pyx, after M.E. O'Neill's seed_seq_fe).
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // 4 bytes * 8 / 2

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// PCG64 multiplier 2549297995355413924 * 2^64 + 4865540595714422341.
constexpr unsigned __int128 kPcgMult =
    (static_cast<unsigned __int128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;

}  // namespace

NumpySeedSequence::NumpySeedSequence(const std::vector<uint64_t>& entropy) {
  // _coerce_to_uint32_array: each integer becomes its 32-bit words, least significant first;
  // the integer 0 is one word 0.
  std::vector<uint32_t> words;
  for (uint64_t x : entropy) {
    if (x == 0) words.push_back(0);
    while (x != 0) {
      words.push_back(static_cast<uint32_t>(x));
      x >>= 32;
    }
  }
  // mix_entropy.
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    pool_[i] = hashmix(static_cast<size_t>(i) < words.size() ? words[i] : 0u, hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < words.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) pool_[dst] = mix(pool_[dst], hashmix(words[src], hash_const));
  }
}

std::vector<uint32_t> NumpySeedSequence::generate_state_u32(size_t n_words) const {
  std::vector<uint32_t> out(n_words);
  uint32_t hash_const = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool_[i % kPoolSize];  // cycles over the pool
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

std::vector<uint64_t> NumpySeedSequence::generate_state_u64(size_t n_words) const {
  // The uint32 state viewed as little-endian uint64 pairs.
  const std::vector<uint32_t> w = generate_state_u32(2 * n_words);
  std::vector<uint64_t> out(n_words);
  for (size_t i = 0; i < n_words; ++i) out[i] = w[2 * i] | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  return out;
}

NumpyPcg64::NumpyPcg64(const NumpySeedSequence& seed) {
  // PCG64._seed_seq: s = generate_state(4, uint64); initstate = s[0]:s[1], initseq = s[2]:s[3]
  // (high:low), then pcg_setseq_128_srandom_r.
  const std::vector<uint64_t> s = seed.generate_state_u64(4);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(s[0]) << 64) | s[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(s[2]) << 64) | s[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  step();
  state_ += initstate;
  step();
}

void NumpyPcg64::step() { state_ = state_ * kPcgMult + inc_; }

uint64_t NumpyPcg64::next_uint64() {
  step();
  // XSL-RR: xor the halves, rotate right by the top 6 bits.
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

Result<std::vector<int64_t>> NumpyGenerator::integers(int64_t low, int64_t high, size_t count) {
  if (high <= low) {
    return invalid_argument("integers: high (" + std::to_string(high) + ") <= low (" + std::to_string(low) +
                            ")");
  }
  // _rand_int64 with endpoint=False: rng = (high - 1) - low as uint64, off = low.
  const uint64_t rng = static_cast<uint64_t>(high) - 1 - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  std::vector<int64_t> out(count);
  // random_bounded_uint64_fill with use_masked = false.
  for (size_t i = 0; i < count; ++i) {
    uint64_t v;
    if (rng == 0) {
      v = 0;  // no draw
    } else if (rng <= 0xFFFFFFFFULL) {
      if (rng == 0xFFFFFFFFULL) {
        v = bitgen_.next_uint32();
      } else {
        // Lemire on 32 bits.
        const uint32_t rng_excl = static_cast<uint32_t>(rng) + 1;
        uint64_t m = static_cast<uint64_t>(bitgen_.next_uint32()) * rng_excl;
        uint32_t leftover = static_cast<uint32_t>(m);
        if (leftover < rng_excl) {
          const uint32_t threshold = (UINT32_MAX - static_cast<uint32_t>(rng)) % rng_excl;
          while (leftover < threshold) {
            m = static_cast<uint64_t>(bitgen_.next_uint32()) * rng_excl;
            leftover = static_cast<uint32_t>(m);
          }
        }
        v = m >> 32;
      }
    } else if (rng == UINT64_MAX) {
      v = bitgen_.next_uint64();
    } else {
      // Lemire on 64 bits.
      const uint64_t rng_excl = rng + 1;
      unsigned __int128 m = static_cast<unsigned __int128>(bitgen_.next_uint64()) * rng_excl;
      uint64_t leftover = static_cast<uint64_t>(m);
      if (leftover < rng_excl) {
        const uint64_t threshold = (UINT64_MAX - rng) % rng_excl;
        while (leftover < threshold) {
          m = static_cast<unsigned __int128>(bitgen_.next_uint64()) * rng_excl;
          leftover = static_cast<uint64_t>(m);
        }
      }
      v = static_cast<uint64_t>(m >> 64);
    }
    out[i] = static_cast<int64_t>(off + v);
  }
  return out;
}

}  // namespace ds41::engram
