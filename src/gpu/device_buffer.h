// ds41 gpu: DeviceBuffer / PinnedBuffer — owning device and host-pinned allocations (RAII,
// move-only). Allocation failures are values naming what was allocated, the bytes needed and the
// device memory free / total (ARCHITECTURE.md "Errors"), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace ds41::gpu {

// "12.34 GiB": byte counts in the device path's error messages.
std::string gib_text(uint64_t bytes);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // cudaMalloc on the current device; OOM -> resource_exhausted naming `what`, the bytes needed and
  // cudaMemGetInfo's free / total. bytes == 0 gives an empty buffer.
  static Result<DeviceBuffer> allocate(size_t bytes, const std::string& what);

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // cudaHostAlloc (mapped when `mapped`: the device reads it through device_ptr()).
  static Result<PinnedBuffer> allocate(size_t bytes, const std::string& what, bool mapped = false);

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  // Device address of a mapped allocation (null when not mapped).
  void* device_ptr() const { return dev_; }

 private:
  void* ptr_ = nullptr;
  void* dev_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ds41::gpu
