// ds41 scripts/cuda-host-emu: the cuBLAS calls of gpu/tensor_core_linear.cpp on the host, for
// run_engine.sh: GemmEx / GemmStridedBatchedEx with BF16 or F32 inputs, F32 output, fp32 sums in
// k order (the tensor cores' products are exact bf16 x bf16 -> fp32 too); the grouped call answers
// NOT_SUPPORTED (the caller then runs one GEMM per group). Column-major as cuBLAS.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace {

float load(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  uint16_t b;
  std::memcpy(&b, static_cast<const uint16_t*>(p) + i, 2);
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                    const void* A, cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb,
                    const float* beta, void* C, cudaDataType ct, int ldc) {
  if (ct != CUDA_R_32F || (at != CUDA_R_32F && at != CUDA_R_16BF) || (bt != CUDA_R_32F && bt != CUDA_R_16BF))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  float* c = static_cast<float*>(C);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float s = 0.0f;
      for (int p = 0; p < k; ++p) {
        const float a = ta == CUBLAS_OP_N ? load(A, at, i + static_cast<int64_t>(p) * lda)
                                          : load(A, at, p + static_cast<int64_t>(i) * lda);
        const float b = tb == CUBLAS_OP_N ? load(B, bt, p + static_cast<int64_t>(j) * ldb)
                                          : load(B, bt, j + static_cast<int64_t>(p) * ldb);
        s += a * b;
      }
      float& o = c[i + static_cast<int64_t>(j) * ldc];
      o = *alpha * s + (*beta != 0.0f ? *beta * o : 0.0f);
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {
cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new char[8]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete[] reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char* cublasGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATED"; }
const char* cublasGetStatusString(cublasStatus_t) { return "emulated cuBLAS status"; }
cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                            cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                            cublasComputeType_t, cublasGemmAlgo_t) {
  return gemm(ta, tb, m, n, k, static_cast<const float*>(alpha), A, at, lda, B, bt, ldb,
              static_cast<const float*>(beta), C, ct, ldc);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void* alpha, const void* A, cudaDataType at, int lda,
                                          long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                                          const void* beta, void* C, cudaDataType ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t, cublasGemmAlgo_t) {
  const int ea = at == CUDA_R_32F ? 4 : 2, eb = bt == CUDA_R_32F ? 4 : 2;
  for (int g = 0; g < batch; ++g) {
    cublasStatus_t s = gemm(ta, tb, m, n, k, static_cast<const float*>(alpha),
                            static_cast<const char*>(A) + g * sa * ea, at, lda,
                            static_cast<const char*>(B) + g * sb * eb, bt, ldb, static_cast<const float*>(beta),
                            static_cast<float*>(C) + g * sc, ct, ldc);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t, const cublasOperation_t[], const cublasOperation_t[],
                                          const int[], const int[], const int[], const void*, const void* const[],
                                          cudaDataType_t, const int[], const void* const[], cudaDataType_t,
                                          const int[], const void*, void* const[], cudaDataType_t, const int[], int,
                                          const int[], cublasComputeType_t) {
  return CUBLAS_STATUS_NOT_SUPPORTED;
}
}
