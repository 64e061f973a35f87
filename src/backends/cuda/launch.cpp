// ds41 backends/cuda: launch.h's switches (PDL, the constants before the wait, the one fence) and launch state.
#include "backends/cuda/launch.h"

#include <atomic>

namespace ds41::cuda {
namespace {
TestableSwitch g_pdl{"DS41_PDL", true};
TestableSwitch g_pre_wait{"DS41_PRE_WAIT", true};
TestableSwitch g_one_fence{"DS41_ONE_FENCE", false};
}  // namespace

bool pdl_enabled() { return g_pdl.enabled(); }
bool pre_wait_enabled() { return g_pre_wait.enabled(); }
bool one_fence_enabled() { return g_one_fence.enabled(); }
void set_pre_wait_for_tests(int mode) { g_pre_wait.set(mode); }
void set_one_fence_for_tests(int mode) { g_one_fence.set(mode); }

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

void set_pdl_for_tests(int mode) { g_pdl.set(mode); }

}  // namespace ds41::cuda
