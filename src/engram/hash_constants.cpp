// ds41 engram: primes, multipliers and offsets of MODEL_SPEC 3.2.2.
#include "engram/hash_constants.h"

#include <string>
#include <unordered_set>

#include "engram/numpy_rng.h"

namespace ds41::engram {

namespace {

uint64_t mul_mod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(a) * b % m);
}

uint64_t pow_mod(uint64_t a, uint64_t e, uint64_t m) {
  uint64_t r = 1;
  a %= m;
  while (e) {
    if (e & 1) r = mul_mod(r, a, m);
    a = mul_mod(a, a, m);
    e >>= 1;
  }
  return r;
}

}  // namespace

bool is_prime_u64(uint64_t n) {
  static constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  if (n < 2) return false;
  for (uint64_t p : kBases) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int s = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++s;
  }
  for (uint64_t a : kBases) {  // deterministic for n < 3.3e24
    uint64_t x = pow_mod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int r = 1; r < s; ++r) {
      x = mul_mod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

std::vector<int64_t> engram_primes(int n_layers, int n_orders, int n_heads, int64_t vocab_start) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n_layers) * n_orders * n_heads);
  std::unordered_set<int64_t> used;
  for (int l = 0; l < n_layers; ++l) {
    for (int o = 0; o < n_orders; ++o) {
      int64_t cur = vocab_start - 1;  // every order restarts its search at vocab_start
      for (int h = 0; h < n_heads; ++h) {
        ++cur;
        while (!is_prime_u64(static_cast<uint64_t>(cur)) || used.count(cur)) ++cur;
        used.insert(cur);
        out.push_back(cur);
      }
    }
  }
  return out;
}

Result<std::vector<int64_t>> engram_multipliers(const std::vector<int>& layer_ids, int max_ngram,
                                                int64_t compressed_vocab) {
  if (compressed_vocab < 1)
    return invalid_argument("engram multipliers: compressed vocabulary size must be >= 1");
  if (max_ngram < 1) return invalid_argument("engram multipliers: max_ngram must be >= 1");
  const int64_t bound = (INT64_MAX / compressed_vocab) / 2;
  if (bound < 1) {
    return invalid_argument("engram multipliers: compressed vocabulary " + std::to_string(compressed_vocab) +
                            " leaves no multiplier range");
  }
  std::vector<int64_t> out;
  for (int l : layer_ids) {
    if (l < 0) return invalid_argument("engram multipliers: layer id " + std::to_string(l) + " is negative");
    auto gen = NumpyGenerator::default_rng(uint64_t{10007} * static_cast<uint64_t>(l));
    DS41_ASSIGN_OR_RETURN(std::vector<int64_t> u, gen.integers(0, bound, static_cast<size_t>(max_ngram)));
    for (int64_t x : u) out.push_back(2 * x + 1);  // x < bound <= 2^62: no overflow
  }
  return out;
}

Result<EngramHashConstants> compute_engram_hash_constants(const EngramConfig& config) {
  DS41_RETURN_IF_ERROR(config.validate().with_context("engram hash constants"));
  EngramHashConstants c;
  c.n_layers = config.n_layers();
  c.max_ngram = config.max_ngram_size;
  c.n_orders = config.n_orders();
  c.n_heads = config.n_heads;
  c.n_cols = config.n_cols();
  c.layer_ids = config.layer_ids;
  DS41_ASSIGN_OR_RETURN(c.multipliers, engram_multipliers(config.layer_ids, config.max_ngram_size,
                                                          config.compressed_vocab_size));
  c.primes = engram_primes(c.n_layers, c.n_orders, c.n_heads, config.vocab_size);
  c.offsets.resize(c.primes.size());
  c.table_rows.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    int64_t sum = 0;
    for (int col = 0; col < c.n_cols; ++col) {
      const size_t k = static_cast<size_t>(l * c.n_cols + col);
      c.offsets[k] = sum;
      sum += c.primes[k];
    }
    c.table_rows[static_cast<size_t>(l)] = sum;
    if (sum != config.num_embeddings[static_cast<size_t>(l)]) {
      return failed_precondition("Engram layer " + std::to_string(config.layer_ids[static_cast<size_t>(l)]) +
                                 ": the " + std::to_string(c.n_cols) + " hash primes sum to " +
                                 std::to_string(sum) + " but engram_num_embeddings is " +
                                 std::to_string(config.num_embeddings[static_cast<size_t>(l)]) +
                                 " (MODEL_SPEC 3.2.2: wrong engram_vocab_size, n_heads or max_ngram_size)");
    }
  }
  return c;
}

}  // namespace ds41::engram
