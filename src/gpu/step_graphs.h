// ds41 gpu: StepGraphs — decode steps captured once as CUDA graphs and replayed (issue 10:
// "decode steps of a fixed batch shape can be captured and replayed as CUDA graphs").
//
// Run per segment of a step (gpu_forward.cpp: layer 0, then the other layers with the head; the
// prologue is launched directly), so the host records a segment while the device runs the one before.
//
// A step's launches depend on its plan (row counts, score columns, arena addresses of the step's
// metadata, which kernels run at all). Instead of trusting a hand-made key, a step is keyed by its
// launch signature (cuda::LaunchRecorder, backends/cuda/launch.h): a dry pass runs the step's host
// code with a recorder set, so every launch, copy, fill and timing event appends its exact
// arguments and nothing reaches the device. Equal signatures mean equal launches, so:
//   hit   -> cudaGraphLaunch of the graph captured for that signature (the metadata upload node
//            copies the step's freshly planned arena; the logits copy lands in the pinned buffer);
//   miss  -> the first time a signature is seen the segment runs directly (a capture costs
//            0.3-0.5 ms of host time per segment on the H200 host: a serving batch whose shape
//            changes every step must not pay it every step); seen again, it is captured
//            (cudaStreamCaptureModeThreadLocal: the vision encoder thread keeps its own stream)
//            and instantiated, or an evicted graph of the same topology is updated in place
//            (cudaGraphExecUpdate), then launched.
// The dry pass runs inside a stream capture that must stay empty: stream work that bypasses
// launch() / copy_async() / fill_async() / record_event() (a raw <<<>>>, cuBLAS) would land there
// instead of on the device; StepGraphs then runs that step directly and counts it as `unrouted`
// (tests require 0). Any capture or instantiation failure also falls back to the direct run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <list>
#include <vector>

#include "backends/cuda/launch.h"
#include "core/status.h"

namespace ds41::gpu {

struct StepGraphStats {
  int64_t hits = 0;       // replays of a cached graph
  int64_t captures = 0;   // new graphs instantiated
  int64_t updates = 0;    // evicted graphs updated in place for a new signature
  int64_t deferred = 0;   // first sightings of a signature, run directly (captured when seen again)
  int64_t direct = 0;     // steps run without a graph (capture or instantiation refused)
  int64_t unrouted = 0;   // of those: stream work outside the recorded functions
  // Host time (microseconds, summed): the dry passes with their lookups, the captures with their
  // instantiations / updates, the graph launches. Parts of dry_us: check_us, the empty stream
  // capture around each dry pass (begin, end, node count, destroy: ~7 us per batch-1 step on the
  // H200 host, measured without it once, docs/perf session of 2026-12-05 02:36 UTC); key_us, the
  // signature's hash and the cache lookup.
  double dry_us = 0, capture_us = 0, launch_us = 0;
  double check_us = 0, key_us = 0;
};

class StepGraphs {
 public:
  // capacity: graphs kept (least recently used evicted); 0 disables (every step direct).
  explicit StepGraphs(int64_t capacity);
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `enqueue` (which puts one step's work on `stream`, no synchronisation, no host reads of
  // device memory) as described above. `enqueue` runs two or three times on a miss and must be
  // idempotent on the host (it may not consume its inputs).
  Status run(cudaStream_t stream, const std::function<Status()>& enqueue);

  const StepGraphStats& stats() const { return stats_; }
  int64_t cached() const { return static_cast<int64_t>(entries_.size()); }
  // Drops every cached graph (e.g. when the buffers the graphs point at are freed).
  void clear();

 private:
  struct Entry {
    uint64_t hash = 0;
    std::vector<uint8_t> key;
    cudaGraphExec_t exec = nullptr;
  };
  Status capture(cudaStream_t stream, const std::function<Status()>& enqueue, cudaGraph_t* graph);

  int64_t capacity_ = 0;
  std::list<Entry> entries_;  // most recently used first
  std::vector<uint64_t> seen_;  // hashes of signatures run directly once (a ring of 4 * capacity)
  size_t seen_next_ = 0;
  cuda::LaunchRecorder rec_;  // the dry pass's (its buffer kept across calls)
  StepGraphStats stats_;
};

// 64-bit XXH3 of a signature (the cache compares the full bytes after the hash).
uint64_t signature_hash(const std::vector<uint8_t>& bytes);

}  // namespace ds41::gpu
