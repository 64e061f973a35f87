// ds41 gpu: StepGraphs (step_graphs.h): the dry pass, the signature cache, capture and replay.
#include "gpu/step_graphs.h"

#include <chrono>
#include <cstring>

#include <xxhash.h>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/launch.h"

namespace ds41::gpu {

uint64_t signature_hash(const std::vector<uint8_t>& bytes) {
  // XXH3 (~40 KB per decode step; FNV-1a's multiply chain took ~8 us of it on the H200 host).
  return XXH3_64bits(bytes.data(), bytes.size());
}

StepGraphs::StepGraphs(int64_t capacity) : capacity_(capacity) {}

StepGraphs::~StepGraphs() { clear(); }

void StepGraphs::clear() {
  for (Entry& e : entries_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
  entries_.clear();
  seen_.clear();
  seen_next_ = 0;
}

Status StepGraphs::capture(cudaStream_t stream, const std::function<Status()>& enqueue, cudaGraph_t* graph) {
  *graph = nullptr;
  DS41_RETURN_IF_ERROR(cuda::cuda_status(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                         "begin a decode-step capture"));
  cuda::thread_capturing() = true;
  Status st = enqueue();
  cuda::thread_capturing() = false;
  const cudaError_t e = cudaStreamEndCapture(stream, graph);
  if (!st.ok()) {
    if (*graph) cudaGraphDestroy(*graph);
    *graph = nullptr;
    return st;
  }
  return cuda::cuda_status(e, "end a decode-step capture");
}

Status StepGraphs::run(cudaStream_t stream, const std::function<Status()>& enqueue) {
  auto direct = [&](bool unrouted) {
    cudaGetLastError();  // a refused capture call leaves its error behind: not this step's
    ++stats_.direct;
    if (unrouted) ++stats_.unrouted;
    return enqueue();
  };
  if (capacity_ <= 0) return direct(false);

  using Clock = std::chrono::steady_clock;
  auto us_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  };
  const Clock::time_point t0 = Clock::now();
  // 1. The dry pass: the recorder takes every launch; the capture around it must stay empty.
  {
    cuda::LaunchRecorder& rec = rec_;
    rec.clear();
    Clock::time_point tc = Clock::now();
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return direct(false);
    stats_.check_us += us_since(tc);
    cuda::thread_recorder() = &rec;
    const Status st = enqueue();
    cuda::thread_recorder() = nullptr;
    tc = Clock::now();
    cudaGraph_t dry = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream, &dry);
    size_t nodes = 0;
    if (e == cudaSuccess && dry) {
      if (cudaGraphGetNodes(dry, nullptr, &nodes) != cudaSuccess) nodes = 1;
      cudaGraphDestroy(dry);
    }
    stats_.check_us += us_since(tc);
    // An error (a host-side one, or a call the capture refused): the direct run gives the real answer.
    if (!st.ok() || e != cudaSuccess) return direct(false);
    if (nodes > 0) return direct(true);
  }

  // 2. A graph captured for the same launches.
  const Clock::time_point tk = Clock::now();
  const std::vector<uint8_t>& key = rec_.bytes();
  const uint64_t h = signature_hash(key);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->hash != h || it->key != key) continue;
    entries_.splice(entries_.begin(), entries_, it);
    ++stats_.hits;
    stats_.key_us += us_since(tk);
    stats_.dry_us += us_since(t0);
    const Clock::time_point t1 = Clock::now();
    const Status st = cuda::cuda_status(cudaGraphLaunch(entries_.front().exec, stream), "replay a captured decode step");
    stats_.launch_us += us_since(t1);
    return st;
  }
  stats_.key_us += us_since(tk);
  stats_.dry_us += us_since(t0);

  // 3. A signature seen for the first time runs directly; the second time it is captured.
  bool again = false;
  for (uint64_t& x : seen_)
    if (x == h) {
      again = true;
      x = 0;  // forgotten: the graph takes over
      break;
    }
  if (!again) {
    const size_t ring = static_cast<size_t>(4 * capacity_);
    if (seen_.size() < ring) {
      seen_.push_back(h);
    } else {
      seen_[seen_next_] = h;
      seen_next_ = (seen_next_ + 1) % ring;
    }
    ++stats_.deferred;
    return enqueue();
  }

  // 4. Capture this step; reuse the least recently used graph's executable when it is full.
  const Clock::time_point t2 = Clock::now();
  cudaGraph_t graph = nullptr;
  if (!capture(stream, enqueue, &graph).ok()) return direct(false);
  cudaGraphExec_t exec = nullptr;
  if (static_cast<int64_t>(entries_.size()) >= capacity_) {
    Entry victim = std::move(entries_.back());
    entries_.pop_back();
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(victim.exec, graph, &info) == cudaSuccess) {
      exec = victim.exec;
      ++stats_.updates;
    } else {
      cudaGetLastError();
      cudaGraphExecDestroy(victim.exec);
    }
  }
  if (!exec) {
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
      cudaGraphDestroy(graph);
      return direct(false);
    }
    ++stats_.captures;
  }
  cudaGraphDestroy(graph);
  entries_.push_front(Entry{h, key, exec});
  stats_.capture_us += us_since(t2);
  const Clock::time_point t3 = Clock::now();
  const Status st = cuda::cuda_status(cudaGraphLaunch(exec, stream), "launch a captured decode step");
  stats_.launch_us += us_since(t3);
  return st;
}

}  // namespace ds41::gpu
