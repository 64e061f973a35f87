// ds41 gpu: TensorCoreLinear — the prefill linears (many rows) on the tensor cores through cuBLAS,
// with the oracle's numerics kept (docs/gpu_kernels.md "Prefill on tensor cores"):
//   - the weight is decoded exactly to bfloat16 into a scratch buffer (FP8 32x32 tiles, FP4 rows
//     and BF16 values are all exact in bfloat16; never a resident dequantized copy: the scratch
//     holds one dense weight, or one batch of routed experts, at a time);
//   - x is split into three bfloat16 parts (hi + lo + lo2 = x to fp32 precision,
//     backends/cuda/tc_prep_kernels.h) stacked as 3n rows, ONE BF16 GEMM with fp32 accumulation
//     multiplies them, and the three partial products are summed back;
//   - or, for FP8-tile / FP4-row weights (opt-in, TensorCoreLimits::split_parts 2), the weight is
//     decoded into fp16 with a power-of-two shift per matrix and x split into two fp16 parts with a
//     power-of-two shift per row (11 + 11 bits: x to within one ulp), one FP16 GEMM of 2n rows,
//     and the two products summed and unscaled (tc_prep_kernels.h has the bounds);
//   so the result differs from the CPU op only in the order of fp32 additions (and, in the fp16
//   split, by at most one ulp of an x element, as the CPU's own product rounding does); the
//   parity rows are tests/gpu/model/tensor_core_linear_test.cpp.
// Used by GpuForward for calls with >= min_rows rows (prefill chunks); decode keeps the GEMV
// kernels (bandwidth-bound, no split needed). The routed-expert path reads the per-expert row
// counts back to the host (one synchronisation per call): prefill steps are not graph-captured.
//
// Thread model: one per engine stream (not thread-safe). Buffers are allocated once at creation.
// With expert streams (TensorCoreLimits::expert_streams) it also owns a decode stream and n GEMM
// streams with their cuBLAS handles; every call returns with the engine stream joined to them, so
// callers see plain stream order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/cuda/device_weight.h"
#include "backends/cuda/expert_gemm_kernels.h"
#include "core/status.h"
#include "gpu/device_buffer.h"

namespace ds41::gpu {

struct TensorCoreLimits {
  int64_t min_rows = 128;   // calls with fewer rows are refused (accepts() false): GEMV / tiles
  int64_t max_rows = 2048;  // rows of one dense call (a forward's tokens)
  int64_t max_in = 0, max_out = 0;     // widths of the dense weights that may run here
  int64_t max_expert_rows = 0;         // rows of one expert call (tokens x experts per token)
  int64_t expert_out = 0, expert_in = 0;  // the routed experts' widths (w1/w3: I x H, w2: H x I)
  int64_t n_experts = 0;
  int64_t weight_scratch_bytes = int64_t{1} << 30;  // bf16 weight scratch (>= the largest dense weight)
  // false: BF16 weights only (the vision tower): no decode scratch is allocated, and FP8 / FP4
  // weights are not accepted.
  bool decode_weights = true;
  // 3: every weight takes the three-part bfloat16 split (3 MMA passes; the default). 2: FP8-tile /
  // FP4-row weights take the two-part fp16 split (backends/cuda/tc_prep_kernels.h: 2 passes, ~10 %
  // faster prefill on the H200) — opt-in: its results differ from the three parts' by float noise
  // (x kept to one ulp instead of exactly), and that noise flipped a fake-quantization midpoint in
  // the public golden decode after a 297-row prefill (GpuGolden.PromptsSelectionsAndDecode, e_r
  // 0.47 on the H200), where the three parts pass. BF16 weights always take the three parts.
  // GpuForward reads DS41_TC_SPLIT (2 opts in).
  int split_parts = 3;
  // Three parts on a dense or grouped weight: true accumulates the parts in the GEMM epilogue
  // (C = x2 W; C = x1 W + C; C = x0 W + C, beta 1: the sums of run_sum3's order x0 W + (x1 W + x2 W))
  // instead of one GEMM over the stacked parts writing three outputs that run_sum3 then reads
  // (ncu: sum3 was 5 % of a 16K prefill chunk). The experts keep the stacked form (one GEMM per
  // expert, not three). GpuForward reads DS41_TC_ACCUMULATE (0 turns it off, for A/B runs).
  bool accumulate_parts = true;
  // Routed experts on the three bfloat16 parts: n >= 1 spreads the per-expert GEMMs over n streams
  // (each its own cuBLAS handle and workspace, configured as the engine's), with the experts'
  // decode into the weight scratch on its own stream, double-buffered, so that one batch's decode
  // runs under the previous batch's GEMMs and small experts' GEMMs (a few rows: latency-bound
  // launches of ~100 CTAs) run side by side. Each GEMM is the same cuBLAS call on the same data as
  // in order, so the bits do not depend on n (TensorCoreLinear.ExpertStreamsKeepTheBits). 0: every
  // launch on the engine stream in order (a grouped cuBLAS call when the library takes it).
  // GpuForward reads DS41_TC_EXPERT_STREAMS.
  int expert_streams = 4;
  // FP4 routed experts on the three parts: true runs them as ONE grouped GEMM on the tensor cores that
  // reads the packed E2M1 rows and E8M0 scales in place (backends/cuda/expert_gemm_kernels.h: the decode
  // GEMV's numerics, no per-chunk decode into the scratch, no per-expert cuBLAS launches) when every
  // scale byte of the call's experts lies in the kernel's window (counted on the device in the same
  // synchronisation as the offsets: real checkpoints' scales do); otherwise, and for other formats, the
  // decode and cuBLAS above. GpuForward reads DS41_TC_FP4_GEMM (0 turns it off, for A/B runs).
  bool fp4_expert_gemm = true;
  // ... for calls of at most this many routed rows per expert on average (m <= this x E): measured on the
  // H100 (docs/perf/README.md, session of 2026-12-06 18:08 UTC), the GEMM made a prefill at chunk 2048 (32
  // rows per expert) 20 % faster and one at chunk 4096 (64 rows) 8 % slower than the decode and cuBLAS,
  // whose per-chunk decode is then amortized over twice the rows. GpuForward reads DS41_TC_FP4_GEMM_ROWS.
  int64_t fp4_gemm_rows_per_expert = 48;
};

class TensorCoreLinear {
 public:
  static Result<std::unique_ptr<TensorCoreLinear>> create(const TensorCoreLimits& lim, cudaStream_t stream);
  ~TensorCoreLinear();
  TensorCoreLinear(const TensorCoreLinear&) = delete;
  TensorCoreLinear& operator=(const TensorCoreLinear&) = delete;

  // Whether this path takes w for n rows (a decodable format, n in [min_rows, max_rows], widths
  // within the buffers, aligned payload).
  bool accepts(const cuda::DeviceWeight& w, int64_t n) const;
  // y[n, out] = x[n, in] . W^T (as cuda::run_linear). x_bf16_exact: every x value is exact in bfloat16
  // (--numerics fp8-act's quantized inputs, quant/act_quant.h), so the bfloat16 path multiplies its first
  // part only (lo and lo2 are zero: the same products and sums as the three parts', one MMA pass).
  Status linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y, bool x_bf16_exact = false);
  // MODEL_SPEC 3.4.8 grouped projection (as cuda::run_grouped_linear).
  bool accepts_grouped(const cuda::DeviceWeight& w, int64_t groups, int64_t n) const;
  Status grouped_linear(const cuda::DeviceWeight& w, int64_t groups, const float* x, int64_t n, float* y,
                        bool x_bf16_exact = false);
  // Routed experts (as cuda::run_expert_linear): host copies of the expert weights (for the
  // formats and pointers), the same weights as a DEVICE array, device offsets [E + 1].
  bool accepts_experts(const std::vector<cuda::DeviceWeight>& w, int64_t out_dim, int64_t in_dim,
                       int64_t m_max) const;
  // x_quantized: x's rows are --numerics fp8-act's quantized inputs (E4M3 values times powers of two), so the
  // FP4 expert GEMM takes one f16 part per row (cuda::kExpertGemmRows1; the three parts' bits).
  Status expert_linear(const std::vector<cuda::DeviceWeight>& w, const cuda::DeviceWeight* d_w, int64_t out_dim,
                       int64_t in_dim, const int64_t* offsets, const float* x, int64_t m_max, float* y,
                       bool x_quantized = false);
  // Two expert matrices of one shape over the same routed rows (the MoE's w1 and w3): one offsets
  // read-back and one split of x for both; y = x . W^T, y2 = x . W2^T, each as expert_linear.
  // w2 null: expert_linear. x_rows (device int64 [m], optional): routed row i is x row x_rows[i]
  // (the MoE's permutation: the split reads the token rows, no gathered copy); null: row i.
  Status expert_linear_pair(const std::vector<cuda::DeviceWeight>& w, const std::vector<cuda::DeviceWeight>* w2,
                            const cuda::DeviceWeight* d_w, const cuda::DeviceWeight* d_w2, int64_t out_dim,
                            int64_t in_dim, const int64_t* offsets, const float* x, int64_t m_max, float* y,
                            float* y2, const int64_t* x_rows = nullptr, bool x_quantized = false);

 private:
  TensorCoreLinear() = default;
  Status dequant(const cuda::DeviceWeight& w, const __nv_bfloat16** wb);
  // The fp16 path for this weight (split_parts 2 and a format it takes).
  bool f16(const cuda::DeviceWeight& w) const;
  // y_p [rows_p, out] = x_p [rows_p, in] . W^T; 16-bit inputs of type dtype (a cudaDataType_t:
  // CUDA_R_16BF or CUDA_R_16F), fp32 products; beta 1 adds y_p's values (fp32: fl(x W + y_p)).
  Status gemm(const void* w, int64_t out, int64_t in, const void* xp, int64_t rows_p, float* yp, int dtype,
              float beta = 0.0f);
  // The GEMMs of one batch of experts (ids[b0 .. b0 + cnt), weights decoded at wscratch, x in
  // `parts` stacked parts of type dtype): one grouped cuBLAS call when the library takes it, else
  // one GEMM per expert.
  Status expert_gemms(const int64_t* off, const int32_t* ids, int64_t b0, int64_t cnt, int64_t out, int64_t in,
                      int parts, int dtype, int64_t slot0);
  // The three-part expert GEMMs of `mats` matrices (dws / outs) on the expert streams (see
  // TensorCoreLimits::expert_streams): x3_ already holds the split rows, ids_ the `used` expert ids.
  Status expert_gemms_streams(const int64_t* off, const int32_t* ids, int64_t used, int mats,
                              const cuda::DeviceWeight* const* dws, float* const* outs, int64_t out, int64_t in,
                              const int64_t* offsets, int64_t E);
  // Whether the FP4 expert GEMM may take these experts (and w2's): the switch, three parts, FP4 rows of a
  // shape it takes, aligned payloads and scales (the scale window is checked on the device).
  bool fp4_gemm_eligible(const std::vector<cuda::DeviceWeight>& w, const std::vector<cuda::DeviceWeight>* w2,
                         int64_t out_dim, int64_t in_dim, int64_t m_max) const;
  // The FP4 expert GEMM of the routed rows off[0 .. E] (host offsets, read back): units uploaded, x split
  // into the kernel's fragments (x_rows as in expert_linear_pair), one launch for the matrix or the pair.
  // form: kWgmma where expert_gemm_wgmma() holds and the scale check found no step spanning more than 15.
  Status fp4_gemm(const int64_t* off, int64_t E, const cuda::DeviceWeight* d_w, const cuda::DeviceWeight* d_w2,
                  int64_t out_dim, int64_t in_dim, const float* x, const int64_t* x_rows, float* y, float* y2,
                  bool one_part, cuda::ExpertGemmForm form);
  // gemm() on a given cuBLAS handle (an expert stream's).
  Status gemm_on(void* handle, const void* w, int64_t out, int64_t in, const void* xp, int64_t rows_p, float* yp,
                 int dtype, float beta = 0.0f);

  TensorCoreLimits lim_;
  cudaStream_t stream_ = nullptr;
  void* handle_ = nullptr;  // cublasHandle_t
  DeviceBuffer x3_, y3_, wscratch_, blas_ws_, ids_;
  DeviceBuffer row_shift_;  // fp16 split: tau per row (max of the dense and expert row counts)
  DeviceBuffer w_shift_;    // fp16 split: sigma per band of 32 output rows, per expert id, then the dense weight's
  int64_t dense_shift_at_ = 0;  // where the dense weight's bands start in w_shift_
  int64_t shift_rows_ = 0;      // rows of row_shift_
  PinnedBuffer offsets_host_, ids_host_;
  DeviceBuffer units_;         // FP4 expert GEMM: its units (cuda::ExpertGemmUnit), uploaded per call
  PinnedBuffer units_host_;
  DeviceBuffer window_count_;  // FP4 expert GEMM: scale bytes outside the kernel's window, wide steps (2 int32)
  PinnedBuffer window_host_;
  DeviceBuffer ptrs_;    // grouped GEMM: device arrays of A / B / C pointers, 3 x n_experts per matrix of a pair
  PinnedBuffer ptrs_host_;
  bool grouped_ok_ = true;  // cleared when cuBLAS refuses the grouped call (then per-expert GEMMs)
  // The expert streams: a stream, a cuBLAS handle on it with its own workspace, and per scratch
  // buffer the event "this stream's GEMMs of the batch in that buffer are issued before here".
  struct ExpertStream {
    cudaStream_t stream = nullptr;
    void* handle = nullptr;
    DeviceBuffer ws;
    cudaEvent_t freed[2] = {nullptr, nullptr};
  };
  std::vector<ExpertStream> xs_;
  cudaStream_t decode_stream_ = nullptr;  // the experts' decode into the scratch buffers
  cudaEvent_t fork_ = nullptr, decoded_[2] = {nullptr, nullptr}, summed_ = nullptr;
  std::vector<double> lane_load_;  // per expert stream: rows assigned (host scratch, sized once)
};

}  // namespace ds41::gpu
