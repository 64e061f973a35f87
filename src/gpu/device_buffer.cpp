// ds41 gpu: DeviceBuffer / PinnedBuffer (device_buffer.h).
#include "gpu/device_buffer.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "backends/cuda/cuda_status.h"

namespace ds41::gpu {
std::string gib_text(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, const std::string& what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  cudaError_t e = cudaMalloc(&b.ptr_, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    b.ptr_ = nullptr;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    return resource_exhausted("out of device memory allocating " + what + ": needs " + gib_text(bytes) + ", " +
                              gib_text(free_b) + " free of " + gib_text(total_b) + " (" + cudaGetErrorString(e) + ")");
  }
  b.size_ = bytes;
  return b;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_) cudaFreeHost(ptr_);
}
PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)),
      dev_(std::exchange(o.dev_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFreeHost(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    dev_ = std::exchange(o.dev_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes, const std::string& what, bool mapped) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  cudaError_t e = cudaHostAlloc(&b.ptr_, bytes, mapped ? cudaHostAllocMapped : cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    b.ptr_ = nullptr;
    return resource_exhausted("out of pinned host memory allocating " + what + ": needs " + gib_text(bytes) +
                              " (" + cudaGetErrorString(e) + ")");
  }
  b.size_ = bytes;
  if (mapped) {
    DS41_RETURN_IF_ERROR(
        cuda::cuda_status(cudaHostGetDevicePointer(&b.dev_, b.ptr_, 0), "cudaHostGetDevicePointer"));
  }
  return b;
}

}  // namespace ds41::gpu
