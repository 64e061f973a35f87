// ds41 model: binding the DSpark stages' tensors (MODEL_SPEC 3.10.1).
#include "model/dspark_weights.h"

#include "model/weight_binder.h"

namespace ds41::model {

Result<std::unique_ptr<DsparkWeights>> bind_dspark_weights(const Checkpoint& ck, const ModelConfig& c) {
  const int64_t n = c.num_nextn_predict_layers, H = c.hidden_size, V = c.vocab_size, R = c.dspark_markov_rank;
  const int64_t nt = static_cast<int64_t>(c.dspark_target_layer_ids.size());
  if (n <= 0) return invalid_argument("bind_dspark_weights: the config has no DSpark stages");
  std::vector<std::string> cfg_errors;
  if (c.dspark_n_routed_experts <= 0) cfg_errors.push_back("dspark_n_routed_experts must be positive");
  if (c.dspark_num_experts_per_tok <= 0 || c.dspark_num_experts_per_tok > c.dspark_n_routed_experts)
    cfg_errors.push_back("dspark_num_experts_per_tok must lie in [1, dspark_n_routed_experts]");
  if (R <= 0) cfg_errors.push_back("dspark_markov_rank must be positive");
  if (c.dspark_block_size <= 0) cfg_errors.push_back("dspark_block_size must be positive");
  if (nt == 0) cfg_errors.push_back("dspark_target_layer_ids must not be empty");
  for (int64_t l : c.dspark_target_layer_ids)
    if (l < 0 || l >= c.num_hidden_layers)
      cfg_errors.push_back("dspark_target_layer_ids holds " + std::to_string(l) + ", outside [0, " +
                           std::to_string(c.num_hidden_layers) + ")");
  if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= V)
    cfg_errors.push_back("dspark_noise_token_id " + std::to_string(c.dspark_noise_token_id) +
                         " lies outside the vocabulary [0, " + std::to_string(V) + ")");
  const int64_t nl = c.num_hidden_layers;
  for (int64_t s = 0; s < n; ++s)
    if (nl + s < static_cast<int64_t>(c.compress_ratios.size()) && c.compress_ratios[nl + s] != 0)
      cfg_errors.push_back("compress_ratios[" + std::to_string(nl + s) + "] (DSpark stage " +
                           std::to_string(s) + ") must be 0: the stages are window-only blocks");
  if (!cfg_errors.empty()) {
    std::string m = "config.json: DSpark settings (MODEL_SPEC 3.10.1):";
    for (auto& e : cfg_errors) m += "\n  " + e;
    return invalid_argument(m);
  }
  WeightBinder b(ck);
  auto w = std::make_unique<DsparkWeights>();
  LayerPlan plan;  // MODEL_SPEC 3.10.1: the stages count as ratio-0 layers n..n+2
  for (int64_t s = 0; s < n; ++s) {
    plan.layer = nl + s;
    w->stages.push_back(
        bind_layer_weights(b, c, "mtp." + std::to_string(s) + ".", plan, c.dspark_n_routed_experts));
  }
  w->main_proj = b.linear("mtp.0.main_proj", H, nt * H);
  w->main_norm = b.vec("mtp.0.main_norm.weight", H, DType::kBF16);
  const std::string last = "mtp." + std::to_string(n - 1) + ".";
  w->norm = b.vec(last + "norm.weight", H, DType::kBF16);
  if (const TensorRef* t = b.get(last + "markov_head.embed.weight", DType::kBF16, {V, R}))
    w->markov_embed = t->data;
  w->markov_head = b.linear(last + "markov_head.head", V, R);
  w->confidence_proj = b.linear(last + "confidence_head.proj", 1, H + R);
  if (!b.errors.empty()) {
    std::string m = ck.dir() + ": DSpark stages do not match config.json (" +
                    std::to_string(b.errors.size()) + " problems):";
    for (auto& e : b.errors) m += "\n  " + e;
    return invalid_argument(m);
  }
  w->names_.swap(b.names());
  return w;
}

}  // namespace ds41::model
