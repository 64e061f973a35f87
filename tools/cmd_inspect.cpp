// ds41 inspect DIR [--json] [--world N --parallel tp|dp]: config summary, the derived layer schedule (MODEL_SPEC 1.5), the
// tensor-contract check (every mismatch listed, MODEL_SPEC 2), parameter counts, global-KV bytes
// per token (5.3) and the bounded per-sequence state (5.4). Exit 0 when the checkpoint opens and
// matches its contract, 1 otherwise (the reason is printed, in JSON too with --json).
// JSON top-level keys: tensor_count, payload_bytes, global_kv_bytes_per_token, contract_ok, plus
// dir, errors, config, layer_schedule, contract, dtypes, params, kv_sources, bounded_state.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_format.h"
#include "cli_registry.h"
#include "forward_cli_util.h"
#include "model/config.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/loader/tensor_contract.h"
#include "model/memory_estimate.h"
#include "model/parallel_plan.h"
#include "model/model_summary.h"

namespace ds41::cli {
namespace {
namespace cmd_inspect {  // one name per file: the unity build of tools/ (CMakeLists.txt)

using ojson = nlohmann::ordered_json;

struct InspectArgs {
  std::string dir;
  bool json = false;
  size_t max_mismatches = 200;
  std::string memory_limit;  // --memory-limit
  int world = 0;              // --world: the parallel plan over this many GPUs (0: none)
  std::string parallel = "tp";  // --parallel tp|dp
};

ojson number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9e15) return static_cast<int64_t>(v);
  return v;
}

ojson config_json(const model::ModelConfig& c) {
  ojson j;
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["head_dim"] = c.head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["sliding_window"] = c.sliding_window;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["candidate_source_layer_id"] = c.candidate_source_layer_id;
  j["candidate_topk_blocks"] = c.candidate_topk_blocks;
  j["candidate_block_size"] = c.candidate_block_size;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["engram_layer_ids"] = c.engram_layer_ids;
  j["engram_num_embeddings"] = c.engram_num_embeddings;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["has_vision"] = c.has_vision;
  return j;
}

void print_config(const model::ModelConfig& c) {
  std::printf("config: %s, vocab %lld, hidden %lld, %lld layers + %lld DSpark stage(s)%s\n",
              c.model_type.c_str(), (long long)c.vocab_size, (long long)c.hidden_size,
              (long long)c.num_hidden_layers, (long long)c.num_nextn_predict_layers,
              c.has_vision ? ", vision tower" : "");
  std::printf("  attention: %lld heads x %lld (rope %lld), q_lora %lld, o %lld groups x %lld, window %lld\n",
              (long long)c.num_attention_heads, (long long)c.head_dim, (long long)c.qk_rope_head_dim,
              (long long)c.q_lora_rank, (long long)c.o_groups, (long long)c.o_lora_rank,
              (long long)c.sliding_window);
  std::printf(
      "  indexer: %lld heads x %lld, top-k %lld; candidate pool %lld blocks x %lld (source layer %lld)\n",
      (long long)c.index_n_heads, (long long)c.index_head_dim, (long long)c.index_topk,
      (long long)c.candidate_topk_blocks, (long long)c.candidate_block_size,
      (long long)c.candidate_source_layer_id);
  std::printf("  MoE: %lld routed experts, top-%lld, %lld shared, inter %lld\n",
              (long long)c.n_routed_experts, (long long)c.num_experts_per_tok, (long long)c.n_shared_experts,
              (long long)c.moe_intermediate_size);
  std::string e;
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
    e += (i ? ", " : "") + std::to_string(c.engram_layer_ids[i]) + " (" +
         (i < c.engram_num_embeddings.size() ? std::to_string(c.engram_num_embeddings[i]) : "?") + " rows)";
  std::printf("  Engram: layers %s; %lld heads x %lld, n-grams up to %lld\n", e.empty() ? "none" : e.c_str(),
              (long long)c.engram_n_heads, (long long)c.engram_head_dim, (long long)c.engram_max_ngram_size);
}

int run_inspect(const InspectArgs& a) {
  Result<uint64_t> memory_limit = parse_memory_limit(a.memory_limit);
  if (!memory_limit.ok()) {
    std::fprintf(stderr, "ds41 inspect: %s\n", memory_limit.status().message().c_str());
    return 2;
  }
  ojson out;
  out["tensor_count"] = nullptr;
  out["payload_bytes"] = nullptr;
  out["global_kv_bytes_per_token"] = nullptr;
  out["contract_ok"] = false;
  out["dir"] = a.dir;
  ojson errors = ojson::array();
  auto fail = [&](const std::string& msg) {
    errors.push_back(msg);
    out["errors"] = errors;
    if (a.json) std::cout << out.dump(2) << "\n";
    std::cerr << "ds41 inspect: " << msg << "\n";
    return 1;
  };

  auto cfg = model::load_model_config(a.dir);
  if (!cfg.ok()) return fail(cfg.status().message());
  const model::ModelConfig& c = *cfg;
  out["config"] = config_json(c);
  if (!a.json) print_config(c);
  auto sched = model::derive_layer_schedule(c);
  if (!sched.ok()) return fail(sched.status().message());
  ojson layers = ojson::array();
  for (const auto& p : sched->layers)
    layers.push_back({{"layer", p.layer},
                      {"ratio", p.ratio},
                      {"mode", model::attn_mode_name(p.mode)},
                      {"kv_owner", p.kv_owner},
                      {"idx_owner", p.idx_owner},
                      {"kv_source", p.kv_source},
                      {"index_source", p.index_source},
                      {"candidate_source", p.candidate_source},
                      {"candidate_restricted", p.candidate_restricted},
                      {"compressor_gate", p.has_gate},
                      {"engram", p.engram},
                      {"yarn_rope", p.yarn_rope}});
  out["layer_schedule"] = layers;
  if (!a.json) std::printf("\nlayer schedule (MODEL_SPEC 1.5):\n%s", sched->describe().c_str());
  auto contract = model::derive_tensor_contract(c, *sched);
  if (!contract.ok()) return fail(contract.status().message());
  model::ModelSummary sum = model::summarize_model(c, *sched, *contract);

  // Derived facts do not need the weights: report them even if the checkpoint is broken.
  ojson dt = ojson::object();
  for (auto& [d, t] : sum.by_dtype) dt[dtype_name(d)] = {{"tensors", t.count}, {"bytes", t.bytes}};
  out["dtypes_expected"] = dt;
  ojson params = ojson::object();
  for (auto& [g, n] : sum.params_by_group) params[model::param_group_name(g)] = n;
  params["total"] = sum.params_total;
  out["params"] = params;
  ojson srcs = ojson::array();
  for (auto& s : sum.kv_sources)
    srcs.push_back({{"layer", s.layer},
                    {"ratio", s.ratio},
                    {"kv_row_bytes", s.kv_row_bytes},
                    {"idx_row_bytes", s.idx_row_bytes},
                    {"bytes_per_token", number(s.bytes_per_token)}});
  out["kv_sources"] = srcs;
  out["global_kv_bytes_per_token"] = number(sum.global_kv_bytes_per_token);
  out["global_kv_bytes_at_max_context"] =
      number(std::round(sum.global_kv_bytes_per_token * static_cast<double>(c.max_position_embeddings)));
  const auto& b = sum.bounded;
  out["bounded_state"] = {{"window_row_bytes", b.window_row_bytes},
                          {"window_ring_bytes", b.window_ring_bytes},
                          {"window_ring_dspark_bytes", b.window_ring_stage_bytes},
                          {"half_pair_bytes", b.half_pair_bytes},
                          {"engram_lookback_ids", b.engram_lookback_ids},
                          {"total_bytes", b.total_bytes}};

  // The parallel plan (issue 14; model/parallel_plan.h): what each GPU of a node would hold.
  if (a.world > 0) {
    auto regime = model::parse_parallel_regime(a.parallel);
    if (!regime.ok()) return fail(regime.status().message());
    auto plan = model::plan_parallel(c, *contract, a.world, *regime);
    if (!plan.ok()) return fail(plan.status().message());
    ojson ranks = ojson::array();
    for (const auto& r : plan->ranks)
      ranks.push_back({{"rank", r.rank},
                       {"device_bytes", r.device_bytes},
                       {"replicated_bytes", r.replicated_bytes},
                       {"split_bytes", r.split_bytes},
                       {"expert_bytes", r.expert_bytes},
                       {"experts", {r.expert_begin, r.expert_end}},
                       {"heads", {r.head_begin, r.head_end}},
                       {"tensors", r.slices.size()}});
    out["parallel_plan"] = {{"world", plan->world},
                            {"parallel", model::parallel_regime_name(plan->regime)},
                            {"host_bytes", plan->host_bytes},
                            {"ranks", ranks}};
    if (!a.json) {
      std::printf("\nparallel plan (--parallel %s, %d GPUs): Engram tables in host memory %s (shared)\n",
                  model::parallel_regime_name(plan->regime), plan->world, model::format_gb(plan->host_bytes).c_str());
      for (const auto& r : plan->ranks)
        std::printf("  rank %d: %s = replicated %s + split %s + experts %lld..%lld %s; heads %lld..%lld\n", r.rank,
                    model::format_gb(r.device_bytes).c_str(), model::format_gb(r.replicated_bytes).c_str(),
                    model::format_gb(r.split_bytes).c_str(), (long long)r.expert_begin, (long long)r.expert_end - 1,
                    model::format_gb(r.expert_bytes).c_str(), (long long)r.head_begin, (long long)r.head_end - 1);
    }
  }

  auto ck = model::Checkpoint::open(a.dir);
  if (!ck.ok()) return fail(ck.status().message());
  model::ContractReport rep = model::check_checkpoint(**ck, *contract);
  out["tensor_count"] = (*ck)->tensors().size();
  out["payload_bytes"] = (*ck)->payload_bytes();
  out["contract_ok"] = rep.ok();
  out["shard_files"] = (*ck)->files().size();
  ojson mm = ojson::array();
  for (const auto& m : rep.mismatches)
    mm.push_back({{"kind", model::mismatch_kind_name(m.kind)},
                  {"tensor", m.tensor},
                  {"file", m.file},
                  {"expected", m.expected},
                  {"found", m.found}});
  out["contract"] = {{"expected_tensors", rep.expected_tensors},
                     {"found_tensors", rep.found_tensors},
                     {"matched_tensors", rep.matched_tensors},
                     {"expected_payload_bytes", sum.contract_payload_bytes},
                     {"mismatches", mm}};
  if (!rep.ok()) errors.push_back(rep.to_string(a.max_mismatches));
  out["errors"] = errors;
  // What loading it would need (the check generate/score/serve/chat make before loading).
  constexpr int64_t kEstimateContext = 4096;
  auto est = model::estimate_model_memory(a.dir, kEstimateContext);
  const uint64_t avail = available_memory_bytes(*memory_limit);
  if (est.ok())
    out["memory_estimate"] = {{"context_tokens", kEstimateContext},
                              {"weights_bytes", est->weights_bytes},
                              {"kv_bytes", est->kv_bytes},
                              {"workspace_bytes", est->workspace_bytes},
                              {"total_bytes", est->total()},
                              {"available_bytes", avail},
                              {"fits", avail == 0 || est->total() <= avail}};

  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("\ncheckpoint: %s: %zu shard file(s), %zu tensors, %s payload (%llu bytes)\n", a.dir.c_str(),
                (*ck)->files().size(), (*ck)->tensors().size(),
                human_bytes((*ck)->payload_bytes(), ByteUnits::kDecimal).c_str(),
                (unsigned long long)(*ck)->payload_bytes());
    std::printf("contract: %s\n", rep.to_string(a.max_mismatches).c_str());
    std::printf("\nby dtype (contract):\n");
    for (auto& [d, t] : sum.by_dtype)
      std::printf("  %-8s %8llu tensors %20llu bytes\n", dtype_name(d), (unsigned long long)t.count,
                  (unsigned long long)t.bytes);
    std::printf("parameters (logical elements):\n");
    for (auto& [g, n] : sum.params_by_group)
      std::printf("  %-15s %18llu (%.3f B)\n", model::param_group_name(g), (unsigned long long)n, n / 1e9);
    std::printf("  %-15s %18llu (%.3f B)\n", "total", (unsigned long long)sum.params_total,
                sum.params_total / 1e9);
    std::printf("global KV (MODEL_SPEC 5.3): %g bytes per token", sum.global_kv_bytes_per_token);
    for (auto& s : sum.kv_sources)
      std::printf("%s layer %lld: (%lld + %lld)/%lld", &s == &sum.kv_sources.front() ? " =" : " +",
                  (long long)s.layer, (long long)s.kv_row_bytes, (long long)s.idx_row_bytes,
                  (long long)s.ratio);
    std::printf(
        "\n  at max_position_embeddings (%lld tokens): %s per sequence\n",
        (long long)c.max_position_embeddings,
        human_bytes(sum.global_kv_bytes_per_token * c.max_position_embeddings, ByteUnits::kDecimal).c_str());
    std::printf("bounded per-sequence state (MODEL_SPEC 5.4): %lld bytes\n", (long long)b.total_bytes);
    std::printf(
        "  window rings %lld x %lld x %lld B = %lld (+ DSpark %lld), half pairs %lld, Engram look-back %lld "
        "ids\n",
        (long long)b.window_layers, (long long)c.sliding_window, (long long)b.window_row_bytes,
        (long long)b.window_ring_bytes, (long long)b.window_ring_stage_bytes, (long long)b.half_pair_bytes,
        (long long)b.engram_lookback_ids);
    if (est.ok())
      std::printf(
          "memory to load (%lld-token context): %s = weights %s + KV %s + workspaces %s; %s available%s\n",
          (long long)kEstimateContext, model::format_gb(est->total()).c_str(),
          model::format_gb(est->weights_bytes).c_str(), model::format_gb(est->kv_bytes).c_str(),
          model::format_gb(est->workspace_bytes).c_str(), model::format_gb(avail).c_str(),
          avail != 0 && est->total() > avail ? " (does not fit)" : "");
  }
  if (!rep.ok()) {
    std::cerr << "ds41 inspect: " << a.dir << ": tensor contract violated (" << rep.mismatches.size()
              << " mismatches)\n";
    return 1;
  }
  return 0;
}

void setup(CLI::App& parent, int& exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = parent.add_subcommand("inspect", "Summarize and validate a checkpoint directory");
  sub->add_option("dir", args->dir, "Checkpoint directory (config.json + safetensors)")->required();
  sub->add_flag("--json", args->json, "Machine-readable JSON on stdout");
  sub->add_option("--max-mismatches", args->max_mismatches,
                  "Mismatches listed in text output (JSON lists all)");
  sub->add_option("--memory-limit", args->memory_limit,
                  "Memory a load may use for the estimate (e.g. 20GB); default MemAvailable");
  sub->add_option("--world", args->world,
                  "Print the parallel plan over this many GPUs of a node (issue 14: per-rank bytes, experts, heads)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--parallel", args->parallel,
                  "With --world: tp (tensor-parallel attention, batch-1 latency; default) or dp (data-parallel "
                  "attention, throughput); routed experts are expert-parallel in both");
  sub->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}

}  // namespace cmd_inspect
}  // namespace
}  // namespace ds41::cli

DS41_REGISTER_COMMAND("inspect", ::ds41::cli::cmd_inspect::setup);
