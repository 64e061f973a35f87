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

void set_pdl_for_tests(int mode) { g_pdl_override.store(mode < 0 ? -1 : (mode != 0 ? 1 : 0)); }

}  // namespace ds41::cuda
