// ds41 model: config checks and the Engram hasher shared by the CPU and GPU loaders.
#include "model/model_setup.h"

#include <filesystem>

#include "engram/compressed_vocab.h"
#include "engram/hash_constants.h"

namespace ds41::model {

Status check_model_config_supported(const ModelConfig& c, const std::string& where) {
  if (c.num_key_value_heads != 1)
    return invalid_argument(where + ": num_key_value_heads " + std::to_string(c.num_key_value_heads) +
                            " (V4.1 uses one shared K=V latent)");
  if ((c.num_attention_heads * c.head_dim) % c.o_groups != 0)
    return invalid_argument(where + ": heads * head_dim not divisible by o_groups");
  if (c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim > c.head_dim || c.qk_rope_head_dim > c.index_head_dim)
    return invalid_argument(where + ": qk_rope_head_dim " + std::to_string(c.qk_rope_head_dim) +
                            " must be even and fit head_dim and index_head_dim");
  return ok_status();
}

Result<std::unique_ptr<engram::EngramHasher>> make_engram_hasher(const ModelConfig& c,
                                                                 const std::string& model_dir,
                                                                 const std::string& tokenizer_dir) {
  if (c.engram_layer_ids.empty()) return std::unique_ptr<engram::EngramHasher>();
  engram::EngramConfig ec;
  for (int64_t l : c.engram_layer_ids) ec.layer_ids.push_back(static_cast<int>(l));
  ec.num_embeddings = c.engram_num_embeddings;
  ec.max_ngram_size = static_cast<int>(c.engram_max_ngram_size);
  ec.n_heads = static_cast<int>(c.engram_n_heads);
  ec.head_dim = static_cast<int>(c.engram_head_dim);
  ec.vocab_size = c.engram_vocab_size;
  ec.compressed_vocab_size = c.engram_compressed_vocab_size;
  ec.pad_token_id = static_cast<int32_t>(c.engram_pad_token_id);
  DS41_ASSIGN_OR_RETURN(auto consts, engram::compute_engram_hash_constants(ec));
  // tokenizer_dir: a folder holding tokenizer.json, or the file itself.
  std::string tok = (tokenizer_dir.empty() ? model_dir : tokenizer_dir);
  if (!std::filesystem::is_regular_file(tok)) tok += "/tokenizer.json";
  if (!std::filesystem::exists(tok))
    return not_found(tok +
                     ": missing — the config has Engram layers, whose compressed vocabulary comes from the "
                     "tokenizer (pass --tokenizer DIR)");
  DS41_ASSIGN_OR_RETURN(auto vocab, engram::load_compressed_vocab(tok, c.engram_compressed_vocab_size));
  if (static_cast<int64_t>(vocab.map.size()) < c.vocab_size)
    return invalid_argument(tok + ": " + std::to_string(vocab.map.size()) + " token ids, the model has " +
                            std::to_string(c.vocab_size));
  DS41_ASSIGN_OR_RETURN(auto h,
                        engram::EngramHasher::create(std::move(consts), std::move(vocab), ec.pad_token_id));
  return std::make_unique<engram::EngramHasher>(std::move(h));
}

}  // namespace ds41::model
