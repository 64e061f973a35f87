// ds41 backends/cuda: turning CUDA runtime errors into Status values (errors are values,
// ARCHITECTURE.md); kernels never abort the process.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

namespace ds41::cuda {

// Ok for cudaSuccess, else an internal error naming what failed and the CUDA error string.
Status cuda_status(cudaError_t e, const char* what);

// Status of the last kernel launch on this thread (cudaGetLastError; clears launch errors).
// Allowed during stream capture, so run() functions stay graph-capturable.
Status last_launch_status(const char* kernel);

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error).
int cuda_device_count();

}  // namespace ds41::cuda
