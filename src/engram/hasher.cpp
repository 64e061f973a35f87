// ds41 engram: incremental hash-id computation of MODEL_SPEC 3.2.3.
#include "engram/hasher.h"

#include <algorithm>
#include <climits>
#include <string>

namespace ds41::engram {

Result<EngramHasher> EngramHasher::create(EngramHashConstants c, CompressedVocab v, int32_t pad_token_id) {
  if (c.max_ngram < 2 || c.max_ngram > EngramConfig::kMaxNgram || c.n_orders != c.max_ngram - 1 ||
      c.n_heads < 1 || c.n_cols != c.n_orders * c.n_heads || c.n_layers < 0 ||
      c.multipliers.size() != static_cast<size_t>(c.n_layers) * c.max_ngram ||
      c.primes.size() != static_cast<size_t>(c.n_layers) * c.n_cols || c.offsets.size() != c.primes.size() ||
      c.table_rows.size() != static_cast<size_t>(c.n_layers)) {
    return invalid_argument(
        "EngramHasher: inconsistent hash constants (build them with compute_engram_hash_constants)");
  }
  for (int64_t rows : c.table_rows) {
    if (rows < 1 || rows > INT32_MAX) {
      return out_of_range("EngramHasher: table of " + std::to_string(rows) +
                          " rows does not fit int32 row ids");
    }
  }
  for (int64_t p : c.primes) {
    if (p < 2) return invalid_argument("EngramHasher: prime modulus " + std::to_string(p) + " < 2");
  }
  if (pad_token_id < 0 || static_cast<size_t>(pad_token_id) >= v.map.size()) {
    return out_of_range("EngramHasher: pad token id " + std::to_string(pad_token_id) +
                        " is outside the compressed map of " + std::to_string(v.map.size()) + " ids");
  }
  int32_t max_c = 0;
  for (int32_t x : v.map) {
    if (x < 0) return invalid_argument("EngramHasher: negative compressed id in the map");
    max_c = std::max(max_c, x);
  }
  // MODEL_SPEC 3.2.3: with t < compressed vocab and a < 2^63 / compressed vocab no product
  // overflows, and every XOR of non-negative values is non-negative, so the int64 modulo
  // of the reference equals the unsigned one used below. Make sure this holds for this map.
  for (int64_t a : c.multipliers) {
    if (a <= 0 || static_cast<unsigned __int128>(max_c) * static_cast<uint64_t>(a) > INT64_MAX) {
      return invalid_argument("EngramHasher: multiplier " + std::to_string(a) + " times compressed id " +
                              std::to_string(max_c) + " overflows int64 (map does not match the config)");
    }
  }
  const int32_t pad = v.map[static_cast<size_t>(pad_token_id)];
  return EngramHasher(std::move(c), std::move(v), pad);
}

Status EngramHasher::append(EngramHashState& state, std::span<const int32_t> ids,
                            std::span<const uint8_t> dead, std::span<int32_t> out) const {
  const size_t n = ids.size();
  if (!dead.empty() && dead.size() != n) {
    return invalid_argument("Engram hash: " + std::to_string(dead.size()) + " DEAD flags for " +
                            std::to_string(n) + " tokens");
  }
  const size_t per = static_cast<size_t>(ids_per_token());
  if (!out.empty() && out.size() != n * per) {
    return invalid_argument("Engram hash: output holds " + std::to_string(out.size()) + " ids, expected " +
                            std::to_string(n * per));
  }
  for (size_t i = 0; i < n; ++i) {  // validate everything before touching the state
    if (!dead.empty() && dead[i]) continue;
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= vocab_.map.size()) {
      return out_of_range("Engram hash: token id " + std::to_string(ids[i]) + " at chunk index " +
                          std::to_string(i) + " is outside the vocabulary of " +
                          std::to_string(vocab_.map.size()));
    }
  }

  const int m = c_.max_ngram;
  std::array<uint64_t, EngramConfig::kMaxNgram> t{};
  for (size_t i = 0; i < n; ++i) {
    const bool is_dead = !dead.empty() && dead[i];
    const int32_t c0 = is_dead ? EngramHashState::kDead : vocab_.map[static_cast<size_t>(ids[i])];
    if (!out.empty()) {
      const int64_t p = state.length;
      // t_j, j increasing, with the sticky blocked flag.
      bool blocked = false;
      for (int j = 0; j < m; ++j) {
        int32_t cid = EngramHashState::kDead;
        if (p - j >= 0) cid = j == 0 ? c0 : state.recent[static_cast<size_t>(j - 1)];
        blocked = blocked || p - j < 0 || cid == EngramHashState::kDead;
        t[static_cast<size_t>(j)] = static_cast<uint64_t>(blocked ? pad_ : cid);
      }
      int32_t* o = out.data() + i * per;
      for (int l = 0; l < c_.n_layers; ++l) {
        const int64_t* a = c_.multipliers.data() + static_cast<size_t>(l) * m;
        const int64_t* pr = c_.primes.data() + static_cast<size_t>(l) * c_.n_cols;
        const int64_t* off = c_.offsets.data() + static_cast<size_t>(l) * c_.n_cols;
        uint64_t r = t[0] * static_cast<uint64_t>(a[0]);
        int col = 0;
        for (int k = 1; k < m; ++k) {  // order n = k + 1
          r ^= t[static_cast<size_t>(k)] * static_cast<uint64_t>(a[k]);
          for (int h = 0; h < c_.n_heads; ++h, ++col) {
            o[l * c_.n_cols + col] =
                static_cast<int32_t>(r % static_cast<uint64_t>(pr[col]) + static_cast<uint64_t>(off[col]));
          }
        }
      }
    }
    for (int k = m - 2; k > 0; --k)
      state.recent[static_cast<size_t>(k)] = state.recent[static_cast<size_t>(k - 1)];
    state.recent[0] = c0;
    ++state.length;
  }
  return ok_status();
}

Result<std::vector<int32_t>> EngramHasher::hash_ids(std::span<const int32_t> ids,
                                                    std::span<const uint8_t> dead) const {
  std::vector<int32_t> out(ids.size() * static_cast<size_t>(ids_per_token()));
  EngramHashState st = new_state();
  DS41_RETURN_IF_ERROR(append(st, ids, dead, out));
  return out;
}

Result<EngramHasher> make_engram_hasher(const EngramConfig& config, const text::TokenizerVocab& vocab) {
  DS41_ASSIGN_OR_RETURN(EngramHashConstants constants, compute_engram_hash_constants(config));
  DS41_ASSIGN_OR_RETURN(CompressedVocab cv,
                        build_compressed_vocab_checked(vocab, config.compressed_vocab_size));
  return EngramHasher::create(std::move(constants), std::move(cv), config.pad_token_id);
}

Result<EngramHasher> make_engram_hasher(const EngramConfig& config, const std::string& tokenizer_json_path) {
  DS41_ASSIGN_OR_RETURN(EngramHashConstants constants, compute_engram_hash_constants(config));
  DS41_ASSIGN_OR_RETURN(CompressedVocab cv,
                        load_compressed_vocab(tokenizer_json_path, config.compressed_vocab_size));
  return EngramHasher::create(std::move(constants), std::move(cv), config.pad_token_id);
}

}  // namespace ds41::engram
