// ds41 bench decode / ds41 bench prefill: the GPU engine's step time per layer kind (issue 10
// "Benchmarks"), on --model DIR or a preset with --load-format dummy (weights generated on the
// device, e.g. --preset v41-flash-slice: the released widths). Prints one JSON object:
//   decode:  per (batch, context): median step ms, per layer ms and per layer kind ms, the bytes
//            a step must read per layer (weights touched: dense + shared + the routed experts
//            expected to be selected; window rows, selected compressed rows and index keys read),
//            the HBM bandwidth measured by a device-to-device copy in the same run, and
//            roofline = time / (bytes / bandwidth) per layer and per kind;
//   prefill: tokens/s for one sequence of --context tokens in chunks, per layer kind ms.
// The context is built by real prefill (v1; the speed issue may synthesize it in the pools).
// Needs a build with the GPU engine (DS41_HAVE_CUDA_ENGINE); otherwise a clear error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "bench_header.h"
#include "cli_registry.h"
#include "engine_factory.h"
#include "kind_projection.h"

#ifdef DS41_HAVE_CUDA_ENGINE
#include <cublas_v2.h>
#include <cuda_profiler_api.h>

#include "backends/cuda/bench_support.h"
#include "backends/cuda/cublas_lazy.h"
#include "backends/cuda/cuda_status.h"
#include "engine/speculative.h"
#include "gpu/cuda_engine.h"
#include "model/decoder_replay_plan.h"
#include "model/presets.h"
#include "gpu/device_buffer.h"
#endif

namespace ds41::cli {
namespace {
namespace cmd_bench_gpu {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct GpuBenchArgs {
  std::string model_dir, preset, tokenizer_dir, load_format = "dummy", batches = "1", contexts = "4096";
  std::string device = "cuda";
  std::string speculative = "off";  // decode: off | dspark
  std::string prefill_modes = "exact";  // prefill: exact and / or decoder-replay, comma-separated
  std::string project_to = "v41-flash";  // the preset whose layer schedule the per-kind numbers project to
  std::string numerics = "exact";        // --numerics: exact | fp8-act (quant/act_quant.h)
  int64_t steps = 8, chunk = 2048;
  uint64_t seed = 1;
  bool engram_host_pinned = false;
};

Result<std::vector<int64_t>> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      v.push_back(std::stoll(item));
    } catch (...) {
      return invalid_argument(std::string(flag) + ": '" + item + "' is not an integer");
    }
    if (v.back() < 1) return invalid_argument(std::string(flag) + " values must be >= 1");
  }
  if (v.empty()) return invalid_argument(std::string(flag) + " is empty");
  return v;
}

#ifdef DS41_HAVE_CUDA_ENGINE

// Device bytes of a weight in its checkpoint format (payload + E8M0 scales, MODEL_SPEC 2.1).
int64_t weight_bytes(const cuda::DeviceWeight& w) {
  const int64_t o = w.out_dim, i = w.in_dim;
  switch (w.format) {
    case quant::WeightFormat::kF32: return 4 * o * i;
    case quant::WeightFormat::kBF16: return 2 * o * i;
    case quant::WeightFormat::kFp8Tiles: return o * i + ((o + 31) / 32) * ((i + 31) / 32);
    case quant::WeightFormat::kFp4Rows: return o * i / 2 + o * ((i + 31) / 32);
    default: return 0;
  }
}

// A block's dense weights (attention projections, compressor, indexer, router, shared expert,
// Engram projection) in their checkpoint formats.
double dense_weight_bytes(const gpu::DeviceLayer& w) {
  double dense = 0;
  for (const cuda::DeviceWeight* x :
       {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_a, &w.wo_b, &w.c_wkv, &w.c_wgate, &w.idx_wk, &w.idx_wq_b,
        &w.idx_weights_proj, &w.gate, &w.shared.w1, &w.shared.w2, &w.shared.w3})
    dense += static_cast<double>(weight_bytes(*x));
  if (w.engram) dense += static_cast<double>(weight_bytes(w.engram->wkv));
  return dense;
}

// FLOPs per token of a block's linears in one pass (2 x the weight elements a token multiplies: the
// dense linears of dense_weight_bytes and num_experts_per_tok routed experts; PERF_NOTES 3's count).
// The exact prefill runs each FP8 / FP4 linear as x_parts BF16 products (DS41_TC_SPLIT, default 3).
double layer_gemm_flops_per_token(const gpu::DeviceLayer& w, const model::ModelConfig& c) {
  auto el = [](const cuda::DeviceWeight& x) { return static_cast<double>(x.out_dim) * static_cast<double>(x.in_dim); };
  double e = 0;
  for (const cuda::DeviceWeight* x :
       {&w.wq_a, &w.wq_b, &w.wkv, &w.wo_a, &w.wo_b, &w.c_wkv, &w.c_wgate, &w.idx_wk, &w.idx_wq_b,
        &w.idx_weights_proj, &w.gate, &w.shared.w1, &w.shared.w2, &w.shared.w3})
    e += el(*x);
  if (w.engram) e += el(w.engram->wkv);
  if (!w.experts.empty())
    e += static_cast<double>(c.num_experts_per_tok) *
         (el(w.experts[0].w1) + el(w.experts[0].w2) + el(w.experts[0].w3));
  return 2.0 * e;
}

// The dense tensor-core rate (FLOP/s) measured in the same run (issue 10: prefill tokens/s "and its
// ratio to the dense tensor-core rate"): cuBLAS BF16 GEMM m = n = k = 8192 with fp32 accumulation
// and output, the best of 5 after a warm-up.
Result<double> dense_tc_rate() {
  if (!cuda::cublas_available()) return failed_precondition("dense tensor-core probe: " + cuda::cublas_load_error());
  constexpr int64_t n = 8192;
  DS41_ASSIGN_OR_RETURN(gpu::DeviceBuffer a, gpu::DeviceBuffer::allocate(n * n * 2, "tensor-core probe"));
  DS41_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, gpu::DeviceBuffer::allocate(n * n * 2, "tensor-core probe"));
  DS41_ASSIGN_OR_RETURN(gpu::DeviceBuffer o, gpu::DeviceBuffer::allocate(n * n * 4, "tensor-core probe"));
  DS41_RETURN_IF_ERROR(cuda::run_fill_uniform_bf16(static_cast<uint16_t*>(a.data()), n * n, 1, 1.0f, nullptr));
  DS41_RETURN_IF_ERROR(cuda::run_fill_uniform_bf16(static_cast<uint16_t*>(b.data()), n * n, 2, 1.0f, nullptr));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return internal_error("dense tensor-core probe: cublasCreate failed");
  const float alpha = 1.0f, beta = 0.0f;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
  for (int r = 0; r < 6 && bs == CUBLAS_STATUS_SUCCESS; ++r) {
    cudaEventRecord(e0);
    bs = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), CUDA_R_16BF, n, b.data(), CUDA_R_16BF,
                      n, &beta, o.data(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(e1);
    if (cudaEventSynchronize(e1) != cudaSuccess) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0) best = std::min(best, ms);  // r = 0: the warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasDestroy(h);
  if (bs != CUBLAS_STATUS_SUCCESS)
    return internal_error("dense tensor-core probe: cublasGemmEx status " + std::to_string(static_cast<int>(bs)));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaGetLastError(), "dense tensor-core probe"));
  return 2.0 * static_cast<double>(n) * n * n / (best * 1e-3);
}

// Routed experts (w.experts non-empty): the expected number of distinct experts among rows * k draws
// of E, times one expert's bytes.
double routed_expert_bytes(const gpu::DeviceLayer& w, double rows, double E, double k) {
  const double touched = E * (1.0 - std::pow(1.0 - k / E, rows));
  return touched * static_cast<double>(weight_bytes(w.experts[0].w1) + weight_bytes(w.experts[0].w2) +
                                       weight_bytes(w.experts[0].w3));
}

// Bytes one decode step must read in layer l for `batch` sequences at `context` tokens.
std::map<std::string, double> decode_bytes(const gpu::DeviceModel& m, int64_t l, int64_t batch,
                                           int64_t context) {
  const model::ModelConfig& c = m.config();
  const model::LayerPlan& p = m.schedule().layers[l];
  const gpu::DeviceLayer& w = m.weights().layers[l];
  const model::KvLayout& kv = m.kv_layout();
  std::map<std::string, double> b;
  b["dense_weights"] = dense_weight_bytes(w);
  if (!w.experts.empty())
    b["routed_experts"] = routed_expert_bytes(w, static_cast<double>(batch), static_cast<double>(c.n_routed_experts),
                                              static_cast<double>(c.num_experts_per_tok));
  b["window_rows"] = static_cast<double>(batch * std::min(c.sliding_window, context) * kv.window_row_bytes);
  if (p.ratio > 0) {
    const int64_t entries = context / p.ratio;
    const int64_t kvb = kv.sources.empty() ? 0 : kv.sources[0].kv_row_bytes;
    const int64_t keyb = kv.sources.empty() ? 0 : kv.sources[0].key_row_bytes;
    b["selected_entries"] = static_cast<double>(batch * std::min(entries, c.index_topk) * kvb);
    if (p.index_source) b["index_keys"] = static_cast<double>(batch * entries * keyb);
  }
  if (c.is_engram_layer(l) && m.hasher())
    b["engram_rows"] =
        static_cast<double>(batch * m.hasher()->n_cols() * (c.engram_head_dim + c.engram_head_dim / 32));
  return b;
}

// Bytes of the weights a block reads for `rows` rows: the dense ones and the routed experts'.
double block_weight_bytes(const gpu::DeviceLayer& w, double rows, double E, double k) {
  return dense_weight_bytes(w) + (w.experts.empty() || E <= 0 ? 0.0 : routed_expert_bytes(w, rows, E, k));
}

// The HBM floor of DSpark's two costs against a plain step's (issue 17's targets: a draft <= 15 %
// of a plain batch-1 step, a 6-row verification <= 1.3x), from the bytes each must read: a plain
// step (one row: every layer of decode_bytes, the head), a verification (the B + 1 rows of one
// sequence: decode_bytes at B + 1 rows, so the routed experts are the distinct ones of (B + 1) x k
// draws, and the head once), a draft (the three stages at B rows, B x k_d draws of E_d experts each,
// the head and the Markov factors once). Also the same for the 40-layer model, the slice's layers
// scaled by released_layers / slice layers (the draft does not change).
nlohmann::ordered_json speculative_floor(const gpu::DeviceModel& m, int64_t context, double bw, double plain_ms,
                                         double draft_ms, double verify_ms, int64_t released_layers) {
  const model::ModelConfig& c = m.config();
  const int64_t L = c.num_hidden_layers, Bd = c.dspark_block_size;
  double plain = 0, verify = 0;
  for (int64_t l = 0; l < L; ++l) {
    for (auto& [k, x] : decode_bytes(m, l, 1, context)) plain += x;
    for (auto& [k, x] : decode_bytes(m, l, Bd + 1, context)) verify += x;
  }
  const double head = static_cast<double>(weight_bytes(m.weights().head));
  double draft = head;
  if (m.weights().dspark) {
    const gpu::DeviceDspark& d = *m.weights().dspark;
    for (const gpu::DeviceLayer& st : d.stages)
      draft += block_weight_bytes(st, static_cast<double>(Bd), static_cast<double>(c.dspark_n_routed_experts),
                                  static_cast<double>(c.dspark_num_experts_per_tok));
    for (const cuda::DeviceWeight* x : {&d.markov_head, &d.confidence_proj}) draft += static_cast<double>(weight_bytes(*x));
  }
  const double scale = static_cast<double>(released_layers) / static_cast<double>(std::max<int64_t>(L, 1));
  const double plain40 = plain * scale + head, verify40 = verify * scale + head;
  plain += head;
  verify += head;
  return {{"what", "bytes each must read (weights it touches, KV rows) / the copy bandwidth of this run"},
          {"plain_step_bytes", plain},
          {"draft_bytes", draft},
          {"verify_bytes", verify},
          {"plain_floor_ms", plain / bw * 1e3},
          {"draft_floor_ms", draft / bw * 1e3},
          {"verify_floor_ms", verify / bw * 1e3},
          {"draft_vs_plain_floor", draft / plain},
          {"verify_vs_plain_floor", verify / plain},
          {"plain_roofline_ratio", plain_ms / (plain / bw * 1e3)},
          {"draft_roofline_ratio", draft_ms / (draft / bw * 1e3)},
          {"verify_roofline_ratio", verify_ms / (verify / bw * 1e3)},
          {"released_layers", released_layers},
          {"draft_vs_plain_floor_released", draft / plain40},
          {"verify_vs_plain_floor_released", verify40 / plain40}};
}

// HBM bandwidth of a device-to-device copy (bytes read + written per second).
Result<double> copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  DS41_ASSIGN_OR_RETURN(gpu::DeviceBuffer a, gpu::DeviceBuffer::allocate(bytes, "bandwidth probe"));
  DS41_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, gpu::DeviceBuffer::allocate(bytes, "bandwidth probe"));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  DS41_RETURN_IF_ERROR(
      cuda::cuda_status(cudaMemcpy(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "copy"));
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventSynchronize(e1), "bandwidth probe"));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) / (best * 1e-3);
}

// --speculative dspark on a preset without draft stages (v41-flash-slice): the preset with the
// released model's DSpark stages (v41-flash: num_nextn_predict_layers and the dspark_* values the
// slice inherits), written as a config.json under the temp folder for the dummy loader.
Result<std::string> preset_with_dspark_stages(const std::string& preset) {
  DS41_ASSIGN_OR_RETURN(model::ModelConfig c, model::preset_config(preset));
  if (c.num_nextn_predict_layers > 0) return std::string();
  DS41_ASSIGN_OR_RETURN(model::ModelConfig full, model::preset_config("v41-flash"));
  c.num_nextn_predict_layers = full.num_nextn_predict_layers;
  c.compress_ratios.resize(static_cast<size_t>(c.num_hidden_layers + c.num_nextn_predict_layers), 0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ds41-bench-dspark-" + preset);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internal_error("cannot create " + dir.string() + ": " + ec.message());
  std::ofstream f(dir / "config.json");
  f << model::model_config_to_json(c);
  if (!f) return internal_error("cannot write " + (dir / "config.json").string());
  return dir.string();
}

Result<std::unique_ptr<gpu::DeviceModel>> load_model(const GpuBenchArgs& a) {
  gpu::DeviceLoadOptions o;
  DeviceFlags f;
  f.load_format = a.load_format;
  DS41_ASSIGN_OR_RETURN(o.format, engine_load_format(f));
  if (a.speculative == "dspark" && a.model_dir.empty() && !a.preset.empty()) {
    DS41_ASSIGN_OR_RETURN(std::string dir, preset_with_dspark_stages(a.preset));
    if (!dir.empty()) return gpu::DeviceModel::load(dir, [&] {
      gpu::DeviceLoadOptions d = o;
      d.seed = a.seed;
      d.tokenizer_dir = a.tokenizer_dir;
      d.engram_host_pinned = a.engram_host_pinned;
      return d;
    }());
  }
  o.preset = a.preset;
  o.seed = a.seed;
  o.tokenizer_dir = a.tokenizer_dir;
  o.engram_host_pinned = a.engram_host_pinned;
  return gpu::DeviceModel::load(a.model_dir, o);
}

// Host times of decode steps run as served (host_served, host_served_greedy): per step the wall time
// and the executor's parts; to_json gives their medians. busy = wall less the wait for the device
// (the calling thread's work); exposed = wall less the device span (what the device waits for).
struct ServedSteps {
  std::vector<double> plan, enqueue, wait, outputs, busy, busy_share, device, exposed, exposed_share, wall;
  void add(double wall_us, const gpu::GpuForward::HostTimes& h) {
    plan.push_back(h.plan_us);
    enqueue.push_back(h.enqueue_us);
    wait.push_back(h.wait_us);
    outputs.push_back(h.outputs_us);
    busy.push_back(wall_us - h.wait_us);
    busy_share.push_back((wall_us - h.wait_us) / wall_us);
    device.push_back(h.device_us);
    exposed.push_back(wall_us - h.device_us);
    exposed_share.push_back((wall_us - h.device_us) / wall_us);
    wall.push_back(wall_us);
  }
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  }
  nlohmann::ordered_json to_json(const std::string& what) const {
    return {{"what", what},
            {"step_us", median(wall)},
            {"plan_us", median(plan)},
            {"enqueue_us", median(enqueue)},
            {"wait_us", median(wait)},
            {"outputs_us", median(outputs)},
            {"busy_us", median(busy)},
            {"busy_share_of_step", median(busy_share)},
            {"device_span_us", median(device)},
            {"exposed_us", median(exposed)},
            {"exposed_share_of_step", median(exposed_share)}};
  }
};

// bench decode's "projection" object; a projection that cannot be made (a model whose kinds do not
// cover the target's) is said there and the run's own numbers stay.
nlohmann::ordered_json decode_projection_json(const std::string& target, const Result<DecodeProjection>& pr) {
  if (!pr.ok()) return {{"target", target}, {"error", pr.status().message()}};
  const DecodeProjection& p = *pr;
  return {{"target", target},
          {"layers", p.layers},
          {"layers_per_kind", p.layers_per_kind},
          {"step_ms", p.step_ms},
          {"layers_ms", p.layers_ms},
          {"layers_bytes", p.layers_bytes},
          {"layers_roofline_ms", p.layers_roofline_ms},
          {"layers_roofline_ratio", p.layers_roofline_ratio},
          {"approximated", p.approximated}};
}

// The prefill bench's run object for one context (one sequence, `seq`, already prefilled by the
// timed exact chunks when want_exact): tokens/s, the per-kind seconds; with want_exact one more
// chunk of W rows (the window) at the prompt's end, timed per layer, and the projection of both
// prefill modes to the target schedule (kind_projection.h) and to the slice itself (whose
// decoder-replay estimate the measured replay checks); with want_replay the timed
// Engine::prefill_decoder_replay of the same prompt into a fresh sequence.
Status prefill_run(const GpuBenchArgs& a, gpu::CudaEngine& eng, const gpu::DeviceModel& m, engine::SeqId seq,
                   const std::vector<int32_t>& toks, int64_t ctx, int64_t W, bool want_exact, bool want_replay,
                   double pre_s, double tc_rate, const std::vector<double>& layer_sum, const model::ModelConfig* target,
                   const model::LayerSchedule* target_sched, nlohmann::ordered_json* r) {
  const model::LayerSchedule& sched = m.schedule();
  const int64_t L = static_cast<int64_t>(sched.layers.size());
  std::map<std::string, int64_t> count;
  for (const model::LayerPlan& p : sched.layers) ++count[layer_kind(p)];
  if (want_exact) {
    KindSeconds ks;
    for (int64_t l = 0; l < L; ++l) {
      const std::string k = layer_kind(sched.layers[l]);
      ks.prompt[k] += layer_sum[l] / 1e3 / static_cast<double>(count[k]);
    }
    std::map<std::string, double> kind_s;
    for (const auto& [k, v] : ks.prompt) kind_s[k] = v * static_cast<double>(count[k]);
    (*r)["mode"] = "exact";
    (*r)["prefill_s"] = pre_s;
    (*r)["tokens_per_s"] = static_cast<double>(ctx) / pre_s;
    (*r)["per_kind_s"] = kind_s;
    (*r)["head_s"] = layer_sum[L] / 1e3;
    double flops = 0;
    for (int64_t l = 0; l < L; ++l) flops += layer_gemm_flops_per_token(m.weights().layers[l], m.config());
    const char* split = std::getenv("DS41_TC_SPLIT");
    const double tflops = flops * static_cast<double>(ctx) / pre_s / 1e12;
    (*r)["gemm"] = {{"flops_per_token", flops},
                    {"tflops", tflops},
                    {"ratio_to_dense_bf16", tc_rate > 0 ? tflops * 1e12 / tc_rate : 0.0},
                    {"x_parts", split && std::atoi(split) == 2 ? 2 : 3},
                    {"x_parts_dense", a.numerics == "fp8-act" ? 1 : (split && std::atoi(split) == 2 ? 2 : 3)},
                    {"note", "one pass of the linears' FLOPs (dense + num_experts_per_tok routed experts); "
                             "the exact prefill multiplies FP8 / FP4 linears as x_parts BF16 products (with "
                             "--numerics fp8-act the dense and grouped ones as x_parts_dense: one)"}};
    // One window of rows at the prompt's end, per layer (the rows decoder replay's layers after the
    // cut run on; their attention sees the whole prompt here, a bound on the replay's floored windows).
    // Two chunks of W rows, the second timed: the first pays the first-use costs of the W-row shapes
    // (cuBLAS heuristics), which the first layer's time would otherwise carry.
    std::vector<model::SequenceOutput> out;
    std::vector<float> lm;
    for (int64_t rep = 0; rep < 2; ++rep) {
      engine::StepItem it{seq,
                          std::span<const int32_t>(toks).subspan(static_cast<size_t>(ctx + rep * W), static_cast<size_t>(W)),
                          false};
      DS41_RETURN_IF_ERROR(eng.forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kLast, false,
                                       &out, &lm).with_context("the window chunk"));
    }
    std::map<std::string, double> win_s;
    for (int64_t l = 0; l < L; ++l) {
      const std::string k = layer_kind(sched.layers[l]);
      ks.window[k] += lm[l] / 1e3 / static_cast<double>(count[k]);
      win_s[k] += lm[l] / 1e3;
    }
    (*r)["window_chunk"] = {{"rows", W}, {"per_kind_s", win_s}, {"head_s", lm[L] / 1e3}};
    auto proj_json = [&](const model::ModelConfig& tc, const model::LayerSchedule& ts,
                         const std::string& name) -> Result<nlohmann::ordered_json> {
      DS41_ASSIGN_OR_RETURN(PrefillProjection p, project_prefill(tc, ts, ctx, ks, layer_sum[L] / 1e3));
      nlohmann::ordered_json j{{"target", name},
                               {"layers", p.layers},
                               {"layers_per_kind", p.layers_per_kind},
                               {"exact_s", p.exact_s},
                               {"exact_tokens_per_s", p.exact_tokens_per_s}};
      if (p.cut >= 0) {
        j["decoder_replay_cut"] = p.cut;
        j["decoder_replay_s"] = p.replay_s;
        j["decoder_replay_tokens_per_s"] = p.replay_tokens_per_s;
      } else {
        j["decoder_replay_refused"] = p.replay_refused;
      }
      j["approximated"] = p.approximated;
      return j;
    };
    // The slice's own sums (device time of its layers) check the method: against the measured wall
    // time above, and the decoder-replay estimate against the measured replay below. A projection
    // that cannot be made (a model whose kinds do not cover the target's) is said in the JSON; the
    // run's own numbers stay.
    auto or_error = [](Result<nlohmann::ordered_json> j, const std::string& name) {
      return j.ok() ? *j : nlohmann::ordered_json{{"target", name}, {"error", j.status().message()}};
    };
    const std::string self_name = "this model (per-layer device time)";
    (*r)["projection_self"] = or_error(proj_json(m.config(), sched, self_name), self_name);
    if (target) (*r)["projection"] = or_error(proj_json(*target, *target_sched, a.project_to), a.project_to);
  }
  if (want_replay) {
    DS41_ASSIGN_OR_RETURN(engine::SeqId rs, eng.create_sequence());
    DS41_ASSIGN_OR_RETURN(const model::DecoderReplayPlan dp,
                          model::plan_decoder_replay(m.config(), sched, ctx));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaDeviceSynchronize(), "before the decoder replay"));
    const auto t0 = std::chrono::steady_clock::now();
    Status st = eng.prefill_decoder_replay(rs, std::span<const int32_t>(toks).first(static_cast<size_t>(ctx)));
    if (st.ok()) st = cuda::cuda_status(cudaDeviceSynchronize(), "after the decoder replay");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    DS41_RETURN_IF_ERROR(eng.free_sequence(rs));
    DS41_RETURN_IF_ERROR(st.with_context("--prefill-mode decoder-replay"));
    (*r)["decoder_replay"] = {{"prefill_s", s},
                              {"tokens_per_s", static_cast<double>(ctx) / s},
                              {"cut", dp.cut},
                              {"kept_rows", dp.keep}};
    if (want_exact) (*r)["decoder_replay"]["speedup_vs_exact"] = pre_s / s;
  }
  return ok_status();
}

Status run_gpu_bench(const GpuBenchArgs& a, bool decode) {
  DS41_ASSIGN_OR_RETURN(std::vector<int64_t> batches, parse_list(a.batches, "--batch"));
  DS41_ASSIGN_OR_RETURN(std::vector<int64_t> contexts, parse_list(a.contexts, "--context"));
  if (a.steps < 1 || a.chunk < 1) return invalid_argument("--steps and --chunk must be >= 1");
  if (a.device != "cuda") return invalid_argument("--device: this benchmark runs the GPU engine (cuda)");
  if (cuda::cuda_device_count() == 0) return failed_precondition("no CUDA device");
  DS41_ASSIGN_OR_RETURN(std::unique_ptr<gpu::DeviceModel> m, load_model(a));
  const model::ModelConfig& c = m->config();
  DS41_ASSIGN_OR_RETURN(double bw, copy_bandwidth());
  double tc_rate = 0;  // prefill: the dense tensor-core rate of the same run
  if (!decode) {
    DS41_ASSIGN_OR_RETURN(tc_rate, dense_tc_rate());
  }
  if (a.speculative != "off" && a.speculative != "dspark")
    return invalid_argument("--speculative must be off or dspark, got '" + a.speculative + "'");
  const bool spec = decode && a.speculative == "dspark";
  if (spec && c.num_nextn_predict_layers <= 0)
    return failed_precondition("--speculative dspark: the model has no DSpark stages (num_nextn_predict_layers 0)");
  const int64_t Bd = spec ? c.dspark_block_size : 0;
  const int64_t max_b = decode ? *std::max_element(batches.begin(), batches.end()) : 1;
  // The plain steps (timed, then as served with rows, then as served greedily: --steps each) and the
  // speculative steps after them (two per timed step: one plain, one profiled; each advances a
  // sequence by up to Bd + 1 positions).
  // Prefill modes (issue 11's two prefill rows): the exact prefill (every row through every layer,
  // then one window chunk at the prompt's end for the per-kind projection) and / or MODEL_SPEC 4.4
  // decoder bounded replay (Engine::prefill_decoder_replay of the prompt into a fresh sequence).
  bool want_exact = false, want_replay = false;
  if (!decode) {
    std::stringstream ms(a.prefill_modes);
    std::string mode;
    while (std::getline(ms, mode, ',')) {
      if (mode == "exact") {
        want_exact = true;
      } else if (mode == "decoder-replay") {
        want_replay = true;
      } else {
        return invalid_argument("--prefill-mode: '" + mode + "' is not exact or decoder-replay");
      }
    }
    if (!want_exact && !want_replay) return invalid_argument("--prefill-mode is empty");
    if (want_replay)  // the slice's own refusal, before anything is timed (MODEL_SPEC 4.4)
      DS41_RETURN_IF_ERROR(model::plan_decoder_replay(c, m->schedule(), 1).status().with_context("--prefill-mode decoder-replay"));
  }
  // The projection target (prefill): its schedule is derived before anything is timed.
  std::optional<model::ModelConfig> target;
  std::optional<model::LayerSchedule> target_sched;
  if ((decode || want_exact) && !a.project_to.empty()) {
    DS41_ASSIGN_OR_RETURN(model::ModelConfig tc, model::preset_config(a.project_to));
    DS41_ASSIGN_OR_RETURN(model::LayerSchedule ts, model::derive_layer_schedule(tc));
    target = std::move(tc);
    target_sched = std::move(ts);
  }
  const int64_t W = c.sliding_window;  // the window chunk after an exact prefill
  const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end()) +
                          std::max<int64_t>(3 * a.steps + 1 + 2 * a.steps * (Bd + 1), decode ? 0 : 2 * W + 1);
  gpu::CudaEngineOptions eo;
  eo.model_name = "bench";
  {
    Result<quant::ActNumerics> act = quant::parse_act_numerics(a.numerics);
    if (!act.ok()) return act.status().with_context("--numerics");
    eo.limits.numerics = *act;
  }
  eo.limits.max_step_tokens = std::max(a.chunk, max_b * (Bd + 1));
  eo.limits.max_step_seqs = max_b;
  if (spec) eo.limits.max_logit_rows = max_b * (Bd + 1);
  eo.limits.max_context = max_ctx;
  const int64_t seqs_live = max_b + (want_replay ? 1 : 0);  // the replay's fresh sequence beside the exact one
  eo.max_sequences = seqs_live;
  eo.kv_bytes = static_cast<int64_t>(m->kv_layout().global_bytes_per_token() *
                                     static_cast<double>(max_ctx * seqs_live) * 1.1) +
                (int64_t{64} << 20);
  DS41_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaEngine> eng, gpu::CudaEngine::create(m.get(), eo));
  if (spec) DS41_RETURN_IF_ERROR(eng->enable_speculative().with_context("--speculative dspark"));
  nlohmann::ordered_json j = bench_header(
      decode ? "decode" : "prefill",
      decode ? nlohmann::ordered_json{{"gpu", eng->info().device}, {"copy_bandwidth_gbs", bw / 1e9}}
             : nlohmann::ordered_json{{"gpu", eng->info().device},
                                      {"copy_bandwidth_gbs", bw / 1e9},
                                      {"dense_bf16_tflops", tc_rate / 1e12}},
      nlohmann::ordered_json{
          {"model", a.model_dir},
          {"preset", a.preset},
          {"load_format", a.load_format},
          {"numerics", a.numerics},
          {"hidden", c.hidden_size},
          {"layers", c.num_hidden_layers},
          {"chunk", a.chunk},
          {"steps", a.steps},
          {"weight_gib", static_cast<double>(m->weight_bytes()) / (1 << 30)},
          {"workspace_gib", static_cast<double>(eng->executor().workspace_bytes()) / (1 << 30)}});
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  const int64_t L = c.num_hidden_layers;
  {
    // Warm-up (untimed): one chunk through a scratch sequence, so library initialisation and
    // first-launch costs (module loading, cuBLAS heuristics) stay out of the timed prefill.
    DS41_ASSIGN_OR_RETURN(engine::SeqId w, eng->create_sequence());
    std::vector<int32_t> wt(static_cast<size_t>(std::min<int64_t>(a.chunk, max_ctx - 1)));
    for (size_t i = 0; i < wt.size(); ++i) wt[i] = static_cast<int32_t>((i * 104729 + 7) % c.vocab_size);
    engine::StepItem it{w, wt, false};
    std::vector<model::SequenceOutput> out;
    DS41_RETURN_IF_ERROR(eng->forward(std::span<const engine::StepItem>(&it, 1), model::LogitsRows::kLast,
                                      false, &out));
    DS41_RETURN_IF_ERROR(eng->free_sequence(w));
  }
  for (int64_t ctx : contexts)
    for (int64_t B : decode ? batches : std::vector<int64_t>{1}) {
      std::vector<engine::SeqId> seqs;
      for (int64_t s = 0; s < B; ++s) {
        DS41_ASSIGN_OR_RETURN(engine::SeqId id, eng->create_sequence());
        seqs.push_back(id);
      }
      std::vector<int32_t> toks(ctx + std::max<int64_t>(3 * a.steps + 1, decode ? 0 : 2 * W + 1));
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
      // Context: prefill in chunks (timed for the prefill bench).
      std::vector<double> layer_sum(L + 1, 0.0);
      std::vector<float> lm;
      // The exact prefill's kernels per layer (and the head) of its last chunk (issue 11: <= 15 per Reuse layer).
      std::vector<int64_t> chunk_launches;
      int64_t chunk_rows = 0;
      const auto t0 = std::chrono::steady_clock::now();
      // The timed region is bracketed for a profiler started with --profile-from-start off
      // (ncu / nsys); without one these calls do nothing.
      if (!decode && want_exact) cudaProfilerStart();
      for (int64_t s = 0; s < B && (decode || want_exact); ++s)
        for (int64_t p = 0; p < ctx; p += a.chunk) {
          const int64_t e = std::min(ctx, p + a.chunk);
          engine::StepItem it{seqs[s], std::span<const int32_t>(toks).subspan(p, e - p), false};
          std::vector<model::SequenceOutput> out;
          DS41_RETURN_IF_ERROR(eng->forward(std::span<const engine::StepItem>(&it, 1),
                                            model::LogitsRows::kLast, false, &out, &lm,
                                            decode ? nullptr : &chunk_launches));
          chunk_rows = e - p;
          for (int64_t l = 0; l <= L; ++l) layer_sum[l] += lm[l];
        }
      if (!decode && want_exact) cudaProfilerStop();
      const double pre_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::ordered_json r{{"batch", B}, {"context", ctx}};
      std::map<std::string, double> kind_ms, kind_bytes;
      std::map<std::string, int64_t> kind_kernels, kind_layers;
      if (!decode) {
        DS41_RETURN_IF_ERROR(prefill_run(a, *eng, *m, seqs[0], toks, ctx, W, want_exact, want_replay, pre_s, tc_rate, layer_sum,
                                         target ? &*target : nullptr, target_sched ? &*target_sched : nullptr, &r));
        if (want_exact && static_cast<int64_t>(chunk_launches.size()) == L + 1) {
          std::map<std::string, int64_t> kk, kl;
          for (int64_t l = 0; l < L; ++l) {
            const std::string k = layer_kind(m->schedule().layers[l]);
            kk[k] += chunk_launches[l];
            ++kl[k];
          }
          nlohmann::ordered_json per;
          for (const auto& [k, v] : kk) per[k] = static_cast<double>(v) / static_cast<double>(kl[k]);
          r["kernels_per_layer"] = {{"chunk_rows", chunk_rows},
                                    {"per_kind", per},
                                    {"head", chunk_launches[L]},
                                    {"note", "launches per layer of the exact prefill's last chunk, counted by the "
                                             "forward (both streams); issue 11: <= 15 per Reuse layer"}};
        }
      } else {
        std::vector<double> step_ms;
        std::vector<std::vector<float>> per_layer;
        std::vector<int64_t> launches;  // kernels per layer (and the head, last) of the last timed step
        // The logits rows land in one buffer kept across steps, as CudaEngine::step puts them into
        // the serving loop's StepOutput (what a served step pays on the host).
        std::vector<float> logits(static_cast<size_t>(B * c.vocab_size));
        const gpu::CudaEngine::LogitsSink sink = [&](size_t i, const float* rows, int64_t n) {
          std::memcpy(logits.data() + i * c.vocab_size, rows + (n - 1) * c.vocab_size,
                      static_cast<size_t>(c.vocab_size) * sizeof(float));
        };
        std::vector<gpu::GpuForward::HostTimes> host_times;  // per timed step
        const gpu::StepGraphs* graphs = eng->executor().step_graphs();
        const gpu::StepGraphStats g0 = graphs ? graphs->stats() : gpu::StepGraphStats{};
        cudaProfilerStart();
        for (int64_t t = 0; t < a.steps; ++t) {
          std::vector<engine::StepItem> items;
          for (int64_t s = 0; s < B; ++s)
            items.push_back({seqs[s], std::span<const int32_t>(&toks[ctx + t], 1), true});
          std::vector<model::SequenceOutput> out;
          const auto s0 = std::chrono::steady_clock::now();
          DS41_RETURN_IF_ERROR(
              eng->forward(items, model::LogitsRows::kLast, false, &out, &lm, &launches, sink));
          step_ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
          per_layer.push_back(lm);
          host_times.push_back(eng->executor().last_host_times());
        }
        cudaProfilerStop();
        if (graphs) {  // decode segments replayed from captured graphs (gpu/step_graphs.h), this run's steps
          const gpu::StepGraphStats& g1 = graphs->stats();
          r["graphs"] = {{"capacity_in_use", graphs->cached()},
                         {"hits", g1.hits - g0.hits},
                         {"captures", g1.captures - g0.captures},
                         {"updates", g1.updates - g0.updates},
                         {"deferred", g1.deferred - g0.deferred},
                         {"direct", g1.direct - g0.direct},
                         {"unrouted", g1.unrouted - g0.unrouted},
                         {"host_us_per_step",
                          {{"dry_passes", (g1.dry_us - g0.dry_us) / static_cast<double>(a.steps)},
                           {"captures", (g1.capture_us - g0.capture_us) / static_cast<double>(a.steps)},
                           {"graph_launches", (g1.launch_us - g0.launch_us) / static_cast<double>(a.steps)}}}};
        } else {
          r["graphs"] = "off";
        }
        const std::vector<double> step_ms_in_order = step_ms;  // paired with per_layer
        {  // The calling thread's work per step (issue 11: host time < 5 % of a batch-1 step with graphs):
           // the step's wall time less the wait for the device, and the executor's parts, medians.
          const auto median = &ServedSteps::median;
          std::vector<double> plan, enq, wait, outs, busy, share;
          for (size_t t = 0; t < host_times.size() && t < step_ms_in_order.size(); ++t) {
            const gpu::GpuForward::HostTimes& h = host_times[t];
            plan.push_back(h.plan_us);
            enq.push_back(h.enqueue_us);
            wait.push_back(h.wait_us);
            outs.push_back(h.outputs_us);
            const double b = step_ms_in_order[t] * 1e3 - h.wait_us;
            busy.push_back(b);
            share.push_back(b / (step_ms_in_order[t] * 1e3));
          }
          r["host"] = {{"what", "microseconds per step on the calling thread, medians: busy = the step's wall time "
                                "less the wait for the device (plan + enqueue + outputs + the engine's own work)"},
                       {"plan_us", median(plan)},
                       {"enqueue_us", median(enq)},
                       {"wait_us", median(wait)},
                       {"outputs_us", median(outs)},
                       {"busy_us", median(busy)},
                       {"busy_share_of_step", median(share)}};
          // The same steps as a server runs them (issue 11's host-time row): no layer timing events
          // and no launch counts, the device span timed by two events around the step's work; the
          // wall time less that span is the host's part the device waits for (plan, the time to
          // the first kernel, the outputs after the last).
          eng->set_device_span(true);
          const gpu::StepGraphStats s0 = graphs ? graphs->stats() : gpu::StepGraphStats{};
          ServedSteps rows_steps;
          for (int64_t t = 0; t < a.steps; ++t) {
            std::vector<engine::StepItem> items;
            for (int64_t s = 0; s < B; ++s)
              items.push_back({seqs[s], std::span<const int32_t>(&toks[ctx + a.steps + t], 1), true});
            std::vector<model::SequenceOutput> out;
            const auto q0 = std::chrono::steady_clock::now();
            DS41_RETURN_IF_ERROR(eng->forward(items, model::LogitsRows::kLast, false, &out, nullptr, nullptr, sink));
            const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - q0).count();
            rows_steps.add(wall, eng->executor().last_host_times());
          }
          eng->set_device_span(false);
          nlohmann::ordered_json served = rows_steps.to_json(
              "the same decode steps without layer timing (as served), medians: busy = wall less the wait (the "
              "calling thread's work); exposed = wall less the device span (the part the device waits for the host)");
          if (graphs) {
            const gpu::StepGraphStats& s1 = graphs->stats();
            const double n = static_cast<double>(a.steps);
            served["graphs_host_us_per_step"] = {{"dry_passes", (s1.dry_us - s0.dry_us) / n},
                                                 {"of_which_capture_checks", (s1.check_us - s0.check_us) / n},
                                                 {"of_which_keys", (s1.key_us - s0.key_us) / n},
                                                 {"captures", (s1.capture_us - s0.capture_us) / n},
                                                 {"graph_launches", (s1.launch_us - s0.launch_us) / n},
                                                 {"hits", s1.hits - s0.hits},
                                                 {"captured", s1.captures - s0.captures},
                                                 {"deferred", s1.deferred - s0.deferred}};
          }
          r["host_served"] = served;
          // The same served steps with every item drawn greedily (engine.h StepItem::greedy_only,
          // what EngineLoop asks for temperature-0 requests without penalties or logprobs): through
          // CudaEngine::step, one token per sequence crosses to the host (the checked argmax on the
          // device) instead of the logits rows, and the host scans no row.
          eng->set_device_span(true);
          ServedSteps greedy_steps;
          engine::StepOutput gout;
          for (int64_t t = 0; t < a.steps; ++t) {
            std::vector<engine::StepItem> items;
            for (int64_t s = 0; s < B; ++s) {
              engine::StepItem it{seqs[s], std::span<const int32_t>(&toks[ctx + 2 * a.steps + t], 1), true};
              it.greedy_only = true;
              items.push_back(it);
            }
            const auto q0 = std::chrono::steady_clock::now();
            DS41_RETURN_IF_ERROR(eng->step(items, &gout));
            const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - q0).count();
            if (static_cast<int64_t>(gout.token.size()) != B)
              return internal_error("bench decode: a greedy-only step returned no tokens");
            greedy_steps.add(wall, eng->executor().last_host_times());
          }
          eng->set_device_span(false);
          r["host_served_greedy"] = greedy_steps.to_json(
              "host_served's steps drawn greedily through CudaEngine::step (StepItem::greedy_only): one token per "
              "sequence crosses to the host instead of the logits rows, medians");
        }
        std::sort(step_ms.begin(), step_ms.end());
        r["step_ms_median"] = step_ms[step_ms.size() / 2];
        // Kernels launched (cuda::launch(), PDL) per step: the layers, the head, and the few before
        // layer 0 (embedding, Engram hashing, mHC init) that no layer owns are left out.
        int64_t kernels = 0;
        for (int64_t v : launches) kernels += v;
        r["kernels_per_step_layers_and_head"] = kernels;
        if (static_cast<int64_t>(launches.size()) == L + 1) r["kernels_head"] = launches[L];
        nlohmann::ordered_json layers = nlohmann::ordered_json::array();
        for (int64_t l = 0; l < L; ++l) {
          std::vector<float> v;
          for (const auto& pl : per_layer) v.push_back(pl[l]);
          std::sort(v.begin(), v.end());
          const double ms = v[v.size() / 2];
          auto bytes = decode_bytes(*m, l, B, ctx);
          double total = 0;
          for (auto& [k, x] : bytes) total += x;
          const std::string kind = layer_kind(m->schedule().layers[l]);
          kind_ms[kind] += ms;
          kind_bytes[kind] += total;
          if (static_cast<int64_t>(launches.size()) > l) kind_kernels[kind] += launches[l];
          ++kind_layers[kind];
          layers.push_back({{"layer", l},
                            {"kind", kind},
                            {"ms", ms},
                            {"kernels", static_cast<int64_t>(launches.size()) > l ? launches[l] : -1},
                            {"bytes", bytes},
                            {"bytes_total", total},
                            {"roofline_ratio", ms * 1e-3 / (total / bw)}});
        }
        r["layers"] = layers;
        {  // The head (final norm, head GEMV, logits copy) and what the step spends outside the GPU's
           // layer and head time (planning, uploads, the logits rows into the outputs), medians.
          std::vector<double> head, rest;
          for (size_t t = 0; t < per_layer.size(); ++t) {
            double gpu = 0;
            for (float v : per_layer[t]) gpu += v;
            if (static_cast<int64_t>(per_layer[t].size()) > L) head.push_back(per_layer[t][L]);
            rest.push_back(step_ms_in_order[t] - gpu);
          }
          std::sort(head.begin(), head.end());
          std::sort(rest.begin(), rest.end());
          if (!head.empty()) r["head_ms_median"] = head[head.size() / 2];
          r["outside_layers_and_head_ms_median"] = rest[rest.size() / 2];
        }
        nlohmann::ordered_json kinds = nlohmann::ordered_json::object();
        for (auto& [k, ms] : kind_ms)
          kinds[k] = {{"ms", ms},
                      {"bytes", kind_bytes[k]},
                      {"roofline_ratio", ms * 1e-3 / (kind_bytes[k] / bw)},
                      {"kernels_per_layer", kind_layers[k] > 0 ? static_cast<double>(kind_kernels[k]) /
                                                                   static_cast<double>(kind_layers[k])
                                                             : 0.0}};
        r["per_kind"] = kinds;
        if (target_sched) {  // the step over the target's schedule (kind_projection.h), same kinds
          std::map<std::string, double> ms_layer, bytes_layer;
          for (auto& [k, ms] : kind_ms) {
            ms_layer[k] = ms / static_cast<double>(kind_layers[k]);
            bytes_layer[k] = kind_bytes[k] / static_cast<double>(kind_layers[k]);
          }
          r["projection"] = decode_projection_json(
              a.project_to, project_decode(*target_sched, ms_layer, bytes_layer, r.value("head_ms_median", 0.0),
                                           r.value("outside_layers_and_head_ms_median", 0.0), bw));
        }
        if (spec) {
          // DSpark (issue 17 "Benchmark"), same run: a draft step alone (batch 1: the first
          // sequence's anchor, no state change) and full speculative steps (draft + one
          // verification of B + 1 rows per sequence + rollback + context rows) for every sequence.
          std::vector<double> draft_ms, spec_ms;
          // Where each speculative step's time goes (phases with the stream drained between them).
          std::vector<gpu::CudaEngine::SpecProfile> prof;
          engine::AcceptanceStats stats;
          std::vector<int32_t> anchor(static_cast<size_t>(B));
          for (int64_t s = 0; s < B; ++s) anchor[s] = toks[ctx + a.steps];
          for (int64_t t = 0; t < a.steps; ++t) {
            const auto d0 = std::chrono::steady_clock::now();
            cudaProfilerStart();  // the draft steps are profiled too (ncu --profile-from-start off)
            DS41_RETURN_IF_ERROR(eng->draft(seqs[0], anchor[0], false).status());
            cudaProfilerStop();
            draft_ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count());
            std::vector<engine::SpecStepItem> items(static_cast<size_t>(B));
            for (int64_t s = 0; s < B; ++s) {
              items[s].seq = seqs[s];
              items[s].anchor = anchor[s];
            }
            std::vector<engine::SpecStepResult> res;
            const auto s0 = std::chrono::steady_clock::now();
            DS41_RETURN_IF_ERROR(eng->speculative_step(items, engine::SpecBatchOptions{}, &res));
            spec_ms.push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
            // The same step again with the phases timed (it synchronises between them; not in spec_ms).
            for (int64_t s = 0; s < B; ++s) {
              stats.add(res[s].accepted, Bd);
              items[s].anchor = anchor[s] = res[s].tokens.back();
            }
            prof.emplace_back();
            eng->profile_speculative(&prof.back());
            const Status ps = eng->speculative_step(items, engine::SpecBatchOptions{}, &res);
            eng->profile_speculative(nullptr);
            DS41_RETURN_IF_ERROR(ps);
            for (int64_t s = 0; s < B; ++s) {
              stats.add(res[s].accepted, Bd);
              anchor[s] = res[s].tokens.back();
            }
          }
          std::sort(draft_ms.begin(), draft_ms.end());
          std::sort(spec_ms.begin(), spec_ms.end());
          const double plain = r["step_ms_median"].get<double>();
          const double dm = draft_ms[draft_ms.size() / 2], sm = spec_ms[spec_ms.size() / 2];
          const auto med = [&](double gpu::CudaEngine::SpecProfile::*f) {
            std::vector<double> v;
            for (const auto& p : prof) v.push_back(p.*f);
            std::sort(v.begin(), v.end());
            return v.empty() ? 0.0 : v[v.size() / 2];
          };
          nlohmann::ordered_json phases = {
              {"what", "milliseconds per phase of a separate profiled step (stream drained between phases), median"},
              {"draft_ms", med(&gpu::CudaEngine::SpecProfile::draft_ms)},
              {"verify_forward_ms", med(&gpu::CudaEngine::SpecProfile::verify_forward_ms)},
              {"accept_ms", med(&gpu::CudaEngine::SpecProfile::accept_ms)},
              {"rollback_ms", med(&gpu::CudaEngine::SpecProfile::rollback_ms)},
              {"commit_ms", med(&gpu::CudaEngine::SpecProfile::commit_ms)}};
          if (!prof.empty()) {
            phases["groups"] = prof.back().groups;
            phases["verify_rows"] = prof.back().verify_rows;
            phases["verify_layer_ms_last"] = prof.back().verify_layer_ms;
            phases["verify_layer_launches_last"] = prof.back().verify_layer_launches;
          }
          nlohmann::ordered_json proj = nlohmann::ordered_json::object();
          for (int64_t acc = 0; acc <= Bd; ++acc)  // tokens/s per sequence if every step accepted `acc`
            proj[std::to_string(acc)] = static_cast<double>(acc + 1) / (sm * 1e-3);
          r["speculative"] = {{"method", "dspark"},
                              {"block", Bd},
                              {"steps", stats.steps},
                              {"tokens_per_step", stats.tokens_per_step()},
                              {"mean_accepted", stats.mean_accepted()},
                              {"accepted_histogram", stats.counts},
                              {"plain_step_ms_median", plain},
                              {"draft_ms_median_batch1", dm},
                              {"spec_step_ms_median", sm},
                              {"verify_ms_estimate", sm - dm},
                              {"draft_vs_plain", dm / plain},
                              {"spec_step_vs_plain", sm / plain},
                              {"plain_tokens_per_s_per_seq", 1e3 / plain},
                              {"measured_tokens_per_s_per_seq", stats.tokens_per_step() / (sm * 1e-3)},
                              {"projected_tokens_per_s_per_seq", proj},
                              {"phases", phases}};
          if (B == 1)  // the floors are those of one sequence
            r["speculative"]["floor"] = speculative_floor(*m, ctx, bw, plain, dm, sm - dm, 40);
        }
      }
      runs.push_back(r);
      for (engine::SeqId s : seqs) DS41_RETURN_IF_ERROR(eng->free_sequence(s));
      std::fprintf(stderr, "ds41 bench %s: batch %lld context %lld done\n", decode ? "decode" : "prefill",
                   static_cast<long long>(B), static_cast<long long>(ctx));
    }
  j["runs"] = runs;
  std::cout << j.dump(2) << "\n";
  return ok_status();
}
#else
Status run_gpu_bench(const GpuBenchArgs&, bool) {
  return failed_precondition("this ds41 was built without CUDA: the GPU benchmarks need the GPU engine");
}
#endif

void setup_common(CLI::App* cmd, GpuBenchArgs* a) {
  cmd->add_option("--model", a->model_dir, "Model directory (config.json [+ safetensors])");
  cmd->add_option("--preset", a->preset,
                  "With --load-format dummy and no --model: a preset (e.g. v41-flash-slice)");
  cmd->add_option("--tokenizer", a->tokenizer_dir, "Folder with tokenizer.json (Engram vocabulary)");
  cmd->add_option("--load-format", a->load_format, "auto | safetensors | dummy (default dummy)");
  cmd->add_option("--seed", a->seed, "Seed of the dummy weights (default 1)");
  cmd->add_flag("--engram-host-pinned", a->engram_host_pinned, "Engram tables in mapped host-pinned memory");
  cmd->add_option("--context", a->contexts, "Context tokens, comma-separated (default 4096)");
  cmd->add_option("--chunk", a->chunk, "Prefill chunk tokens (default 2048)");
  cmd->add_option("--device", a->device, "cuda (the only device of this benchmark)");
  cmd->add_option("--numerics", a->numerics,
                  "exact (default) | fp8-act: activations quantized to FP8 per 32 before every FP8 / FP4 linear "
                  "(the official path; prefill GEMMs in one pass); named in the JSON");
}

void setup_decode(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<GpuBenchArgs>();
  CLI::App* cmd =
      parent.add_subcommand("decode", "GPU engine decode step time per layer kind vs the HBM roofline");
  setup_common(cmd, a.get());
  cmd->add_option("--batch", a->batches, "Batch sizes, comma-separated (default 1)");
  cmd->add_option("--steps", a->steps, "Decode steps timed (default 8)");
  cmd->add_option("--project-to", a->project_to,
                  "Preset whose layer schedule the per-kind step times and bytes project to (default "
                  "v41-flash: the released 40 layers; empty: none)");
  cmd->add_option("--speculative", a->speculative,
                  "off | dspark: also time DSpark draft and speculative steps in the same run (tokens "
                  "per step, mean accepted length, acceptance histogram, time per step vs plain decode)");
  cmd->callback([a, &exit_code] {
    Status s = run_gpu_bench(*a, true);
    if (!s.ok()) {
      std::cerr << "ds41 bench decode: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

void setup_prefill(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<GpuBenchArgs>();
  CLI::App* cmd = parent.add_subcommand("prefill", "GPU engine prefill tokens/s and time per layer kind");
  setup_common(cmd, a.get());
  cmd->add_option("--prefill-mode", a->prefill_modes,
                  "exact and / or decoder-replay, comma-separated (default exact): the exact prefill in "
                  "--chunk chunks, MODEL_SPEC 4.4 decoder bounded replay of the same prompt (same run)");
  cmd->add_option("--project-to", a->project_to,
                  "Preset whose layer schedule the exact run's per-kind times project to, both modes "
                  "(default v41-flash: the released 40 layers; empty: none)");
  cmd->callback([a, &exit_code] {
    Status s = run_gpu_bench(*a, false);
    if (!s.ok()) {
      std::cerr << "ds41 bench prefill: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_bench_gpu
}  // namespace

DS41_REGISTER_BENCH("decode", ::ds41::cli::cmd_bench_gpu::setup_decode);
DS41_REGISTER_BENCH("prefill", ::ds41::cli::cmd_bench_gpu::setup_prefill);

}  // namespace ds41::cli
