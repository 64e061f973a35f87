// The launch recorder (backends/cuda/launch.h) that keys captured decode steps (gpu/step_graphs.h):
// under a recorder, launchers and stream operations reach no device (these tests run without one:
// a launch would fail there, a copy or fill would touch the memory) and append exactly what they
// would do, so equal signatures mean equal launches and any changed argument changes the signature.
#include <gtest/gtest.h>

#include <vector>

#include "backends/cuda/elementwise_kernels.h"
#include "backends/cuda/launch.h"
#include "gpu/step_graphs.h"

namespace ds41::cuda {
namespace {

struct Recording {
  LaunchRecorder rec;
  Recording() { thread_recorder() = &rec; }
  ~Recording() { thread_recorder() = nullptr; }
};

std::vector<uint8_t> record(float* x, int64_t count, float s, cudaStream_t stream) {
  Recording r;
  const uint64_t before = thread_launch_count();
  EXPECT_TRUE(run_scale(x, count, s, stream).ok());
  EXPECT_EQ(thread_launch_count(), before + 1);  // counted like a launch (kernels per layer)
  EXPECT_EQ(r.rec.ops(), 1);
  return r.rec.bytes();
}

TEST(LaunchRecorder, KernelArgumentsGridAndStreamAreTheSignature) {
  float x[4] = {1, 2, 3, 4};
  auto* p = reinterpret_cast<float*>(0x10000);
  auto* stream = reinterpret_cast<cudaStream_t>(0x20);
  const auto base = record(p, 1000, 0.5f, stream);
  EXPECT_EQ(record(p, 1000, 0.5f, stream), base);            // the same launch
  EXPECT_NE(record(p + 1, 1000, 0.5f, stream), base);        // another pointer
  EXPECT_NE(record(p, 1001, 0.5f, stream), base);            // another count (same grid)
  EXPECT_NE(record(p, 1000, 0.25f, stream), base);           // another scalar
  EXPECT_NE(record(p, 100000, 0.5f, stream), base);          // another grid
  EXPECT_NE(record(p, 1000, 0.5f, nullptr), base);           // another stream
  set_pdl_for_tests(0);
  EXPECT_NE(record(p, 1000, 0.5f, stream), base);            // without programmatic dependent launch
  set_pdl_for_tests(-1);
  EXPECT_NE(gpu::signature_hash(record(p, 1001, 0.5f, stream)), gpu::signature_hash(base));
  // Recorded, not run: the host buffer is untouched.
  EXPECT_TRUE(run_scale(x, 0, 2.0f, nullptr).ok());
  {
    Recording r;
    EXPECT_TRUE(run_scale(x, 4, 2.0f, nullptr).ok());
  }
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[3], 4.0f);
}

TEST(LaunchRecorder, CopiesFillsAndEventsAreRecordedNotRun) {
  std::vector<uint8_t> a(64, 1), b(64, 2);
  std::vector<uint8_t> sig1, sig2, sig3;
  {
    Recording r;
    EXPECT_EQ(copy_async(a.data(), b.data(), 64, cudaMemcpyHostToHost, nullptr), cudaSuccess);
    EXPECT_EQ(fill_async(a.data(), 7, 64, nullptr), cudaSuccess);
    EXPECT_EQ(copy_2d_async(a.data(), 8, b.data(), 8, 8, 8, cudaMemcpyHostToHost, nullptr), cudaSuccess);
    EXPECT_EQ(record_event(reinterpret_cast<cudaEvent_t>(0x30), nullptr), cudaSuccess);
    EXPECT_EQ(r.rec.ops(), 4);
    sig1 = r.rec.bytes();
  }
  EXPECT_EQ(a, std::vector<uint8_t>(64, 1));  // nothing copied or filled
  {
    Recording r;
    copy_async(a.data(), b.data(), 64, cudaMemcpyHostToHost, nullptr);
    fill_async(a.data(), 7, 32, nullptr);  // another size
    copy_2d_async(a.data(), 8, b.data(), 8, 8, 8, cudaMemcpyHostToHost, nullptr);
    record_event(reinterpret_cast<cudaEvent_t>(0x30), nullptr);
    sig2 = r.rec.bytes();
  }
  {
    Recording r;
    copy_async(a.data(), b.data(), 64, cudaMemcpyHostToHost, nullptr);
    fill_async(a.data(), 7, 64, nullptr);
    copy_2d_async(a.data(), 8, b.data(), 8, 8, 8, cudaMemcpyHostToHost, nullptr);
    record_event(reinterpret_cast<cudaEvent_t>(0x30), nullptr);
    sig3 = r.rec.bytes();
  }
  EXPECT_NE(sig1, sig2);
  EXPECT_EQ(sig1, sig3);
}

// A fork / join between the engine's streams (GpuForward::concurrently) is part of the signature:
// a graph captured with the side stream's branch must not replay a step enqueued in order.
TEST(LaunchRecorder, StreamWaitsAreRecordedNotRun) {
  auto* main = reinterpret_cast<cudaStream_t>(0x20);
  auto* side = reinterpret_cast<cudaStream_t>(0x28);
  auto* ev = reinterpret_cast<cudaEvent_t>(0x30);
  auto sig = [&](cudaStream_t waiter, cudaStream_t signaler, cudaEvent_t e) {
    Recording r;
    EXPECT_EQ(stream_wait(waiter, signaler, e), cudaSuccess);  // no device: the real calls would fail
    EXPECT_EQ(r.rec.ops(), 1);
    return r.rec.bytes();
  };
  const auto fork = sig(side, main, ev);
  EXPECT_EQ(sig(side, main, ev), fork);
  EXPECT_NE(sig(main, side, ev), fork);  // a join is not a fork
  EXPECT_NE(sig(side, main, reinterpret_cast<cudaEvent_t>(0x38)), fork);
  Recording r;
  const uint64_t before = thread_launch_count();
  EXPECT_EQ(stream_wait(side, main, ev), cudaSuccess);
  EXPECT_EQ(thread_launch_count(), before);  // not a kernel (kernels per layer count launches only)
}

TEST(StepGraphs, DisabledRunsTheStepDirectly) {
  gpu::StepGraphs g(0);
  int runs = 0;
  EXPECT_TRUE(g.run(nullptr, [&] {
                 ++runs;
                 return ok_status();
               }).ok());
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(g.stats().direct, 1);
  EXPECT_EQ(g.stats().hits + g.stats().captures, 0);
}

}  // namespace
}  // namespace ds41::cuda
