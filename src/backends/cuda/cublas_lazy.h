// ds41 backends/cuda: cuBLAS / cuBLASLt opened on first use (cublas_lazy.cpp says why and how).
// Callers call the cuBLAS functions as declared in <cublas_v2.h> / <cublasLt.h>; these two say
// whether the libraries open and, if not, why (for messages that name the cause).
#pragma once

#include <string>

namespace ds41::cuda {

// Opens libcublas (once); false when it cannot be opened.
bool cublas_available();
// Empty when both libraries open; otherwise the sonames and paths tried and the loader's reasons.
std::string cublas_load_error();

}  // namespace ds41::cuda
