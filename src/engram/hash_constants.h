// ds41 engram: per-layer hash constants of MODEL_SPEC 3.2.2 — multipliers a_{l,j}, prime moduli
// and row offsets — derived from an EngramConfig (never hard-coded), with the check that each
// layer's primes sum to engram_num_embeddings (MODEL_SPEC 7 item 14).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "engram/engram_config.h"

namespace ds41::engram {

// Deterministic Miller-Rabin for every uint64 (the bases of make_goldens.py's is_prime).
bool is_prime_u64(uint64_t n);

// make_goldens.py engram_primes: for each of n_layers layers and each of n_orders orders, search
// upward from vocab_start (strictly above vocab_start - 1) for the next n_heads primes not used
// before (one used set over all layers and orders). Flat [n_layers][n_orders][n_heads].
std::vector<int64_t> engram_primes(int n_layers, int n_orders, int n_heads, int64_t vocab_start);

// make_goldens.py engram_multipliers: for layer l, u = default_rng(10007*l).integers(0, bound,
// size=max_ngram, dtype=int64) with bound = ((2^63-1) // compressed_vocab) // 2, and a = 2u+1.
// Flat [n_layers][max_ngram]. InvalidArgument if bound < 1 or a seed is negative.
Result<std::vector<int64_t>> engram_multipliers(const std::vector<int>& layer_ids, int max_ngram,
                                                int64_t compressed_vocab);

struct EngramHashConstants {
  int n_layers = 0;
  int max_ngram = 0;  // look-back distances j = 0..max_ngram-1
  int n_orders = 0;   // n = 2..max_ngram
  int n_heads = 0;
  int n_cols = 0;  // n_orders * n_heads: columns (n = 2 heads 0..H-1, n = 3 ..., ...)
  std::vector<int> layer_ids;
  std::vector<int64_t> multipliers;  // [n_layers][max_ngram]
  std::vector<int64_t> primes;       // [n_layers][n_cols]
  std::vector<int64_t> offsets;      // [n_layers][n_cols], running sum of primes, 0 per layer
  std::vector<int64_t> table_rows;   // [n_layers], sum of the layer's primes

  int64_t multiplier(int layer, int j) const {
    return multipliers[static_cast<size_t>(layer * max_ngram + j)];
  }
  int64_t prime(int layer, int col) const { return primes[static_cast<size_t>(layer * n_cols + col)]; }
  int64_t offset(int layer, int col) const { return offsets[static_cast<size_t>(layer * n_cols + col)]; }
};

// Validates the config, computes everything, and fails with FailedPrecondition naming the layer
// if a prime sum differs from engram_num_embeddings.
Result<EngramHashConstants> compute_engram_hash_constants(const EngramConfig& config);

}  // namespace ds41::engram
