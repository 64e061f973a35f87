// ds41 backends/cuda: the PDL switch of launch.h.
#include "backends/cuda/launch.h"

#include <atomic>

namespace ds41::cuda {
namespace {
std::atomic<int> g_pdl_override{-1};
}

bool pdl_enabled() {
  const int o = g_pdl_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool on = switch_on("DS41_PDL");
  return on;
}

namespace {
std::atomic<int> g_pre_wait_override{-1};
}

bool pre_wait_enabled() {
  const int o = g_pre_wait_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool on = switch_on("DS41_PRE_WAIT");
  return on;
}

void set_pre_wait_for_tests(int mode) { g_pre_wait_override.store(mode < 0 ? -1 : (mode != 0 ? 1 : 0)); }

namespace {
std::atomic<int> g_one_fence_override{-1};
}

bool one_fence_enabled() {
  const int o = g_one_fence_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool on = switch_opt_in("DS41_ONE_FENCE");
  return on;
}

void set_one_fence_for_tests(int mode) { g_one_fence_override.store(mode < 0 ? -1 : (mode != 0 ? 1 : 0)); }

namespace {
thread_local cudaError_t t_launch_error = cudaSuccess;
}

void note_launch_error(cudaError_t e) {
  if (t_launch_error == cudaSuccess) t_launch_error = e;
}

cudaError_t take_launch_error() {
  const cudaError_t e = t_launch_error;
  t_launch_error = cudaSuccess;
  return e;
}

uint64_t& thread_launch_count() {
  thread_local uint64_t n = 0;
  return n;
}

LaunchRecorder*& thread_recorder() {
  thread_local LaunchRecorder* r = nullptr;
  return r;
}

bool& thread_capturing() {
  thread_local bool c = false;
  return c;
}

cudaError_t copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (LaunchRecorder* r = thread_recorder()) {
    r->op(2);
    r->value(dst);
    r->value(src);
    r->value(bytes);
    r->value(kind);
    r->value(stream);
    return cudaSuccess;
  }
  return cudaMemcpyAsync(dst, src, bytes, kind, stream);
}

cudaError_t copy_2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                          cudaMemcpyKind kind, cudaStream_t stream) {
  if (LaunchRecorder* r = thread_recorder()) {
    r->op(3);
    const size_t v[4] = {dpitch, spitch, width, height};
    r->value(dst);
    r->value(src);
    r->add(v, sizeof(v));
    r->value(kind);
    r->value(stream);
    return cudaSuccess;
  }
  return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream);
}

cudaError_t fill_async(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (LaunchRecorder* r = thread_recorder()) {
    r->op(4);
    r->value(dst);
    r->value(value);
    r->value(bytes);
    r->value(stream);
    return cudaSuccess;
  }
  return cudaMemsetAsync(dst, value, bytes, stream);
}

cudaError_t record_event(cudaEvent_t event, cudaStream_t stream) {
  if (LaunchRecorder* r = thread_recorder()) {
    r->op(5);
    r->value(event);
    r->value(stream);
    return cudaSuccess;
  }
  if (thread_capturing()) return cudaEventRecordWithFlags(event, stream, cudaEventRecordExternal);
  return cudaEventRecord(event, stream);
}

cudaError_t stream_wait(cudaStream_t waiter, cudaStream_t signaler, cudaEvent_t event) {
  if (LaunchRecorder* r = thread_recorder()) {
    r->op(6);
    r->value(event);
    r->value(waiter);
    r->value(signaler);
    return cudaSuccess;
  }
  const cudaError_t e = cudaEventRecord(event, signaler);
  return e != cudaSuccess ? e : cudaStreamWaitEvent(waiter, event, 0);
}

void set_pdl_for_tests(int mode) { g_pdl_override.store(mode < 0 ? -1 : (mode != 0 ? 1 : 0)); }

}  // namespace ds41::cuda
