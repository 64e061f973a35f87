// ds41 scripts/cuda-host-emu: the CUDA runtime calls the parity tests make, on host memory (device
// pointers are host pointers under the emulator), and the backends/cuda status helpers (one device).
#include <cuda_runtime_api.h>
#include <cstdlib>
#include <cstring>
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"
extern "C" {
cudaError_t cudaMalloc(void** p, size_t n) { *p = std::aligned_alloc(256, (n + 255) / 256 * 256); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemset(void* d, int v, size_t n) { std::memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
// Streams: everything is synchronous here; a stream is a distinct non-null handle.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { static char h; *s = reinterpret_cast<cudaStream_t>(&h); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) { *v = a == cudaDevAttrMultiProcessorCount ? 132 : a == cudaDevAttrComputeCapabilityMajor ? 9 : 0; return cudaSuccess; }
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
// The tensor-core GEMV sizes its grid from the resident blocks (two per SM where the shared memory allows).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void*, int, size_t smem) { *n = smem * 2 + 2048 <= 227 * 1024 ? 2 : 1; return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
// Timing events (cuda_parity_test's throughput report): the emulator runs a launch to completion, so an
// event is a no-op and every interval reads 0 ms.
cudaError_t cudaEventCreate(cudaEvent_t* e) { static char h; *e = reinterpret_cast<cudaEvent_t>(&h); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
}
namespace ds41::cuda {
Status cuda_status(cudaError_t e, const char* what) { return e == cudaSuccess ? ok_status() : internal_error(what); }
Status last_launch_status(const char*) { return ok_status(); }
int cuda_device_count() { return 1; }
// launch.h's per-thread state and stream operations (launch.cpp is not linked here).
uint64_t& thread_launch_count() {
  thread_local uint64_t n = 0;
  return n;
}
LaunchRecorder*& thread_recorder() {
  thread_local LaunchRecorder* r = nullptr;
  return r;
}
// launch.h's switches (launch.cpp's): the environment, or a test's override.
namespace {
TestableSwitch g_pre_wait{"DS41_PRE_WAIT", true};
TestableSwitch g_one_fence{"DS41_ONE_FENCE", false};
}  // namespace
bool pre_wait_enabled() { return g_pre_wait.enabled(); }
void set_pre_wait_for_tests(int mode) { g_pre_wait.set(mode); }
bool one_fence_enabled() { return g_one_fence.enabled(); }
void set_one_fence_for_tests(int mode) { g_one_fence.set(mode); }
cudaError_t copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind, cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
}
