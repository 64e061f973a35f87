// ds41 backends/cuda: CUDA error -> Status.
#include "backends/cuda/cuda_status.h"

#include "backends/cuda/launch.h"

namespace ds41::cuda {

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Status last_launch_status(const char* kernel) {
  if (thread_recorder()) return ok_status();  // recorded, not launched (launch.h)
  const cudaError_t mine = take_launch_error();  // a launch() that failed (launch.h)
  const cudaError_t last = cudaGetLastError();
  return cuda_status(mine != cudaSuccess ? mine : last, (std::string("launch of ") + kernel).c_str());
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
