// ds41 gpu: TensorCoreLinear (tensor_core_linear.h).
#include "gpu/tensor_core_linear.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/expert_gemm_kernels.h"
#include "backends/cuda/tc_prep_kernels.h"
#include "backends/cuda/weight_dequant.h"

namespace ds41::gpu {
namespace {

using quant::WeightFormat;

cublasHandle_t H(void* h) { return static_cast<cublasHandle_t>(h); }

Status blas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusName(s) + " (" +
                        cublasGetStatusString(s) + ")");
}

bool decodable(WeightFormat f) {
  return f == WeightFormat::kFp8Tiles || f == WeightFormat::kFp4Rows || f == WeightFormat::kBF16;
}

// BF16 weights are read in place (no decode into the scratch).
bool fits_scratch(const cuda::DeviceWeight& w, size_t scratch_bytes) {
  return w.format == WeightFormat::kBF16 ||
         static_cast<size_t>(w.out_dim * w.in_dim) * sizeof(__nv_bfloat16) <= scratch_bytes;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rows of one dense chunk that fit the stacked buffers for these widths.
int64_t rows_fitting(size_t x3_bytes, size_t y3_bytes, int64_t in, int64_t out) {
  const int64_t by_x = static_cast<int64_t>(x3_bytes / (3 * sizeof(__nv_bfloat16) * static_cast<size_t>(in)));
  const int64_t by_y = static_cast<int64_t>(y3_bytes / (3 * sizeof(float) * static_cast<size_t>(out)));
  return std::min(by_x, by_y);
}

}  // namespace

Result<std::unique_ptr<TensorCoreLinear>> TensorCoreLinear::create(const TensorCoreLimits& lim,
                                                                   cudaStream_t stream) {
  if (lim.min_rows < 1 || lim.max_rows < lim.min_rows || lim.max_in <= 0 || lim.max_out <= 0)
    return invalid_argument("tensor-core linears: limits out of range (min_rows " + std::to_string(lim.min_rows) +
                            ", max_rows " + std::to_string(lim.max_rows) + ")");
  std::unique_ptr<TensorCoreLinear> t(new TensorCoreLinear());
  t->lim_ = lim;
  t->stream_ = stream;
  const int64_t ew = std::max(lim.expert_out, lim.expert_in);
  const size_t x_elems = static_cast<size_t>(
      std::max(lim.max_rows * lim.max_in, lim.max_expert_rows * ew));
  const size_t y_elems = static_cast<size_t>(
      std::max(lim.max_rows * lim.max_out, lim.max_expert_rows * ew));
  DS41_ASSIGN_OR_RETURN(t->x3_, DeviceBuffer::allocate(3 * x_elems * sizeof(__nv_bfloat16),
                                                       "tensor-core linears: split activations"));
  DS41_ASSIGN_OR_RETURN(t->y3_, DeviceBuffer::allocate(3 * y_elems * sizeof(float),
                                                       "tensor-core linears: partial products"));
  const size_t wmin = static_cast<size_t>(std::max(lim.max_in * lim.max_out, lim.expert_in * lim.expert_out)) *
                      sizeof(__nv_bfloat16);
  if (lim.decode_weights) {
    DS41_ASSIGN_OR_RETURN(
        t->wscratch_, DeviceBuffer::allocate(std::max(wmin, static_cast<size_t>(lim.weight_scratch_bytes)),
                                             "tensor-core linears: bf16 weight scratch"));
  }
  DS41_ASSIGN_OR_RETURN(t->blas_ws_, DeviceBuffer::allocate(size_t{32} << 20, "cuBLAS workspace"));
  const int64_t E = std::max<int64_t>(lim.n_experts, 1);
  DS41_ASSIGN_OR_RETURN(t->ids_, DeviceBuffer::allocate(static_cast<size_t>(E) * sizeof(int32_t),
                                                        "tensor-core linears: expert ids"));
  DS41_ASSIGN_OR_RETURN(t->offsets_host_, PinnedBuffer::allocate(static_cast<size_t>(E + 1) * sizeof(int64_t),
                                                                 "tensor-core linears: expert offsets"));
  DS41_ASSIGN_OR_RETURN(t->ids_host_, PinnedBuffer::allocate(static_cast<size_t>(E) * sizeof(int32_t),
                                                             "tensor-core linears: expert ids"));
  DS41_ASSIGN_OR_RETURN(t->ptrs_, DeviceBuffer::allocate(static_cast<size_t>(6 * E) * sizeof(void*),
                                                         "tensor-core linears: grouped GEMM pointers"));
  DS41_ASSIGN_OR_RETURN(t->ptrs_host_, PinnedBuffer::allocate(static_cast<size_t>(6 * E) * sizeof(void*),
                                                              "tensor-core linears: grouped GEMM pointers"));
  const int64_t max_units = cuda::expert_gemm_max_units(std::max<int64_t>(lim.max_expert_rows, 1), E);
  DS41_ASSIGN_OR_RETURN(t->units_, DeviceBuffer::allocate(static_cast<size_t>(max_units) * sizeof(cuda::ExpertGemmUnit),
                                                          "tensor-core linears: FP4 expert GEMM units"));
  DS41_ASSIGN_OR_RETURN(t->units_host_, PinnedBuffer::allocate(
                                            static_cast<size_t>(max_units) * sizeof(cuda::ExpertGemmUnit),
                                            "tensor-core linears: FP4 expert GEMM units"));
  DS41_ASSIGN_OR_RETURN(t->window_count_, DeviceBuffer::allocate(2 * sizeof(int32_t), "tensor-core linears: scale check"));
  DS41_ASSIGN_OR_RETURN(t->window_host_, PinnedBuffer::allocate(2 * sizeof(int32_t), "tensor-core linears: scale check"));
  if (lim.split_parts != 2 && lim.split_parts != 3)
    return invalid_argument("tensor-core linears: split_parts must be 2 or 3, got " +
                            std::to_string(lim.split_parts));
  t->shift_rows_ = std::max(lim.max_rows, lim.max_expert_rows);
  DS41_ASSIGN_OR_RETURN(t->row_shift_, DeviceBuffer::allocate(static_cast<size_t>(t->shift_rows_) * sizeof(int32_t),
                                                              "tensor-core linears: row shifts"));
  t->dense_shift_at_ = E * ((ew + 31) / 32);
  DS41_ASSIGN_OR_RETURN(t->w_shift_, DeviceBuffer::allocate(
                                         static_cast<size_t>(t->dense_shift_at_ + (lim.max_out + 31) / 32) *
                                             sizeof(int32_t),
                                         "tensor-core linears: weight shifts"));
  cublasHandle_t h = nullptr;
  DS41_RETURN_IF_ERROR(blas_status(cublasCreate(&h), "create"));
  t->handle_ = h;
  DS41_RETURN_IF_ERROR(blas_status(cublasSetStream(h, stream), "set stream"));
  DS41_RETURN_IF_ERROR(blas_status(cublasSetWorkspace(h, t->blas_ws_.data(), t->blas_ws_.size()), "set workspace"));
  // Full fp32 accumulation: no reduced-precision split-K reductions.
  DS41_RETURN_IF_ERROR(blas_status(
      cublasSetMathMode(h, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                     CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      "set math mode"));
  if (lim.expert_streams < 0 || lim.expert_streams > 16)
    return invalid_argument("tensor-core linears: expert_streams must be in [0, 16], got " +
                            std::to_string(lim.expert_streams));
  if (lim.expert_streams > 0 && lim.n_experts > 0 && lim.decode_weights) {
    auto ev = [](cudaEvent_t* e) {
      return cuda::cuda_status(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "tensor-core linears: event");
    };
    DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&t->decode_stream_, cudaStreamNonBlocking),
                                           "tensor-core linears: decode stream"));
    DS41_RETURN_IF_ERROR(ev(&t->fork_));
    DS41_RETURN_IF_ERROR(ev(&t->summed_));
    for (cudaEvent_t& e : t->decoded_) DS41_RETURN_IF_ERROR(ev(&e));
    t->xs_.resize(static_cast<size_t>(lim.expert_streams));
    t->lane_load_.assign(t->xs_.size(), 0.0);
    for (ExpertStream& x : t->xs_) {
      DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking),
                                             "tensor-core linears: expert stream"));
      for (cudaEvent_t& e : x.freed) DS41_RETURN_IF_ERROR(ev(&e));
      DS41_ASSIGN_OR_RETURN(x.ws, DeviceBuffer::allocate(t->blas_ws_.size(), "cuBLAS workspace (expert stream)"));
      cublasHandle_t xh = nullptr;
      DS41_RETURN_IF_ERROR(blas_status(cublasCreate(&xh), "create (expert stream)"));
      x.handle = xh;
      // The engine handle's configuration: the same heuristics pick the same kernels.
      DS41_RETURN_IF_ERROR(blas_status(cublasSetStream(xh, x.stream), "set stream"));
      DS41_RETURN_IF_ERROR(blas_status(cublasSetWorkspace(xh, x.ws.data(), x.ws.size()), "set workspace"));
      DS41_RETURN_IF_ERROR(blas_status(
          cublasSetMathMode(xh, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
          "set math mode"));
    }
  }
  return t;
}

TensorCoreLinear::~TensorCoreLinear() {
  // The engine stream's work (joined with the expert streams' at the end of every call) first.
  if (!xs_.empty()) cudaStreamSynchronize(stream_);
  for (ExpertStream& x : xs_) {
    if (x.stream) cudaStreamSynchronize(x.stream);
    if (x.handle) cublasDestroy(H(x.handle));
    for (cudaEvent_t e : x.freed)
      if (e) cudaEventDestroy(e);
    if (x.stream) cudaStreamDestroy(x.stream);
  }
  for (cudaEvent_t e : {fork_, decoded_[0], decoded_[1], summed_})
    if (e) cudaEventDestroy(e);
  if (decode_stream_) {
    cudaStreamSynchronize(decode_stream_);
    cudaStreamDestroy(decode_stream_);
  }
  if (handle_) cublasDestroy(H(handle_));
}

bool TensorCoreLinear::accepts(const cuda::DeviceWeight& w, int64_t n) const {
  if (!decodable(w.format) || n < lim_.min_rows) return false;
  if (w.out_dim > lim_.max_out || w.in_dim > lim_.max_in) return false;
  if (!fits_scratch(w, wscratch_.size())) return false;
  if (w.format == WeightFormat::kFp4Rows && w.in_dim % 32 != 0) return false;
  return rows_fitting(x3_.size(), y3_.size(), w.in_dim, w.out_dim) >= 1;
}

bool TensorCoreLinear::accepts_grouped(const cuda::DeviceWeight& w, int64_t groups, int64_t n) const {
  if (groups < 1 || w.out_dim % groups != 0) return false;
  if (!decodable(w.format) || n < lim_.min_rows) return false;
  const int64_t in_total = w.in_dim * groups;  // x row width
  if (!fits_scratch(w, wscratch_.size())) return false;
  return rows_fitting(x3_.size(), y3_.size(), in_total, w.out_dim) >= 1;
}

Status TensorCoreLinear::dequant(const cuda::DeviceWeight& w, const __nv_bfloat16** wb) {
  __nv_bfloat16* out = wscratch_.as<__nv_bfloat16>();
  switch (w.format) {
    case WeightFormat::kBF16:
      *wb = reinterpret_cast<const __nv_bfloat16*>(w.data);
      return ok_status();
    case WeightFormat::kFp8Tiles: {
      DS41_ASSIGN_OR_RETURN(cuda::WeightDequantPlan p,
                            cuda::plan_fp8_tiles_dequant(w.out_dim, w.in_dim, 0, w.out_dim, DType::kBF16));
      DS41_RETURN_IF_ERROR(cuda::run_fp8_tiles_dequant(p, w.data, w.scale, out, stream_));
      break;
    }
    case WeightFormat::kFp4Rows: {
      DS41_ASSIGN_OR_RETURN(cuda::WeightDequantPlan p,
                            cuda::plan_fp4_rows_dequant(w.out_dim, w.in_dim, 0, w.out_dim, DType::kBF16));
      DS41_RETURN_IF_ERROR(cuda::run_fp4_rows_dequant(p, w.data, w.scale, out, stream_));
      break;
    }
    default:
      return invalid_argument("tensor-core linears: weight format not decodable to bfloat16");
  }
  *wb = out;
  return ok_status();
}

bool TensorCoreLinear::f16(const cuda::DeviceWeight& w) const {
  // (out_dim <= max_out: the dense weight's bands fit w_shift_.)
  return lim_.split_parts == 2 && lim_.decode_weights && w.out_dim <= lim_.max_out && cuda::f16_split_supported(w);
}

// yp [rows_p, out] (row-major) = xp [rows_p, in] . W^T, W [out, in] 16-bit row-major. Column-major
// views: yp' (out x rows_p) = W' ^T (W' = in x out) . xp' (in x rows_p).
Status TensorCoreLinear::gemm(const void* w, int64_t out, int64_t in, const void* xp, int64_t rows_p, float* yp,
                              int dtype, float beta) {
  return gemm_on(handle_, w, out, in, xp, rows_p, yp, dtype, beta);
}

Status TensorCoreLinear::gemm_on(void* handle, const void* w, int64_t out, int64_t in, const void* xp,
                                 int64_t rows_p, float* yp, int dtype, float beta) {
  const float one = 1.0f;
  const cudaDataType_t t = static_cast<cudaDataType_t>(dtype);
  return blas_status(cublasGemmEx(H(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                                  static_cast<int>(rows_p), static_cast<int>(in), &one, w, t, static_cast<int>(in),
                                  xp, t, static_cast<int>(in), &beta, yp, CUDA_R_32F, static_cast<int>(out),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "GemmEx");
}

Status TensorCoreLinear::linear(const cuda::DeviceWeight& w, const float* x, int64_t n, float* y, bool x_bf16_exact) {
  if (!accepts(w, n)) return invalid_argument("tensor-core linears: this weight / row count is not accepted");
  if (f16(w)) {
    const int64_t in = w.in_dim, out = w.out_dim;
    __half* wh = wscratch_.as<__half>();
    int32_t* wsig = w_shift_.as<int32_t>() + dense_shift_at_;
    DS41_RETURN_IF_ERROR(cuda::run_weight_dequant_f16(w, wh, wsig, stream_));
    const int64_t chunk = std::min({n, rows_fitting(x3_.size(), y3_.size(), in, out), shift_rows_});
    __half* x2 = x3_.as<__half>();
    float* y2 = y3_.as<float>();
    int32_t* tau = row_shift_.as<int32_t>();
    for (int64_t r0 = 0; r0 < n; r0 += chunk) {
      const int64_t R = std::min(chunk, n - r0);
      DS41_RETURN_IF_ERROR(cuda::run_split2_f16(x + r0 * in, R, in, nullptr, 1, x2, tau, stream_));
      DS41_RETURN_IF_ERROR(gemm(wh, out, in, x2, 2 * R, y2, CUDA_R_16F));
      DS41_RETURN_IF_ERROR(cuda::run_sum2_scaled(y2, R, out, nullptr, 1, tau, wsig, y + r0 * out, stream_));
    }
    return ok_status();
  }
  const __nv_bfloat16* wb = nullptr;
  DS41_RETURN_IF_ERROR(dequant(w, &wb));
  const int64_t in = w.in_dim, out = w.out_dim;
  const int64_t chunk = std::min(n, rows_fitting(x3_.size(), y3_.size(), in, out));
  __nv_bfloat16* x3 = x3_.as<__nv_bfloat16>();
  float* y3 = y3_.as<float>();
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t R = std::min(chunk, n - r0);
    DS41_RETURN_IF_ERROR(cuda::run_split3_bf16(x + r0 * in, R, in, nullptr, 1, x3, stream_));
    if (x_bf16_exact && cuda::tc_one_part()) {  // hi = x, lo = lo2 = 0: the first part's GEMM alone
      DS41_RETURN_IF_ERROR(gemm(wb, out, in, x3, R, y + r0 * out, CUDA_R_16BF));
      continue;
    }
    if (lim_.accumulate_parts) {
      for (int p = 2; p >= 0; --p)  // x2 W, then + x1 W, then + x0 W
        DS41_RETURN_IF_ERROR(
            gemm(wb, out, in, x3 + p * R * in, R, y + r0 * out, CUDA_R_16BF, p == 2 ? 0.0f : 1.0f));
      continue;
    }
    DS41_RETURN_IF_ERROR(gemm(wb, out, in, x3, 3 * R, y3, CUDA_R_16BF));
    DS41_RETURN_IF_ERROR(cuda::run_sum3(y3, R, out, nullptr, 1, y + r0 * out, stream_));
  }
  return ok_status();
}

Status TensorCoreLinear::grouped_linear(const cuda::DeviceWeight& w, int64_t groups, const float* x, int64_t n,
                                        float* y, bool x_bf16_exact) {
  if (!accepts_grouped(w, groups, n))
    return invalid_argument("tensor-core linears: this grouped weight / row count is not accepted");
  const bool h = f16(w);
  const int parts = h ? 2 : 3;
  const cudaDataType_t t = h ? CUDA_R_16F : CUDA_R_16BF;
  const void* wp = nullptr;
  int32_t* wsig = w_shift_.as<int32_t>() + dense_shift_at_;
  if (h) {
    DS41_RETURN_IF_ERROR(cuda::run_weight_dequant_f16(w, wscratch_.as<__half>(), wsig, stream_));
    wp = wscratch_.data();
  } else {
    const __nv_bfloat16* wb = nullptr;
    DS41_RETURN_IF_ERROR(dequant(w, &wb));
    wp = wb;
  }
  const int64_t in_g = w.in_dim, out_g = w.out_dim / groups, in_t = in_g * groups, out_t = w.out_dim;
  const int64_t chunk = std::min({n, rows_fitting(x3_.size(), y3_.size(), in_t, out_t), shift_rows_});
  float* yp = y3_.as<float>();
  int32_t* tau = row_shift_.as<int32_t>();
  // Group g: yo[:, g*out_g .. ] (+)= xp[:, g*in_g .. ] . W_g^T with W_g = rows [g*out_g, (g+1)*out_g),
  // for `cols` rows of x (16-bit elements either way).
  auto batched = [&](const uint16_t* xp, int64_t cols, float beta, float* yo) {
    const float one = 1.0f;
    return blas_status(
        cublasGemmStridedBatchedEx(H(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_g),
                                   static_cast<int>(cols), static_cast<int>(in_g), &one, wp, t,
                                   static_cast<int>(in_g), out_g * in_g, xp, t, static_cast<int>(in_t), in_g,
                                   &beta, yo, CUDA_R_32F, static_cast<int>(out_t), out_g,
                                   static_cast<int>(groups), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "GemmStridedBatchedEx");
  };
  const uint16_t* xparts = x3_.as<uint16_t>();
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t R = std::min(chunk, n - r0);
    if (h)
      DS41_RETURN_IF_ERROR(cuda::run_split2_f16(x + r0 * in_t, R, in_t, nullptr, 1, x3_.as<__half>(), tau, stream_));
    else
      DS41_RETURN_IF_ERROR(cuda::run_split3_bf16(x + r0 * in_t, R, in_t, nullptr, 1, x3_.as<__nv_bfloat16>(), stream_));
    if (!h && x_bf16_exact && cuda::tc_one_part()) {  // hi = x, lo = lo2 = 0: the first part's GEMM alone
      DS41_RETURN_IF_ERROR(batched(xparts, R, 0.0f, y + r0 * out_t));
      continue;
    }
    if (!h && lim_.accumulate_parts) {  // x2 W, then + x1 W, then + x0 W, into y
      for (int p = 2; p >= 0; --p)
        DS41_RETURN_IF_ERROR(batched(xparts + p * R * in_t, R, p == 2 ? 0.0f : 1.0f, y + r0 * out_t));
      continue;
    }
    DS41_RETURN_IF_ERROR(batched(xparts, parts * R, 0.0f, yp));
    if (h)
      DS41_RETURN_IF_ERROR(cuda::run_sum2_scaled(yp, R, out_t, nullptr, 1, tau, wsig, y + r0 * out_t, stream_));
    else
      DS41_RETURN_IF_ERROR(cuda::run_sum3(yp, R, out_t, nullptr, 1, y + r0 * out_t, stream_));
  }
  return ok_status();
}

bool TensorCoreLinear::accepts_experts(const std::vector<cuda::DeviceWeight>& w, int64_t out_dim, int64_t in_dim,
                                       int64_t m_max) const {
  if (w.empty() || m_max < lim_.min_rows || in_dim % 32 != 0) return false;
  if (static_cast<int64_t>(w.size()) > lim_.n_experts) return false;
  if (static_cast<size_t>(out_dim * in_dim) * sizeof(__nv_bfloat16) > wscratch_.size()) return false;
  if (static_cast<size_t>(3 * m_max * in_dim) * sizeof(__nv_bfloat16) > x3_.size()) return false;
  if (static_cast<size_t>(3 * m_max * out_dim) * sizeof(float) > y3_.size()) return false;
  for (const cuda::DeviceWeight& e : w)
    if (!decodable(e.format) || e.out_dim != out_dim || e.in_dim != in_dim || !aligned16(e.data)) return false;
  return true;
}

Status TensorCoreLinear::expert_linear(const std::vector<cuda::DeviceWeight>& w, const cuda::DeviceWeight* d_w,
                                       int64_t out_dim, int64_t in_dim, const int64_t* offsets, const float* x,
                                       int64_t m_max, float* y, bool x_quantized) {
  return expert_linear_pair(w, nullptr, d_w, nullptr, out_dim, in_dim, offsets, x, m_max, y, nullptr, nullptr,
                            x_quantized);
}

Status TensorCoreLinear::expert_linear_pair(const std::vector<cuda::DeviceWeight>& w,
                                            const std::vector<cuda::DeviceWeight>* w2, const cuda::DeviceWeight* d_w,
                                            const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim,
                                            const int64_t* offsets, const float* x, int64_t m_max, float* y,
                                            float* y2, const int64_t* x_rows, bool x_quantized) {
  if (!accepts_experts(w, out_dim, in_dim, m_max) || (w2 && !accepts_experts(*w2, out_dim, in_dim, m_max)))
    return invalid_argument("tensor-core linears: these experts / row count are not accepted");
  if (w2 && (w2->size() != w.size() || !d_w2 || !y2))
    return invalid_argument("tensor-core linears: a pair needs two expert lists of one size and two outputs");
  const int64_t E = static_cast<int64_t>(w.size());
  // The FP4 expert GEMM's scale check goes out before the offsets' copy: one synchronisation for both.
  const bool fp4g = fp4_gemm_eligible(w, w2, out_dim, in_dim, m_max);
  int32_t* outside = static_cast<int32_t*>(window_host_.data());
  if (fp4g) {
    int32_t* count = window_count_.as<int32_t>();
    // count[1]: the (row, step)s the fold cannot take, counted only where the wgmma form could run.
    int32_t* wide = cuda::expert_gemm_wgmma() ? count + 1 : nullptr;
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cudaMemsetAsync(count, 0, 2 * sizeof(int32_t), stream_), "clear the scale check"));
    DS41_RETURN_IF_ERROR(cuda::run_fp4_scales_outside_window(d_w, E, out_dim, in_dim, count, stream_, wide));
    if (w2) DS41_RETURN_IF_ERROR(cuda::run_fp4_scales_outside_window(d_w2, E, out_dim, in_dim, count, stream_, wide));
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(outside, count, 2 * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_), "copy the scale check"));
  }
  int64_t* off = static_cast<int64_t*>(offsets_host_.data());
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(off, offsets, static_cast<size_t>(E + 1) * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_),
      "copy expert offsets"));
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamSynchronize(stream_), "expert offsets"));
  const int64_t m = off[E];
  if (m < 0 || m > m_max)
    return internal_error("tensor-core linears: expert offsets end at " + std::to_string(m) + " > m_max " +
                          std::to_string(m_max));
  if (m == 0) return ok_status();
  if (fp4g && outside[0] == 0 && m <= lim_.fp4_gemm_rows_per_expert * E) {
    const cuda::ExpertGemmForm form = cuda::expert_gemm_wgmma() && outside[1] == 0 ? cuda::ExpertGemmForm::kWgmma
                                                                                   : cuda::ExpertGemmForm::kMma;
    return fp4_gemm(off, E, d_w, w2 ? d_w2 : nullptr, out_dim, in_dim, x, x_rows, y, w2 ? y2 : nullptr,
                    x_quantized && cuda::tc_one_part(), form);
  }
  // The fp16 split when every expert of both matrices takes it (one call, one numerics).
  bool h = lim_.split_parts == 2 && lim_.decode_weights &&
           out_dim <= std::max(lim_.expert_out, lim_.expert_in) &&  // the experts' bands fit w_shift_
           m <= shift_rows_;
  for (const cuda::DeviceWeight& e : w) h = h && cuda::f16_split_supported(e);
  if (w2)
    for (const cuda::DeviceWeight& e : *w2) h = h && cuda::f16_split_supported(e);
  const int parts = h ? 2 : 3;
  int32_t* tau = row_shift_.as<int32_t>();
  int32_t* sig = w_shift_.as<int32_t>();
  // x is split once for both matrices of a pair (the MoE's w1 and w3 read the same routed rows).
  if (h)
    DS41_RETURN_IF_ERROR(cuda::run_split2_f16(x, m, in_dim, offsets, E, x3_.as<__half>(), tau, stream_, x_rows));
  else
    DS41_RETURN_IF_ERROR(
        cuda::run_split3_bf16(x, m, in_dim, offsets, E, x3_.as<__nv_bfloat16>(), stream_, x_rows));
  // Experts with rows, in id order; uploaded once (the batches index into the list).
  int32_t* ids = static_cast<int32_t*>(ids_host_.data());
  int64_t used = 0;
  for (int64_t e = 0; e < E; ++e)
    if (off[e + 1] > off[e]) ids[used++] = static_cast<int32_t>(e);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(ids_.data(), ids, static_cast<size_t>(used) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
      "upload expert ids"));
  if (!h && !xs_.empty()) {
    const cuda::DeviceWeight* dws[2] = {d_w, d_w2};
    float* outs[2] = {y, y2};
    return expert_gemms_streams(off, ids, used, w2 ? 2 : 1, dws, outs, out_dim, in_dim, offsets, E);
  }
  const int64_t per = out_dim * in_dim;
  const int64_t batch = std::max<int64_t>(1, static_cast<int64_t>(wscratch_.size() / sizeof(__nv_bfloat16)) / per);
  for (int mat = 0; mat < (w2 ? 2 : 1); ++mat) {
    const cuda::DeviceWeight* dw = mat == 0 ? d_w : d_w2;
    float* out = mat == 0 ? y : y2;
    for (int64_t b0 = 0; b0 < used; b0 += batch) {
      const int64_t cnt = std::min(batch, used - b0);
      if (h)
        DS41_RETURN_IF_ERROR(cuda::run_experts_dequant_f16(dw, ids_.as<int32_t>() + b0, cnt, out_dim, in_dim,
                                                           wscratch_.as<__half>(), sig, stream_));
      else
        DS41_RETURN_IF_ERROR(cuda::run_experts_dequant_bf16(dw, ids_.as<int32_t>() + b0, cnt, out_dim, in_dim,
                                                            wscratch_.as<__nv_bfloat16>(), stream_));
      // The second matrix's pointer arrays use their own pinned slots (3 E on): the first matrix's
      // copies may still be queued.
      DS41_RETURN_IF_ERROR(expert_gemms(off, ids, b0, cnt, out_dim, in_dim, parts, h ? CUDA_R_16F : CUDA_R_16BF,
                                        mat * 3 * E));
    }
    if (h)
      DS41_RETURN_IF_ERROR(cuda::run_sum2_scaled(y3_.as<float>(), m, out_dim, offsets, E, tau, sig, out, stream_));
    else
      DS41_RETURN_IF_ERROR(cuda::run_sum3(y3_.as<float>(), m, out_dim, offsets, E, out, stream_));
  }
  return ok_status();
}

bool TensorCoreLinear::fp4_gemm_eligible(const std::vector<cuda::DeviceWeight>& w,
                                         const std::vector<cuda::DeviceWeight>* w2, int64_t out_dim, int64_t in_dim,
                                         int64_t m_max) const {
  if (!lim_.fp4_expert_gemm || lim_.split_parts != 3 || !cuda::expert_gemm_supported(out_dim, in_dim)) return false;
  if (m_max > shift_rows_ || static_cast<int64_t>(w.size()) > 65535) return false;  // ex: row_shift_
  const int64_t max_units = cuda::expert_gemm_max_units(m_max, static_cast<int64_t>(w.size()));
  if (max_units > 65535 || static_cast<size_t>(max_units) * sizeof(cuda::ExpertGemmUnit) > units_host_.size())
    return false;
  auto ok = [](const std::vector<cuda::DeviceWeight>& list) {
    for (const cuda::DeviceWeight& e : list)
      if (e.format != WeightFormat::kFp4Rows || !aligned16(e.data) || (reinterpret_cast<uintptr_t>(e.scale) & 3u) != 0)
        return false;
    return true;
  };
  return ok(w) && (w2 == nullptr || ok(*w2));
}

Status TensorCoreLinear::fp4_gemm(const int64_t* off, int64_t E, const cuda::DeviceWeight* d_w,
                                  const cuda::DeviceWeight* d_w2, int64_t out_dim, int64_t in_dim, const float* x,
                                  const int64_t* x_rows, float* y, float* y2, bool one_part,
                                  cuda::ExpertGemmForm form) {
  auto* units = static_cast<cuda::ExpertGemmUnit*>(units_host_.data());
  const int64_t n =
      cuda::expert_gemm_units(off, E, units, one_part ? cuda::kExpertGemmRows1 : cuda::kExpertGemmRows);
  DS41_RETURN_IF_ERROR(cuda::cuda_status(
      cudaMemcpyAsync(units_.data(), units, static_cast<size_t>(n) * sizeof(cuda::ExpertGemmUnit),
                      cudaMemcpyHostToDevice, stream_),
      "upload the expert GEMM units"));
  uint2* parts = x3_.as<uint2>();
  int32_t* ex = row_shift_.as<int32_t>();
  const int np = one_part ? 1 : 3;
  DS41_RETURN_IF_ERROR(cuda::run_expert_gemm_split(x, in_dim, x_rows, off[E], parts, ex, stream_, np, form));
  return cuda::run_expert_gemm_fp4(d_w, d_w2, units_.as<cuda::ExpertGemmUnit>(), n, out_dim, in_dim, parts, ex, y, y2,
                                   stream_, np, form);
}

// The pipeline (TensorCoreLimits::expert_streams): the scratch holds nbuf buffers of `batch`
// experts each. Job j (a batch of one matrix) is decoded on decode_stream_ into buffer j % nbuf
// once every expert stream has issued its GEMMs of job j - nbuf (their `freed` events), then each
// expert stream waits for that decode and runs the GEMMs of its experts. An expert goes to the
// stream with the fewest rows so far (ties: the lowest index; the assignment depends on the row
// counts only). A matrix's sum3 runs on the engine stream once every expert stream is done with
// it; the pair's second matrix writes its own half of y3_ when both fit, otherwise its GEMMs wait
// for the first matrix's sum3. The engine stream ends the call joined with every stream.
Status TensorCoreLinear::expert_gemms_streams(const int64_t* off, const int32_t* ids, int64_t used, int mats,
                                              const cuda::DeviceWeight* const* dws, float* const* outs,
                                              int64_t out, int64_t in, const int64_t* offsets, int64_t E) {
  constexpr int parts = 3;
  const int64_t m = off[E];
  const int64_t per = out * in;
  const int64_t slots = static_cast<int64_t>(wscratch_.size() / sizeof(__nv_bfloat16)) / per;  // >= 1 (accepts)
  const int nbuf = slots >= 2 ? 2 : 1;
  const int64_t batch = std::max<int64_t>(1, slots / nbuf);
  const bool own_half = static_cast<size_t>(2 * parts * m * out) * sizeof(float) <= y3_.size();
  auto wait = [](cudaStream_t s, cudaEvent_t e) {
    return cuda::cuda_status(cudaStreamWaitEvent(s, e, 0), "tensor-core linears: stream wait");
  };
  auto record = [](cudaEvent_t e, cudaStream_t s) {
    return cuda::cuda_status(cudaEventRecord(e, s), "tensor-core linears: event record");
  };
  // Fork: the split rows, the ids and the outputs' previous readers are ordered before here.
  DS41_RETURN_IF_ERROR(record(fork_, stream_));
  DS41_RETURN_IF_ERROR(wait(decode_stream_, fork_));
  for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(wait(x.stream, fork_));
  const uint16_t* xp = x3_.as<uint16_t>();
  int64_t job = 0;
  for (int mat = 0; mat < mats; ++mat) {
    float* yp = y3_.as<float>() + (mat == 1 && own_half ? parts * m * out : 0);
    if (mat == 1 && !own_half)  // y3_ is read by the first matrix's sum3
      for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(wait(x.stream, summed_));
    std::fill(lane_load_.begin(), lane_load_.end(), 0.0);
    for (int64_t b0 = 0; b0 < used; b0 += batch, ++job) {
      const int64_t cnt = std::min(batch, used - b0);
      const int buf = static_cast<int>(job % nbuf);
      uint16_t* wb = wscratch_.as<uint16_t>() + buf * batch * per;
      if (job >= nbuf)
        for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(wait(decode_stream_, x.freed[buf]));
      DS41_RETURN_IF_ERROR(cuda::run_experts_dequant_bf16(dws[mat], ids_.as<int32_t>() + b0, cnt, out, in,
                                                          reinterpret_cast<__nv_bfloat16*>(wb), decode_stream_));
      DS41_RETURN_IF_ERROR(record(decoded_[buf], decode_stream_));
      for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(wait(x.stream, decoded_[buf]));
      for (int64_t j = 0; j < cnt; ++j) {
        const int64_t e = ids[b0 + j], rows = off[e + 1] - off[e];
        size_t lane = 0;
        for (size_t i = 1; i < xs_.size(); ++i)
          if (lane_load_[i] < lane_load_[lane]) lane = i;
        lane_load_[lane] += static_cast<double>(rows);
        DS41_RETURN_IF_ERROR(gemm_on(xs_[lane].handle, wb + j * per, out, in, xp + parts * off[e] * in,
                                     parts * rows, yp + parts * off[e] * out, CUDA_R_16BF));
      }
      for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(record(x.freed[buf], x.stream));
    }
    // Join this matrix's GEMMs (each stream's last record covers its earlier work), then sum.
    const int last = static_cast<int>((job - 1) % nbuf);
    for (ExpertStream& x : xs_) DS41_RETURN_IF_ERROR(wait(stream_, x.freed[last]));
    DS41_RETURN_IF_ERROR(cuda::run_sum3(yp, m, out, offsets, E, outs[mat], stream_));
    if (mat == 0 && mats == 2 && !own_half) DS41_RETURN_IF_ERROR(record(summed_, stream_));
  }
  return ok_status();
}

Status TensorCoreLinear::expert_gemms(const int64_t* off, const int32_t* ids, int64_t b0, int64_t cnt, int64_t out,
                                      int64_t in, int parts, int dtype, int64_t slot0) {
  // 16-bit elements either way (bf16 or fp16): pointer arithmetic in uint16_t units.
  const uint16_t* wb = wscratch_.as<uint16_t>();
  const uint16_t* xp = x3_.as<uint16_t>();
  float* yp = y3_.as<float>();
  const cudaDataType_t t = static_cast<cudaDataType_t>(dtype);
  const int64_t per = out * in;
  if (grouped_ok_ && cnt > 1) {
    // One group per expert (its own row count), group size 1. The pointer arrays of this batch go
    // to slots [3 * b0, 3 * (b0 + cnt)) so batches of one call never overwrite each other's
    // (the next call starts with a synchronisation).
    const void** hp = static_cast<const void**>(ptrs_host_.data()) + slot0 + 3 * b0;
    std::vector<int> m(cnt, static_cast<int>(out)), n(cnt), k(cnt, static_cast<int>(in)), ld_w(cnt, static_cast<int>(in)),
        ld_x(cnt, static_cast<int>(in)), ld_y(cnt, static_cast<int>(out)), sizes(cnt, 1);
    std::vector<cublasOperation_t> ta(cnt, CUBLAS_OP_T), tb(cnt, CUBLAS_OP_N);
    std::vector<float> alpha(cnt, 1.0f), beta(cnt, 0.0f);
    for (int64_t j = 0; j < cnt; ++j) {
      const int64_t e = ids[b0 + j];
      n[j] = static_cast<int>(parts * (off[e + 1] - off[e]));
      hp[j] = wb + j * per;
      hp[cnt + j] = xp + parts * off[e] * in;
      hp[2 * cnt + j] = yp + parts * off[e] * out;
    }
    void** dp = static_cast<void**>(ptrs_.data()) + slot0 + 3 * b0;
    DS41_RETURN_IF_ERROR(cuda::cuda_status(
        cudaMemcpyAsync(dp, hp, static_cast<size_t>(3 * cnt) * sizeof(void*), cudaMemcpyHostToDevice, stream_),
        "upload grouped GEMM pointers"));
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        H(handle_), ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), dp, t, ld_w.data(),
        dp + cnt, t, ld_x.data(), beta.data(), dp + 2 * cnt, CUDA_R_32F, ld_y.data(),
        static_cast<int>(cnt), sizes.data(), CUBLAS_COMPUTE_32F);
    if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
    if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
      return blas_status(st, "GemmGroupedBatchedEx");
    grouped_ok_ = false;  // this cuBLAS does not take these types: one GEMM per expert from now on
  }
  for (int64_t j = 0; j < cnt; ++j) {
    const int64_t e = ids[b0 + j], rows = off[e + 1] - off[e];
    DS41_RETURN_IF_ERROR(
        gemm(wb + j * per, out, in, xp + parts * off[e] * in, parts * rows, yp + parts * off[e] * out, dtype));
  }
  return ok_status();
}

}  // namespace ds41::gpu
