// ds41 engram: a bit-exact reimplementation of the parts of NumPy's random module that the
// Engram multipliers depend on (MODEL_SPEC 3.2.2, 7 item 14):
//   np.random.default_rng(seed)         -> SeedSequence(seed) -> PCG64
//   Generator.integers(low, high, ...)  for dtype=int64 (endpoint=False), the default
//                                          (Lemire, unmasked) bounded-integer path.
// Written from NumPy's documented algorithms (SeedSequence hash mixing with a 4-word pool,
// generate_state, PCG64 = 128-bit LCG with XSL-RR output, Lemire's nearly-divisionless
// bounded integers with the 32-bit path for ranges < 2^32) and checked against NumPy 1.24
// output in tests/unit/engram.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace ds41::engram {

// numpy.random.SeedSequence with no spawn key and the default pool size of 4.
class NumpySeedSequence {
 public:
  // entropy: a list of non-negative integers, each split into 32-bit words least significant
  // first (an int seed s is {s}; [s, 1] is {s, 1}; an empty list is not allowed).
  explicit NumpySeedSequence(const std::vector<uint64_t>& entropy);
  const uint32_t* pool() const { return pool_; }
  // generate_state(n_words, dtype=np.uint32) / (n_words, dtype=np.uint64).
  std::vector<uint32_t> generate_state_u32(size_t n_words) const;
  std::vector<uint64_t> generate_state_u64(size_t n_words) const;

  static constexpr int kPoolSize = 4;

 private:
  uint32_t pool_[kPoolSize];
};

// numpy.random.PCG64 (the XSL-RR 128/64 generator, including next_uint32's half-word buffer).
class NumpyPcg64 {
 public:
  explicit NumpyPcg64(const NumpySeedSequence& seed);
  // Raw state, high and low 64-bit halves (for tests against bit_generator.state).
  uint64_t state_hi() const { return static_cast<uint64_t>(state_ >> 64); }
  uint64_t state_lo() const { return static_cast<uint64_t>(state_); }
  uint64_t inc_hi() const { return static_cast<uint64_t>(inc_ >> 64); }
  uint64_t inc_lo() const { return static_cast<uint64_t>(inc_); }

  uint64_t next_uint64();  // random_raw()
  uint32_t next_uint32();  // low half of a fresh 64-bit draw, then its high half

 private:
  void step();
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// numpy.random.Generator restricted to integers(..., dtype=np.int64).
class NumpyGenerator {
 public:
  explicit NumpyGenerator(const NumpySeedSequence& seed) : bitgen_(seed) {}
  // np.random.default_rng(seed) for a non-negative int seed.
  static NumpyGenerator default_rng(uint64_t seed) { return NumpyGenerator(NumpySeedSequence({seed})); }

  // Generator.integers(low, high, size=count, dtype=np.int64) with endpoint=False.
  // InvalidArgument if high <= low (NumPy raises "high <= low").
  Result<std::vector<int64_t>> integers(int64_t low, int64_t high, size_t count);

  NumpyPcg64& bit_generator() { return bitgen_; }

 private:
  NumpyPcg64 bitgen_;
};

}  // namespace ds41::engram
