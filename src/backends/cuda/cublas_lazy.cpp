// ds41 backends/cuda: cuBLAS and cuBLASLt loaded on first use instead of at process start.
//
// Why: libcublasLt's static initialisers ran in every ds41 process linked against it, ~0.37 s of
// CPU (page faults over a ~500 MB library) before main() — `ds41 --help` took 0.46 s, and every
// test process of a binary linking the GPU engine paid it, on machines with no GPU too. Only the
// tensor-core prefill linears (gpu/tensor_core_linear.cpp) and `bench kernels`' references call
// cuBLAS, so the library is opened (dlopen) the first time one of the functions below is called.
//
// The functions keep cuBLAS's own names and prototypes (the headers' declarations; a mismatch is a
// compile error), so callers are unchanged; each resolves its symbol once (thread-safe static
// initialisation) and forwards. The libraries are looked up by soname (the loader's search path:
// LD_LIBRARY_PATH, the cache, the executable's RUNPATH) and then in the CUDA toolkit's library
// folder found at configure time (DS41_CUDA_LIB_DIR). When neither opens, every call returns
// CUBLAS_STATUS_NOT_INITIALIZED and cublasGetStatusString names the library and dlerror's reason.
// Only what ds41 calls is here: a new cuBLAS call is a link error until it is added.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "backends/cuda/cublas_lazy.h"

#ifndef DS41_CUDA_LIB_DIR
#define DS41_CUDA_LIB_DIR ""
#endif

namespace ds41::cuda {
namespace {

struct Lib {
  explicit Lib(const char* s) : stem(s) {}
  const char* stem;  // "libcublas"
  void* handle = nullptr;
  std::string error;
  std::once_flag once;
};

Lib g_cublas{"libcublas"};
Lib g_cublas_lt{"libcublasLt"};

void* open_lib(Lib& lib) {
  std::call_once(lib.once, [&lib] {
    const std::string soname = std::string(lib.stem) + ".so." + std::to_string(CUBLAS_VER_MAJOR);
    lib.handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) return;
    const char* e = dlerror();
    lib.error = soname + " could not be opened" + (e ? std::string(" (") + e + ")" : std::string());
    const std::string dir = DS41_CUDA_LIB_DIR;
    if (!dir.empty()) {
      const std::string path = dir + "/" + soname;
      lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib.handle) {
        lib.error.clear();
        return;
      }
      e = dlerror();
      lib.error += ", nor " + path + (e ? std::string(" (") + e + ")" : std::string());
    }
  });
  return lib.handle;
}

void* resolve(Lib& lib, const char* name) {
  void* h = open_lib(lib);
  return h ? dlsym(h, name) : nullptr;
}

std::string& status_text() {
  static std::string s;
  return s;
}

}  // namespace

bool cublas_available() { return open_lib(g_cublas) != nullptr; }

std::string cublas_load_error() {
  open_lib(g_cublas);
  open_lib(g_cublas_lt);
  if (!g_cublas.error.empty()) return g_cublas.error;
  return g_cublas_lt.error;
}

}  // namespace ds41::cuda

using ds41::cuda::g_cublas;
using ds41::cuda::g_cublas_lt;

// One forwarding definition: the pointer is resolved on the first call; a missing library or
// symbol returns `fail`.
#define DS41_CUBLAS_FORWARD(lib, ret, fail, name, params, args)                                  \
  ret name params {                                                                               \
    using Fn = ret(*) params;                                                                     \
    static const Fn f = reinterpret_cast<Fn>(ds41::cuda::resolve(lib, #name));                    \
    if (f == nullptr) return fail;                                                                \
    return f args;                                                                                \
  }

extern "C" {

constexpr cublasStatus_t kNotLoaded = CUBLAS_STATUS_NOT_INITIALIZED;

DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasCreate_v2, (cublasHandle_t * handle), (handle))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasDestroy_v2, (cublasHandle_t handle), (handle))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasSetWorkspace_v2,
                    (cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes),
                    (handle, workspace, workspaceSizeInBytes))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasSetStream_v2,
                    (cublasHandle_t handle, cudaStream_t streamId), (handle, streamId))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode),
                    (handle, mode))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasGemmEx,
                    (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                     const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype,
                     int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                     cublasComputeType_t computeType, cublasGemmAlgo_t algo),
                    (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                     computeType, algo))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasGemmStridedBatchedEx,
                    (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                     const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA,
                     const void* B, cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C,
                     cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
                     cublasComputeType_t computeType, cublasGemmAlgo_t algo),
                    (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C,
                     Ctype, ldc, strideC, batchCount, computeType, algo))
DS41_CUBLAS_FORWARD(g_cublas, cublasStatus_t, kNotLoaded, cublasGemmGroupedBatchedEx,
                    (cublasHandle_t handle, const cublasOperation_t transa_array[],
                     const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
                     const int k_array[], const void* alpha_array, const void* const Aarray[], cudaDataType_t Atype,
                     const int lda_array[], const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                     const void* beta_array, void* const Carray[], cudaDataType_t Ctype, const int ldc_array[],
                     int group_count, const int group_size[], cublasComputeType_t computeType),
                    (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array, Aarray, Atype,
                     lda_array, Barray, Btype, ldb_array, beta_array, Carray, Ctype, ldc_array, group_count,
                     group_size, computeType))

// The status texts: cuBLAS's own once the library is loaded; otherwise why it is not.
const char* cublasGetStatusString(cublasStatus_t status) {
  using Fn = const char* (*)(cublasStatus_t);
  static const Fn f = reinterpret_cast<Fn>(ds41::cuda::resolve(g_cublas, "cublasGetStatusString"));
  if (f) return f(status);
  static std::once_flag once;
  std::call_once(once, [] { ds41::cuda::status_text() = "cuBLAS is not available (" + ds41::cuda::cublas_load_error() + ")"; });
  return ds41::cuda::status_text().c_str();
}
const char* cublasGetStatusName(cublasStatus_t status) {
  using Fn = const char* (*)(cublasStatus_t);
  static const Fn f = reinterpret_cast<Fn>(ds41::cuda::resolve(g_cublas, "cublasGetStatusName"));
  if (f) return f(status);
  return "CUBLAS_NOT_LOADED";  // the status string says why
}

DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtCreate, (cublasLtHandle_t * lightHandle),
                    (lightHandle))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtDestroy, (cublasLtHandle_t lightHandle),
                    (lightHandle))
DS41_CUBLAS_FORWARD(g_cublas_lt, size_t, 0, cublasLtGetVersion, (void), ())
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulDescCreate,
                    (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType),
                    (matmulDesc, computeType, scaleType))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulDescDestroy,
                    (cublasLtMatmulDesc_t matmulDesc), (matmulDesc))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulDescSetAttribute,
                    (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                     size_t sizeInBytes),
                    (matmulDesc, attr, buf, sizeInBytes))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatrixLayoutCreate,
                    (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                    (matLayout, type, rows, cols, ld))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatrixLayoutDestroy,
                    (cublasLtMatrixLayout_t matLayout), (matLayout))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatrixLayoutSetAttribute,
                    (cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                     size_t sizeInBytes),
                    (matLayout, attr, buf, sizeInBytes))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulPreferenceCreate,
                    (cublasLtMatmulPreference_t * pref), (pref))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulPreferenceDestroy,
                    (cublasLtMatmulPreference_t pref), (pref))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulPreferenceSetAttribute,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                     size_t sizeInBytes),
                    (pref, attr, buf, sizeInBytes))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmulAlgoGetHeuristic,
                    (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
                     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                     cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                     cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
                    (lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
                     heuristicResultsArray, returnAlgoCount))
DS41_CUBLAS_FORWARD(g_cublas_lt, cublasStatus_t, kNotLoaded, cublasLtMatmul,
                    (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
                     cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                     const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
                     cudaStream_t stream),
                    (lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                     workspaceSizeInBytes, stream))

}  // extern "C"
