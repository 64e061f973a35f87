// ds41 backends/cuda: CUDA error -> Status.
#include "backends/cuda/cuda_status.h"

namespace ds41::cuda {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Status last_launch_status(const char* kernel) {
  return cuda_status(cudaGetLastError(), (std::string("launch of ") + kernel).c_str());
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls start clean
    return 0;
  }
  return n;
}

}  // namespace ds41::cuda
