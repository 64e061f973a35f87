// ds41 backends/cuda: kernel launches with programmatic dependent launch (PDL, sm_90+).
//
// A decode step is ~400 short kernels in one stream; without PDL each one starts only after the
// previous one has fully drained, so every boundary costs a launch plus a ramp-up of its loads.
// `launch()` sets cudaLaunchAttributeProgrammaticStreamSerialization: the kernel may be scheduled
// while its predecessor still runs, and must call dev::pdl_wait() (pdl.cuh) before it reads
// anything an earlier kernel wrote or writes anything at all. Work that depends on nothing earlier
// in the stream (issuing loads of weights, computing addresses) may come before the wait, which
// is how the GEMVs overlap their first weight loads with the previous kernel's tail.
//
// The contract every kernel launched here keeps (docs/gpu_kernels.md "PDL"):
//   1. no global write and no read of a buffer written earlier in the stream before pdl_wait();
//   2. pdl_trigger() (griddepcontrol.launch_dependents) only after pdl_wait(), and no CTA exits
//      before its pdl_wait(): a dependent can then run ahead by at most one kernel.
//   3. Hence, when kernel n starts, kernel n - 2 and everything before it have completed and their
//      writes reached L2 (kernel n - 1 passed its wait before it let n launch): kernel n may read
//      such buffers before its own wait, through L2 (ld.global.cg: no stale L1 line), where its
//      caller knows who wrote them (the MoE's w2 reads the routing that way: try_experts'
//      routing_early). Nothing written by kernel n - 1, and no write at all, before the wait.
// pdl_wait() returns only after every earlier kernel has completed and its writes are visible, so
// the results are those of plain stream order. DS41_PDL=0 launches without the attribute (the
// waits are then no-ops).
//
// Under the host SIMT emulator (scripts/cuda-host-emu) launch() runs the grid on the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ds41::cuda {

// An A/B switch of the environment: on unless the variable is set to "0" (the caller reads it once).
inline bool switch_on(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::strcmp(e, "0") == 0);
}
// An opt-in switch of the environment: off unless the variable is set to "1" (the caller reads it once).
inline bool switch_opt_in(const char* name) {
  const char* e = std::getenv(name);
  return e && std::strcmp(e, "1") == 0;
}

// A switch of the environment read once (on_by_default: switch_on, else switch_opt_in) that a test may override
// (set: -1 back to the environment, 0 off, 1 on). A namespace-scope object; enabled() reads the environment on its
// first call.
struct TestableSwitch {
  const char* name;
  bool on_by_default;
  std::atomic<int> override_mode{-1};
  std::atomic<int> env_mode{-1};
  bool enabled() {
    const int o = override_mode.load(std::memory_order_relaxed);
    if (o >= 0) return o != 0;
    int e = env_mode.load(std::memory_order_relaxed);
    if (e < 0) {
      e = (on_by_default ? switch_on(name) : switch_opt_in(name)) ? 1 : 0;
      env_mode.store(e, std::memory_order_relaxed);
    }
    return e != 0;
  }
  void set(int mode) { override_mode.store(mode < 0 ? -1 : (mode != 0 ? 1 : 0), std::memory_order_relaxed); }
};

// Whether launch() asks for programmatic serialization: DS41_PDL (default on), read once.
bool pdl_enabled();
// Tests: 0 off, 1 on, -1 back to DS41_PDL.
void set_pdl_for_tests(int mode);
// Whether the decode chain's small kernels load their constant inputs (norm weights; rotation tables from
// the step plan's positions and the inv_freq weights) before their PDL wait (contract 1: nothing a kernel
// of the step writes): the hc collapse + norm, rows_norm_rope_quant, the window KV step's rows and the
// decode attention's query table. DS41_PRE_WAIT (default on; 0: after the wait, as measured until
// 2026-12-07), read once. The same bits either way.
bool pre_wait_enabled();
// Tests: 0 off, 1 on, -1 back to DS41_PRE_WAIT.
void set_pre_wait_for_tests(int mode);
// The last-block counts (last_block.cuh count_last_block) with one thread's fence after a barrier instead of
// every thread's: DS41_ONE_FENCE=1 (opt-in: neutral in decode on an H100, docs/perf/README.md session of
// 2026-12-07 14:51 UTC), read once. The same bits.
bool one_fence_enabled();
// Tests: 0 off, 1 on, -1 back to DS41_ONE_FENCE.
void set_one_fence_for_tests(int mode);
// The first error a launch() of the calling thread got since the last call (cudaSuccess if none),
// cleared by the read: last_launch_status() reports it with cudaGetLastError's.
cudaError_t take_launch_error();
void note_launch_error(cudaError_t e);
// Kernels launched through launch() by the calling thread so far (benchmarks: kernels per layer;
// the engine loop and a vision encoder thread each count their own).
uint64_t& thread_launch_count();

// ---- Launch signatures (the keys of captured decode steps: src/gpu/step_graphs.h) ----
// While a recorder is set on the calling thread, launch() and the stream operations below do not
// reach the device: each appends what it would do to the recorder instead (the kernel's address,
// grid, block, shared memory, stream and every argument's bytes; a copy's or fill's addresses,
// size and kind). Two steps with equal signatures therefore make exactly the same launches, and a
// graph captured from one replays the other. Stream work that bypasses these functions is not
// recorded: StepGraphs finds it (the dry pass runs inside a stream capture that must stay empty).
class LaunchRecorder {
 public:
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  template <class T>
  void value(const T& v) {
    add(&v, sizeof(T));
  }
  void op(uint32_t tag) {
    value(tag);
    ++ops_;
  }
  // One operation: its tag and the bytes of every value, in order, appended with one resize (the
  // same bytes as op(tag) and value(v)... : a kernel launch records ~10 values, ~250 launches a step).
  template <class... T>
  void record(uint32_t tag, const T&... v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(tag) + (sizeof(T) + ... + size_t{0}));
    uint8_t* w = bytes_.data() + at;
    std::memcpy(w, &tag, sizeof(tag));
    w += sizeof(tag);
    ((std::memcpy(w, &v, sizeof(T)), w += sizeof(T)), ...);
    ++ops_;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  int64_t ops() const { return ops_; }
  void clear() {
    bytes_.clear();
    ops_ = 0;
  }

 private:
  std::vector<uint8_t> bytes_;
  int64_t ops_ = 0;
};
// The calling thread's recorder (null: launches go to the device).
LaunchRecorder*& thread_recorder();
// Set by StepGraphs while the calling thread captures a step for real: record_event() then
// records timing events as graph nodes (cudaEventRecordExternal).
bool& thread_capturing();

// Stream operations of a step, recorded like launch() under a recorder (cudaSuccess then).
cudaError_t copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t copy_2d_async(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                          cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t fill_async(void* dst, int value, size_t bytes, cudaStream_t stream);
cudaError_t record_event(cudaEvent_t event, cudaStream_t stream);
// A fork or join between two streams of a step: `waiter`'s later work waits for everything enqueued on
// `signaler` so far (cudaEventRecord of `event` on signaler, cudaStreamWaitEvent on waiter; inside a
// stream capture both become graph edges and the waiter joins the capture). Recorded like launch()
// under a recorder. `event` is reusable right after the call (the wait takes the record it sees).
cudaError_t stream_wait(cudaStream_t waiter, cudaStream_t signaler, cudaEvent_t event);

#if defined(__CUDACC__)
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  ++thread_launch_count();
  // Only on a stream the engine created: the legacy default stream (tests, tools) keeps plain
  // stream order, so a copy enqueued there is never overtaken.
  const bool own_stream = stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread;
  const bool pdl = own_stream && pdl_enabled();
  if (LaunchRecorder* r = thread_recorder()) {
    const uint32_t dims[8] = {grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<uint32_t>(smem), pdl};
    r->record(1u, reinterpret_cast<uintptr_t>(kernel), dims, stream, static_cast<P>(args)...);
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  // The caller's last_launch_status() reports an error, as for <<<>>>.
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
  if (e != cudaSuccess) note_launch_error(e);
}
#elif defined(DS41_SIMT_EMU)  // the host SIMT emulator (simt_emu.h is included first): run the grid here
template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  ++thread_launch_count();
  if (LaunchRecorder* r = thread_recorder()) {
    const uint32_t dims[8] = {grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<uint32_t>(smem), 0};
    r->record(1u, reinterpret_cast<uintptr_t>(kernel), dims, stream, static_cast<P>(args)...);
    return;
  }
  emu::Launch(grid, block.x, smem, stream).run(kernel, static_cast<P>(args)...);
}
#endif

}  // namespace ds41::cuda
