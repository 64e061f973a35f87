// ds41 model: the parallel plan (parallel_plan.h).
#include "model/parallel_plan.h"

#include <cstdlib>

namespace ds41::model {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "layers.7.ffn.experts.12.w1" -> 12 (and whether it is a DSpark stage's); -1 when not an expert.
int64_t routed_expert_of(const std::string& name, bool* dspark) {
  const std::string key = ".ffn.experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  *dspark = name.rfind("mtp.", 0) == 0;
  return std::strtoll(name.c_str() + at + key.size(), nullptr, 10);
}

enum class Split { kReplicate, kRows, kCols };

// How kTensorAttention splits a param (MODEL_SPEC 2.3 names; the DSpark stages' blocks alike).
Split tensor_attention_split(const std::string& p) {
  if (ends_with(p, ".attn.wq_b") && p.find(".indexer.") == std::string::npos) return Split::kRows;
  if (ends_with(p, ".attn.wo_a") || ends_with(p, ".attn.attn_sink")) return Split::kRows;
  if (ends_with(p, ".attn.wo_b")) return Split::kCols;
  if (ends_with(p, ".ffn.shared_experts.w1") || ends_with(p, ".ffn.shared_experts.w3")) return Split::kRows;
  if (ends_with(p, ".ffn.shared_experts.w2")) return Split::kCols;
  if (p == "head.weight") return Split::kRows;
  return Split::kReplicate;
}

}  // namespace

const char* parallel_regime_name(ParallelRegime r) {
  return r == ParallelRegime::kTensorAttention ? "tp" : "dp";
}

Result<ParallelRegime> parse_parallel_regime(const std::string& s) {
  if (s == "tp") return ParallelRegime::kTensorAttention;
  if (s == "dp") return ParallelRegime::kDataAttention;
  return invalid_argument("--parallel is '" + s +
                          "'; expected tp (tensor-parallel attention, batch-1 latency) or dp "
                          "(data-parallel attention, throughput); routed experts are expert-parallel in both");
}

Result<ParallelPlan> plan_parallel(const ModelConfig& c, const TensorContract& contract, int world,
                                   ParallelRegime regime) {
  if (world < 1 || world > 1024) return invalid_argument("world size " + std::to_string(world) + " is not in 1..1024");
  const std::string w = std::to_string(world);
  auto need = [&](bool ok, const std::string& what) -> Status {
    return ok ? ok_status() : invalid_argument(what + " is not divisible by the world size " + w);
  };
  const int64_t H = c.num_attention_heads, hd = c.head_dim, shared = c.moe_intermediate_size * c.n_shared_experts;
  DS41_RETURN_IF_ERROR(need(c.n_routed_experts % world == 0,
                            "n_routed_experts (" + std::to_string(c.n_routed_experts) + ", expert parallelism)"));
  if (c.num_nextn_predict_layers > 0)
    DS41_RETURN_IF_ERROR(need(c.dspark_n_routed_experts % world == 0,
                              "dspark_n_routed_experts (" + std::to_string(c.dspark_n_routed_experts) + ")"));
  const bool tp = regime == ParallelRegime::kTensorAttention;
  if (tp && world > 1) {
    DS41_RETURN_IF_ERROR(need(H % world == 0, "num_attention_heads (" + std::to_string(H) + ", --parallel tp)"));
    DS41_RETURN_IF_ERROR(need(c.o_groups % world == 0, "o_groups (" + std::to_string(c.o_groups) + ", --parallel tp)"));
    DS41_RETURN_IF_ERROR(need(c.vocab_size % world == 0, "vocab_size (" + std::to_string(c.vocab_size) + ", the head's rows)"));
    auto tiles = [&](int64_t n, const std::string& what) -> Status {
      if (n % world == 0 && (n / world) % 32 == 0) return ok_status();
      return invalid_argument(what + " (" + std::to_string(n) + ") split over " + w +
                              " ranks does not fall on the 32-wide FP8 scale tiles (--parallel tp)");
    };
    DS41_RETURN_IF_ERROR(tiles(H * hd, "num_attention_heads * head_dim"));
    DS41_RETURN_IF_ERROR(tiles(c.o_groups * c.o_lora_rank, "o_groups * o_lora_rank"));
    if (shared > 0) DS41_RETURN_IF_ERROR(tiles(shared, "the shared expert's intermediate size"));
  }

  ParallelPlan plan;
  plan.world = world;
  plan.regime = regime;
  plan.checkpoint_bytes = contract.payload_bytes();
  plan.ranks.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    RankPlan& rp = plan.ranks[static_cast<size_t>(r)];
    rp.rank = r;
    rp.expert_begin = c.n_routed_experts / world * r;
    rp.expert_end = c.n_routed_experts / world * (r + 1);
    rp.head_begin = tp ? H / world * r : 0;
    rp.head_end = tp ? H / world * (r + 1) : H;
  }
  for (size_t ti = 0; ti < contract.tensors.size(); ++ti) {
    const ExpectedTensor& t = contract.tensors[ti];
    const ContractParam& p = contract.params[static_cast<size_t>(t.param)];
    if (p.format == ParamFormat::kEngramTable) {  // host memory, shared by the node's ranks
      plan.host_bytes += t.nbytes();
      continue;
    }
    bool dspark = false;
    const int64_t e = routed_expert_of(p.name, &dspark);
    if (e >= 0) {
      const int64_t n = dspark ? c.dspark_n_routed_experts : c.n_routed_experts;
      const int owner = static_cast<int>(e / (n / world));
      RankPlan& rp = plan.ranks[static_cast<size_t>(owner)];
      rp.slices.push_back({static_cast<int32_t>(ti), TensorSlice::Axis::kWhole, 0, 0, t.nbytes()});
      rp.expert_bytes += t.nbytes();
      continue;
    }
    const Split split = tp && world > 1 ? tensor_attention_split(p.name) : Split::kReplicate;
    if (split == Split::kReplicate) {
      for (RankPlan& rp : plan.ranks) {
        rp.slices.push_back({static_cast<int32_t>(ti), TensorSlice::Axis::kWhole, 0, 0, t.nbytes()});
        rp.replicated_bytes += t.nbytes();
      }
      continue;
    }
    const size_t axis = split == Split::kRows ? 0 : 1;
    if (t.shape.size() <= axis)
      return internal_error("parallel plan: " + t.name + " has no dimension " + std::to_string(axis) + " to split");
    const int64_t dim = t.shape[axis];
    if (dim % world != 0)
      return invalid_argument("parallel plan: " + t.name + " dimension " + std::to_string(axis) + " (" +
                              std::to_string(dim) + ") is not divisible by the world size " + w);
    const int64_t part = dim / world;
    for (RankPlan& rp : plan.ranks) {
      const uint64_t bytes = t.nbytes() / static_cast<uint64_t>(world);
      rp.slices.push_back({static_cast<int32_t>(ti),
                           split == Split::kRows ? TensorSlice::Axis::kRows : TensorSlice::Axis::kCols,
                           part * rp.rank, part * (rp.rank + 1), bytes});
      rp.split_bytes += bytes;
    }
  }
  for (RankPlan& rp : plan.ranks) rp.device_bytes = rp.replicated_bytes + rp.split_bytes + rp.expert_bytes;
  return plan;
}

}  // namespace ds41::model
