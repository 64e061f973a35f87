// ds41 bench kernels: the matrix kernels of src/backends/cuda (run_linear, run_grouped_linear,
// run_expert_linear) at the released widths (MODEL_SPEC 1.3: wq_a, wq_b, wkv, grouped wo_a, wo_b,
// the router gate, the shared expert, 384 routed FP4 experts with top-6 routing, the head) for
// n = 1, 8, 64 tokens (decode) and 4096 (prefill), against two references measured in the same run
// (issues 10 and 11):
//   - the HBM roofline: the bytes the launcher must move (weights it touches + activations in and
//     out) over the bandwidth of a streaming copy kernel (read + write bytes / time);
//   - cuBLASLt on the same shapes: BF16 on a dequantized copy of the weights (BF16 activations,
//     FP32 output) and, for FP8/FP4 weights, FP8 E4M3 with a per-tensor scale (FP32 output). The
//     routed experts have no grouped GEMM in cuBLASLt: the reference is a strided-batched GEMM over
//     the used experts at the mean rows per expert.
// Weights are rotated over copies (>= 256 MB touched per cycle) so every launch streams from HBM as
// in a forward pass, not from the 60 MB L2. Times are means over back-to-back eager launches (CUDA
// events; no graph). Prints one JSON object with --json (tools/bench_header.h), else indented;
// progress on stderr.
// cuBLASLt is linked only into this binary, and only when the build has CUDA (DS41_BENCH_CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_header.h"
#include "cli_registry.h"
#include "core/status.h"
#include "load_progress.h"
#include "quant/weight_format.h"

#if DS41_BENCH_CUDA
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backends/cuda/bench_support.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/linear_kernels.h"
#include "backends/cuda/weight_dequant.h"
#endif

namespace ds41::cli {
namespace {
namespace cmd_bench_kernels {  // one name per file: the unity build of tools/ (CMakeLists.txt)

struct KernelsBenchArgs {
  std::string device = "cuda";
  std::vector<int64_t> ns{1, 8, 64, 4096};
  std::vector<std::string> only;  // shape names; empty = all
  double min_time_ms = 20;
  int blas_algos = 3;  // cuBLASLt heuristic candidates timed (the fastest is reported)
  bool no_blas = false;
  bool json = false;
  bool row_invariant = false;  // dense calls as decode steps / verifications make them
};

#if DS41_BENCH_CUDA

using cuda::DeviceWeight;
using quant::WeightFormat;

enum class Kind { kDense, kGrouped, kExperts };

struct Shape {
  const char* name;
  Kind kind;
  WeightFormat format;
  int64_t out, in;   // grouped: out over all groups, in per group; experts: per expert
  int64_t groups;    // grouped: groups; experts: experts
  int64_t topk = 0;  // experts
};

// MODEL_SPEC 1.3 released widths (hidden 5120, q_lora 1280, 64 heads x 512, 8 o-groups of 1024 over
// 4096 inputs each, o_lora 8 x 1024 -> 5120, 384 experts of 2304, top-6, vocabulary 129,280).
std::vector<Shape> shapes() {
  return {{"wq_a", Kind::kDense, WeightFormat::kFp8Tiles, 1280, 5120, 1},
          {"wq_b", Kind::kDense, WeightFormat::kFp8Tiles, 32768, 1280, 1},
          {"wkv", Kind::kDense, WeightFormat::kFp8Tiles, 512, 5120, 1},
          {"wo_a", Kind::kGrouped, WeightFormat::kFp8Tiles, 8192, 4096, 8},
          {"wo_b", Kind::kDense, WeightFormat::kFp8Tiles, 5120, 8192, 1},
          {"gate", Kind::kDense, WeightFormat::kBF16, 384, 5120, 1},
          {"shared_w1", Kind::kDense, WeightFormat::kFp8Tiles, 2304, 5120, 1},
          {"shared_w2", Kind::kDense, WeightFormat::kFp8Tiles, 5120, 2304, 1},
          {"experts_w1", Kind::kExperts, WeightFormat::kFp4Rows, 2304, 5120, 384, 6},
          {"experts_w2", Kind::kExperts, WeightFormat::kFp4Rows, 5120, 2304, 384, 6},
          {"head", Kind::kDense, WeightFormat::kBF16, 129280, 5120, 1}};
}

// ----------------------------------------------------------------------------------------------
// Device memory owned by the benchmark (the kernels never allocate).
class DevMem {
 public:
  DevMem() = default;
  static Result<DevMem> alloc(int64_t bytes) {
    DevMem m;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMalloc(&m.p_, static_cast<size_t>(std::max<int64_t>(bytes, 16))), "cudaMalloc"));
    m.bytes_ = bytes;
    return m;
  }
  DevMem(DevMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DevMem() {
    if (p_) cudaFree(p_);
  }
  template <typename T = uint8_t>
  T* as() const {
    return static_cast<T*>(p_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  int64_t bytes_ = 0;
};

// Mean microseconds per call of fn(i) (i = call index), back to back on `stream`: two warm-up calls,
// a 3-call calibration, then enough calls for min_time_ms.
template <class Fn>
Result<double> time_us(Fn&& fn, double min_time_ms, cudaStream_t stream) {
  cudaEvent_t e0, e1;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&e0), "cudaEventCreate"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventCreate(&e1), "cudaEventCreate"));
  auto destroy = [&] {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  };
  auto batch = [&](int64_t first, int64_t count, float& ms) -> Status {
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(e0, stream), "cudaEventRecord"));
    for (int64_t i = 0; i < count; ++i) DS41_RETURN_IF_ERROR(fn(first + i));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventRecord(e1, stream), "cudaEventRecord"));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaEventSynchronize(e1), "kernel run"));
    return cuda::cuda_status(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
  };
  float ms = 0;
  Status s = batch(0, 2, ms);
  if (s.ok()) s = batch(2, 3, ms);
  double us = 0;
  if (s.ok()) {
    const double per = std::max(1e-3, ms * 1e3 / 3);
    const int64_t iters = std::clamp<int64_t>(static_cast<int64_t>(min_time_ms * 1e3 / per), 5, 5000);
    s = batch(5, iters, ms);
    us = ms * 1e3 / static_cast<double>(iters);
  }
  destroy();
  if (!s.ok()) return s;
  return us;
}

// ----------------------------------------------------------------------------------------------
// cuBLASLt: D[m, n] (column-major, ld = ldc) = op(A)[m, k] . B[k, n] with A stored k x m (the
// weight's rows: transa = T, the "TN" layout FP8 requires) and B = the activations' rows (k x n,
// ld = ldb). Optional strided batch.
struct LtProblem {
  cudaDataType_t ab_type = CUDA_R_16BF;
  int64_t m = 0, n = 0, k = 0, ldb = 0, ldc = 0;
  int32_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  const float* scale = nullptr;  // FP8: device per-tensor scale of A and B (1.0)
};

class LtGemm {
 public:
  ~LtGemm() { release(); }
  LtGemm() = default;
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Plans the problem; false (no error) when cuBLASLt has no algorithm for it.
  Result<bool> plan(cublasLtHandle_t h, const LtProblem& p, size_t ws_bytes, int max_algos) {
    release();
    h_ = h;
    auto lt = [](cublasStatus_t st, const char* what) -> Status {
      if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
      return internal_error(std::string("cuBLASLt ") + what + ": status " +
                            std::to_string(static_cast<int>(st)));
    };
    DS41_RETURN_IF_ERROR(
        lt(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    DS41_RETURN_IF_ERROR(
        lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA"));
    DS41_RETURN_IF_ERROR(
        lt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB"));
    if (p.scale) {
      DS41_RETURN_IF_ERROR(lt(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &p.scale, sizeof p.scale),
          "A_SCALE"));
      DS41_RETURN_IF_ERROR(lt(
          cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &p.scale, sizeof p.scale),
          "B_SCALE"));
    }
    DS41_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(&a_, p.ab_type, p.k, p.m, p.k), "layout A"));
    DS41_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(&b_, p.ab_type, p.k, p.n, p.ldb), "layout B"));
    DS41_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutCreate(&c_, CUDA_R_32F, p.m, p.n, p.ldc), "layout C"));
    if (p.batch > 1) {
      const cublasLtMatrixLayout_t ls[3] = {a_, b_, c_};
      const int64_t strides[3] = {p.stride_a, p.stride_b, p.stride_c};
      for (int i = 0; i < 3; ++i) {
        DS41_RETURN_IF_ERROR(lt(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                                 &p.batch, sizeof p.batch),
                                "BATCH_COUNT"));
        DS41_RETURN_IF_ERROR(
            lt(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &strides[i], sizeof strides[i]),
               "BATCH_OFFSET"));
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    DS41_RETURN_IF_ERROR(lt(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate"));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                         sizeof ws_bytes);
    std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(std::max(1, max_algos)));
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        h, op_, a_, b_, c_, c_, pref, static_cast<int>(res.size()), res.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found <= 0) return false;
    algos_.assign(res.begin(), res.begin() + found);
    return true;
  }
  int algos() const { return static_cast<int>(algos_.size()); }
  Status run(int algo, const void* A, const void* B, float* C, void* ws, size_t ws_bytes,
             cudaStream_t s) const {
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(h_, op_, &alpha, A, a_, B, b_, &beta, C, c_, C, c_,
                                             &algos_[static_cast<size_t>(algo)].algo, ws, ws_bytes, s);
    if (st != CUBLAS_STATUS_SUCCESS)
      return internal_error("cublasLtMatmul: status " + std::to_string(static_cast<int>(st)));
    return ok_status();
  }

 private:
  void release() {
    if (op_) cublasLtMatmulDescDestroy(op_);
    for (cublasLtMatrixLayout_t* l : {&a_, &b_, &c_})
      if (*l) cublasLtMatrixLayoutDestroy(*l);
    op_ = nullptr;
    a_ = b_ = c_ = nullptr;
    algos_.clear();
  }
  cublasLtHandle_t h_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos_;
};

struct Ctx {
  const KernelsBenchArgs* args = nullptr;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  DevMem ws;   // cuBLASLt workspace
  DevMem one;  // float 1.0 (FP8 per-tensor scale)
  double copy_gbs = 0;
};

constexpr int64_t kRotateBytes = int64_t{256} << 20;  // weights touched per rotation cycle (> 4x L2)

// Fastest of the planned algorithms: mean us per call (rotating over `copies` operand sets).
Result<double> time_blas(Ctx& c, const LtProblem& p, int copies,
                         const std::function<const void*(int64_t)>& a_at,
                         const std::function<const void*(int64_t)>& b_at, float* y) {
  LtGemm g;
  Result<bool> planned = g.plan(c.lt, p, static_cast<size_t>(c.ws.bytes()), c.args->blas_algos);
  if (!planned.ok() || !*planned) return -1.0;  // no cuBLASLt algorithm for this problem: reported as -1
  double best = -1;
  for (int algo = 0; algo < g.algos(); ++algo) {
    auto fn = [&](int64_t i) {
      return g.run(algo, a_at(i % copies), b_at(i % copies), y, c.ws.as(), static_cast<size_t>(c.ws.bytes()),
                   c.stream);
    };
    Result<double> t = time_us(fn, c.args->min_time_ms, c.stream);
    if (!t.ok()) continue;  // an algorithm may refuse at run time: try the next
    if (best < 0 || *t < best) best = *t;
  }
  return best;
}

int copies_for(int64_t bytes_per_copy) {
  return static_cast<int>(std::clamp<int64_t>((kRotateBytes + bytes_per_copy - 1) / bytes_per_copy, 1, 256));
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(static_cast<double>(a[i])));
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return mx > 0 ? d / mx : d;
}

// Routing of n tokens to k distinct experts of E (seeded): rows per expert -> offsets [E + 1].
std::vector<int64_t> route(int64_t n, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> cnt(static_cast<size_t>(E), 0), ids(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) ids[static_cast<size_t>(e)] = e;
    for (int64_t j = 0; j < k; ++j) {
      std::uniform_int_distribution<int64_t> d(j, E - 1);
      std::swap(ids[static_cast<size_t>(j)], ids[static_cast<size_t>(d(rng))]);
      ++cnt[static_cast<size_t>(ids[static_cast<size_t>(j)])];
    }
  }
  std::vector<int64_t> off(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    off[static_cast<size_t>(e + 1)] = off[static_cast<size_t>(e)] + cnt[static_cast<size_t>(e)];
  return off;
}

// One measurement row of the report.
struct Row {
  std::string name, format;
  int64_t out = 0, in = 0, groups = 1, n = 0, rows = 0;
  double ours_us = 0, bytes = 0, flops = 0, blas_bf16_us = -1, blas_fp8_us = -1, check_rel = -1;
};

nlohmann::ordered_json to_json(const Row& r, double copy_gbs) {
  nlohmann::ordered_json j;
  j["name"] = r.name;
  j["format"] = r.format;
  j["out"] = r.out;
  j["in"] = r.in;
  if (r.groups > 1) j["groups_or_experts"] = r.groups;
  j["n"] = r.n;
  j["rows"] = r.rows;
  j["ours_us"] = r.ours_us;
  j["bytes"] = r.bytes;
  const double roof_us = r.bytes / (copy_gbs * 1e3);
  j["roofline_us"] = roof_us;
  j["roofline_ratio"] = r.ours_us / roof_us;  // issue 10 decode target: <= 2
  j["ours_gbs"] = r.bytes / (r.ours_us * 1e3);
  j["ours_tflops"] = r.flops / (r.ours_us * 1e6);
  j["blas_bf16_us"] = r.blas_bf16_us;
  j["blas_fp8_us"] = r.blas_fp8_us;
  // cuBLASLt time / ours (> 1: we are faster). The weight's own class: BF16 weights against BF16
  // cuBLASLt; FP8 / FP4 weights against the faster of BF16 and FP8 cuBLASLt.
  double best = r.blas_bf16_us;
  if (r.format != "bf16" && r.blas_fp8_us > 0 && (best < 0 || r.blas_fp8_us < best)) best = r.blas_fp8_us;
  j["speed_vs_blas"] = best > 0 ? best / r.ours_us : -1.0;
  j["check_rel_vs_blas_bf16"] = r.check_rel;
  return j;
}

// Fills a weight payload + scales of `count` matrices [out, in] of format f (seeded).
Status fill_weight(WeightFormat f, uint8_t* data, int64_t payload, uint8_t* scale, int64_t scale_bytes,
                   uint64_t seed, cudaStream_t s) {
  if (f == WeightFormat::kBF16)
    return cuda::run_fill_uniform_bf16(reinterpret_cast<uint16_t*>(data), payload / 2, seed, 0.05f, s);
  DS41_RETURN_IF_ERROR(
      cuda::run_fill_bytes(data, payload, seed, 0, f == WeightFormat::kFp8Tiles ? 0xf7 : 0xff, s));
  return cuda::run_fill_bytes(scale, scale_bytes, seed + 1, 116, 7, s);  // 2^-11 .. 2^-4
}

// Dense and grouped projections (run_linear / run_grouped_linear).
Result<Row> bench_dense(Ctx& c, const Shape& sh, int64_t n) {
  const WeightFormat f = sh.format;
  const int64_t G = sh.kind == Kind::kGrouped ? sh.groups : 1;
  const int64_t out_g = sh.out / G, ldx = G * sh.in;
  const int64_t payload = quant::weight_payload_bytes(f, sh.out, sh.in);
  const int64_t scale_b = quant::weight_scale_bytes(f, sh.out, sh.in);
  const int64_t per_copy = (payload + 255) / 256 * 256 + (scale_b + 255) / 256 * 256;
  const int copies = copies_for(per_copy);
  DS41_ASSIGN_OR_RETURN(DevMem wmem, DevMem::alloc(per_copy * copies));
  std::vector<DeviceWeight> ws(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    uint8_t* d = wmem.as() + per_copy * i;
    uint8_t* sc = scale_b ? d + (payload + 255) / 256 * 256 : nullptr;
    DS41_RETURN_IF_ERROR(fill_weight(f, d, payload, sc, scale_b, 100 + static_cast<uint64_t>(i), c.stream));
    ws[static_cast<size_t>(i)] = DeviceWeight{f, sh.out, sh.in, d, sc};
  }
  DS41_ASSIGN_OR_RETURN(DevMem x, DevMem::alloc(n * ldx * 4));
  DS41_ASSIGN_OR_RETURN(DevMem y, DevMem::alloc(n * sh.out * 4));
  DS41_RETURN_IF_ERROR(cuda::run_fill_uniform_f32(x.as<float>(), n * ldx, 7, 1.0f, c.stream));
  Row r;
  r.name = sh.name;
  r.format = quant::weight_format_name(f);
  if (f == WeightFormat::kBF16) r.format = "bf16";
  r.out = sh.out;
  r.in = sh.in;
  r.groups = G;
  r.n = r.rows = n;
  r.bytes = static_cast<double>(payload + scale_b) + 4.0 * n * (ldx + sh.out);
  r.flops = 2.0 * n * sh.out * sh.in;
  auto ours = [&](int64_t i) {
    const DeviceWeight& w = ws[static_cast<size_t>(i % copies)];
    const bool inv = c.args->row_invariant;
    return G > 1 ? cuda::run_grouped_linear(w, G, x.as<float>(), n, y.as<float>(), c.stream, inv)
                 : cuda::run_linear(w, x.as<float>(), n, y.as<float>(), c.stream, inv);
  };
  DS41_ASSIGN_OR_RETURN(r.ours_us, time_us(ours, c.args->min_time_ms, c.stream));
  if (c.args->no_blas) return r;
  std::vector<float> y_ours;
  const bool check = n <= 64;
  if (check) {
    DS41_RETURN_IF_ERROR(ours(0));
    y_ours.resize(static_cast<size_t>(n * sh.out));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(y_ours.data(), y.as(), y_ours.size() * 4, cudaMemcpyDeviceToHost, c.stream),
        "copy y"));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(c.stream), "sync"));
  }
  LtProblem p;
  p.m = out_g;
  p.n = n;
  p.k = sh.in;
  p.ldb = ldx;
  p.ldc = sh.out;
  p.batch = static_cast<int32_t>(G);
  p.stride_a = out_g * sh.in;
  p.stride_b = sh.in;
  p.stride_c = out_g;
  {  // BF16: a dequantized copy of every rotated weight (same values as ours) and BF16 activations.
    const int64_t wb = sh.out * sh.in * 2;
    const int bcopies = copies_for(wb);
    DS41_ASSIGN_OR_RETURN(DevMem wbf, DevMem::alloc(wb * bcopies));
    for (int i = 0; i < bcopies; ++i) {
      const DeviceWeight& w = ws[static_cast<size_t>(i % copies)];
      uint8_t* dst = wbf.as() + wb * i;
      if (f == WeightFormat::kBF16) {
        DS41_RETURN_IF_ERROR(cuda::cuda_status(
            cudaMemcpyAsync(dst, w.data, static_cast<size_t>(wb), cudaMemcpyDeviceToDevice, c.stream),
            "copy bf16"));
      } else {
        DS41_ASSIGN_OR_RETURN(auto plan,
                              cuda::plan_fp8_tiles_dequant(sh.out, sh.in, 0, sh.out, DType::kBF16));
        DS41_RETURN_IF_ERROR(cuda::run_fp8_tiles_dequant(plan, w.data, w.scale, dst, c.stream));
      }
    }
    DS41_ASSIGN_OR_RETURN(DevMem xb, DevMem::alloc(n * ldx * 2));
    DS41_RETURN_IF_ERROR(cuda::run_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), n * ldx, c.stream));
    p.ab_type = CUDA_R_16BF;
    DS41_ASSIGN_OR_RETURN(r.blas_bf16_us,
                          time_blas(
                              c, p, bcopies, [&](int64_t i) -> const void* { return wbf.as() + wb * i; },
                              [&](int64_t) -> const void* { return xb.as(); }, y.as<float>()));
    if (check && r.blas_bf16_us > 0) {
      LtGemm g;
      Result<bool> planned = g.plan(c.lt, p, static_cast<size_t>(c.ws.bytes()), 1);
      if (planned.ok() && *planned) {
        DS41_RETURN_IF_ERROR(g.run(0, wbf.as(), xb.as(), y.as<float>(), c.ws.as(),
                                   static_cast<size_t>(c.ws.bytes()), c.stream));
        std::vector<float> yb(y_ours.size());
        DS41_RETURN_IF_ERROR(cuda::cuda_status(
            cudaMemcpyAsync(yb.data(), y.as(), yb.size() * 4, cudaMemcpyDeviceToHost, c.stream), "copy y"));
        DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(c.stream), "sync"));
        r.check_rel = rel_diff(y_ours, yb);
      }
    }
  }
  if (f == WeightFormat::kFp8Tiles) {  // FP8: the payload itself with a per-tensor scale of 1
    DS41_ASSIGN_OR_RETURN(DevMem x8, DevMem::alloc(n * ldx));
    DS41_RETURN_IF_ERROR(cuda::run_f32_to_e4m3(x.as<float>(), x8.as(), n * ldx, c.stream));
    p.ab_type = CUDA_R_8F_E4M3;
    p.scale = c.one.as<float>();
    DS41_ASSIGN_OR_RETURN(
        r.blas_fp8_us,
        time_blas(
            c, p, copies, [&](int64_t i) -> const void* { return ws[static_cast<size_t>(i)].data; },
            [&](int64_t) -> const void* { return x8.as(); }, y.as<float>()));
  }
  return r;
}

// Routed experts (run_expert_linear): n tokens, top-k of E, rotating over seeded routings.
Result<Row> bench_experts(Ctx& c, const Shape& sh, int64_t n) {
  const WeightFormat f = sh.format;
  const int64_t E = sh.groups, rows = n * sh.topk;
  const int64_t payload = quant::weight_payload_bytes(f, sh.out, sh.in);
  const int64_t scale_b = quant::weight_scale_bytes(f, sh.out, sh.in);
  DS41_ASSIGN_OR_RETURN(DevMem wdata, DevMem::alloc(payload * E));
  DS41_ASSIGN_OR_RETURN(DevMem wscale, DevMem::alloc(scale_b * E));
  DS41_RETURN_IF_ERROR(fill_weight(f, wdata.as(), payload * E, wscale.as(), scale_b * E, 300, c.stream));
  std::vector<DeviceWeight> hw(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    hw[static_cast<size_t>(e)] =
        DeviceWeight{f, sh.out, sh.in, wdata.as() + payload * e, wscale.as() + scale_b * e};
  DS41_ASSIGN_OR_RETURN(DevMem dw, DevMem::alloc(E * static_cast<int64_t>(sizeof(DeviceWeight))));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpy(dw.as(), hw.data(), hw.size() * sizeof(DeviceWeight), cudaMemcpyHostToDevice),
      "copy weights"));
  // Routings: enough that the experts they touch exceed the rotation bytes (decode), else one.
  const int routings = n <= 64 ? 8 : 1;
  std::vector<int64_t> offs;
  double used_sum = 0;
  for (int r = 0; r < routings; ++r) {
    const auto o = route(n, sh.topk, E, 1000 + static_cast<uint64_t>(r) * 7 + static_cast<uint64_t>(n));
    for (int64_t e = 0; e < E; ++e)
      used_sum += o[static_cast<size_t>(e + 1)] > o[static_cast<size_t>(e)] ? 1 : 0;
    offs.insert(offs.end(), o.begin(), o.end());
  }
  const double used = used_sum / routings;
  DS41_ASSIGN_OR_RETURN(DevMem doff, DevMem::alloc(static_cast<int64_t>(offs.size()) * 8));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpy(doff.as(), offs.data(), offs.size() * 8, cudaMemcpyHostToDevice), "copy offsets"));
  const int64_t used_i = std::max<int64_t>(1, std::llround(used));
  const int64_t m_e = (rows + used_i - 1) / used_i;  // cuBLASLt reference: rows per used expert
  const int64_t xrows = std::max(rows, used_i * m_e);
  DS41_ASSIGN_OR_RETURN(DevMem x, DevMem::alloc(xrows * sh.in * 4));
  DS41_ASSIGN_OR_RETURN(DevMem y, DevMem::alloc(xrows * sh.out * 4));
  DS41_RETURN_IF_ERROR(cuda::run_fill_uniform_f32(x.as<float>(), xrows * sh.in, 9, 1.0f, c.stream));
  Row r;
  r.name = sh.name;
  r.format = quant::weight_format_name(f);
  r.out = sh.out;
  r.in = sh.in;
  r.groups = E;
  r.n = n;
  r.rows = rows;
  r.bytes = used * static_cast<double>(payload + scale_b) + 4.0 * rows * (sh.in + sh.out);
  r.flops = 2.0 * rows * sh.out * sh.in;
  auto ours = [&](int64_t i) {
    return cuda::run_expert_linear(dw.as<DeviceWeight>(), E, sh.out, sh.in,
                                   doff.as<int64_t>() + (i % routings) * (E + 1), x.as<float>(), rows,
                                   y.as<float>(), c.stream, f);
  };
  DS41_ASSIGN_OR_RETURN(r.ours_us, time_us(ours, c.args->min_time_ms, c.stream));
  if (c.args->no_blas) return r;
  LtProblem p;
  p.m = sh.out;
  p.n = m_e;
  p.k = sh.in;
  p.ldb = sh.in;
  p.ldc = sh.out;
  p.batch = static_cast<int32_t>(used_i);
  p.stride_a = sh.out * sh.in;
  p.stride_b = m_e * sh.in;
  p.stride_c = m_e * sh.out;
  // Rotation: routing r uses experts [start, start + used) of the E copies.
  const int64_t span = std::max<int64_t>(1, E - used_i + 1);
  auto start = [&](int64_t i) { return ((i % routings) * used_i) % span; };
  {
    const int64_t wb = sh.out * sh.in * 2;
    DS41_ASSIGN_OR_RETURN(DevMem wbf, DevMem::alloc(wb * E));
    DS41_ASSIGN_OR_RETURN(auto plan,
                          cuda::plan_fp4_rows_dequant(E * sh.out, sh.in, 0, E * sh.out, DType::kBF16));
    DS41_RETURN_IF_ERROR(cuda::run_fp4_rows_dequant(plan, wdata.as(), wscale.as(), wbf.as(), c.stream));
    DS41_ASSIGN_OR_RETURN(DevMem xb, DevMem::alloc(xrows * sh.in * 2));
    DS41_RETURN_IF_ERROR(cuda::run_f32_to_bf16(x.as<float>(), xb.as<uint16_t>(), xrows * sh.in, c.stream));
    p.ab_type = CUDA_R_16BF;
    DS41_ASSIGN_OR_RETURN(
        r.blas_bf16_us,
        time_blas(
            c, p, routings, [&](int64_t i) -> const void* { return wbf.as() + wb * start(i); },
            [&](int64_t) -> const void* { return xb.as(); }, y.as<float>()));
  }
  {  // FP8 (E2M1 x E8M0 is exact in E4M3 for these scales): timing on a seeded E4M3 copy
    const int64_t wb = sh.out * sh.in;
    DS41_ASSIGN_OR_RETURN(DevMem w8, DevMem::alloc(wb * E));
    DS41_RETURN_IF_ERROR(cuda::run_fill_bytes(w8.as(), wb * E, 77, 0, 0xf7, c.stream));
    DS41_ASSIGN_OR_RETURN(DevMem x8, DevMem::alloc(xrows * sh.in));
    DS41_RETURN_IF_ERROR(cuda::run_f32_to_e4m3(x.as<float>(), x8.as(), xrows * sh.in, c.stream));
    p.ab_type = CUDA_R_8F_E4M3;
    p.scale = c.one.as<float>();
    DS41_ASSIGN_OR_RETURN(
        r.blas_fp8_us, time_blas(
                           c, p, routings, [&](int64_t i) -> const void* { return w8.as() + wb * start(i); },
                           [&](int64_t) -> const void* { return x8.as(); }, y.as<float>()));
  }
  return r;
}

// Bandwidth of the streaming copy kernel over 2 x 1 GiB (read + write bytes per second, GB/s).
Result<double> copy_bandwidth(Ctx& c) {
  const int64_t floats = int64_t{1} << 28;
  DS41_ASSIGN_OR_RETURN(DevMem a, DevMem::alloc(floats * 4));
  DS41_ASSIGN_OR_RETURN(DevMem b, DevMem::alloc(floats * 4));
  DS41_RETURN_IF_ERROR(cuda::run_fill_uniform_f32(a.as<float>(), floats, 1, 1.0f, c.stream));
  auto fn = [&](int64_t i) {
    return i % 2 ? cuda::run_copy_f32(b.as<float>(), a.as<float>(), floats, c.stream)
                 : cuda::run_copy_f32(a.as<float>(), b.as<float>(), floats, c.stream);
  };
  DS41_ASSIGN_OR_RETURN(double us, time_us(fn, std::max(50.0, c.args->min_time_ms), c.stream));
  return 2.0 * floats * 4 / (us * 1e3);
}

Status run_bench(const KernelsBenchArgs& a) {
  if (cuda::cuda_device_count() == 0) return unavailable("no CUDA device");
  Ctx c;
  c.args = &a;
  DS41_RETURN_IF_ERROR(
      cuda::cuda_status(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "stream"));
  if (cublasLtCreate(&c.lt) != CUBLAS_STATUS_SUCCESS) return internal_error("cublasLtCreate failed");
  DS41_ASSIGN_OR_RETURN(c.ws, DevMem::alloc(int64_t{64} << 20));
  DS41_ASSIGN_OR_RETURN(c.one, DevMem::alloc(16));
  const float one = 1.0f;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaMemcpy(c.one.as(), &one, 4, cudaMemcpyHostToDevice), "copy"));
  DS41_ASSIGN_OR_RETURN(c.copy_gbs, copy_bandwidth(c));

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::ordered_json dev, cfg;
  dev["gpu"] = prop.name;
  dev["sms"] = prop.multiProcessorCount;
  dev["copy_gbs"] = c.copy_gbs;
  dev["cublaslt_version"] = static_cast<int64_t>(cublasLtGetVersion());
  cfg["ns"] = a.ns;
  cfg["min_time_ms"] = a.min_time_ms;
  cfg["row_invariant"] = a.row_invariant;
  cfg["blas_algos"] = a.blas_algos;
  cfg["rotate_bytes"] = kRotateBytes;
  nlohmann::ordered_json out = bench_header<nlohmann::ordered_json>("kernels", dev, cfg);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::vector<Shape> todo;
  for (const Shape& sh : shapes())
    if (a.only.empty() || std::find(a.only.begin(), a.only.end(), sh.name) != a.only.end())
      todo.push_back(sh);
  // Progress on stderr between measurements (plain lines off a terminal, nothing with -q).
  const uint64_t total = todo.size() * a.ns.size();
  uint64_t done = 0;
  LoadProgress progress(stderr, LoadProgress::mode_for_stderr(), "ds41 bench kernels", "shapes");
  progress.update(0, total);
  for (const Shape& sh : todo) {
    for (int64_t n : a.ns) {
      Result<Row> r = sh.kind == Kind::kExperts ? bench_experts(c, sh, n) : bench_dense(c, sh, n);
      if (!r.ok())
        return Status(r.status().code(),
                      std::string(sh.name) + " n=" + std::to_string(n) + ": " + r.status().message());
      results.push_back(to_json(*r, c.copy_gbs));
      progress.update(++done, total);
    }
  }
  out["results"] = std::move(results);
  std::cout << (a.json ? out.dump() : out.dump(2)) << "\n";
  cublasLtDestroy(c.lt);
  cudaStreamDestroy(c.stream);
  return ok_status();
}

#else  // !DS41_BENCH_CUDA

Status run_bench(const KernelsBenchArgs&) {
  return unavailable("this ds41 was built without CUDA (DS41_CUDA=OFF): no kernels to benchmark");
}

#endif

void setup_bench(CLI::App& parent, int& exit_code) {
  auto a = std::make_shared<KernelsBenchArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "kernels", "CUDA matrix kernels at the released widths vs the HBM roofline and cuBLASLt");
  cmd->add_option("--device", a->device, "cuda (the only device this benchmark runs on)");
  cmd->add_option("--n", a->ns, "Token counts (default 1 8 64 4096)");
  cmd->add_option(
      "--only", a->only,
      "Shapes to run (wq_a wq_b wkv wo_a wo_b gate shared_w1 shared_w2 experts_w1 experts_w2 head)");
  cmd->add_option("--min-time-ms", a->min_time_ms, "Timed milliseconds per measurement (default 20)");
  cmd->add_option("--blas-algos", a->blas_algos,
                  "cuBLASLt heuristic algorithms timed, fastest kept (default 3)");
  cmd->add_flag("--no-blas", a->no_blas, "Skip the cuBLASLt references");
  cmd->add_flag("--json", a->json, "One-line JSON");
  cmd->add_flag("--row-invariant", a->row_invariant,
                "Dense calls with row_invariant (the GPU engine's decode steps and DSpark verifications: "
                "the tensor-core GEMV at every n)");
  cmd->callback([a, &exit_code] {
    if (a->device != "cuda") {
      std::cerr << "ds41 bench kernels: --device must be cuda, got '" << a->device << "'\n";
      exit_code = 2;
      return;
    }
    for (int64_t n : a->ns)
      if (n <= 0 || n > 65536) {
        std::cerr << "ds41 bench kernels: --n values must be in [1, 65536]\n";
        exit_code = 2;
        return;
      }
    Status s = run_bench(*a);
    if (!s.ok()) {
      std::cerr << "ds41 bench kernels: " << s.message() << "\n";
      exit_code = 1;
    }
  });
}

}  // namespace cmd_bench_kernels
}  // namespace

DS41_REGISTER_BENCH("kernels", ::ds41::cli::cmd_bench_kernels::setup_bench);

}  // namespace ds41::cli
