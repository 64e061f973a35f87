// ds41 gpu: CudaEngine — engine::Engine over the GPU executor (GpuForward) and a DeviceModel.
// Each sequence is a slot of SequenceSlots (window rings, pending groups), page lists in the
// KvBlockPool (compressed Q_kv rows + Q_idx keys) and a small host mirror (GpuSequence). A step
// larger than the forward's limits runs as several forwards in order (exact: the forward is
// row-independent and chunked prefill is exact, MODEL_SPEC 4.2-4.3). fork_sequence shares the
// full pages (refcounted) and copies the partial last page and the bounded state.
//
// Thread model: driven by one thread (Engine contract). The DeviceModel must outlive the engine.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <unordered_map>

#include "engine/engine.h"
#include "gpu/device_model.h"
#include "gpu/gpu_forward.h"
#include "gpu/kv_block_pool.h"
#include "gpu/sequence_slots.h"

namespace ds41::gpu {

struct CudaEngineOptions {
  std::string model_name;
  GpuLimits limits;                     // one forward's rows / sequences / context (gpu_workspace.h)
  int64_t max_sequences = 64;           // live sequences (slots)
  int64_t kv_bytes = int64_t{8} << 30;  // device bytes of the KV block pool
  int64_t entries_per_page = 64;        // compressed entries per page
};

class CudaEngine final : public engine::Engine {
 public:
  static Result<std::unique_ptr<CudaEngine>> create(const DeviceModel* model, const CudaEngineOptions& opt);
  ~CudaEngine() override;

  const engine::EngineInfo& info() const override { return info_; }
  Result<engine::SeqId> create_sequence() override;
  Result<engine::SeqId> fork_sequence(engine::SeqId src) override;
  Status free_sequence(engine::SeqId seq) override;
  Result<int64_t> sequence_position(engine::SeqId seq) const override;
  Result<int64_t> sequence_bytes(engine::SeqId seq) const override;
  int64_t bytes_for_tokens(int64_t tokens) const override;
  int64_t live_sequences() const override { return static_cast<int64_t>(seqs_.size()); }
  Status step(std::span<const engine::StepItem> items, engine::StepOutput* out) override;

  // Tests and tools: one step with the reference's logits-row choice and records, outputs per item
  // (positions + logits rows, selections when record). Same validation and splitting as step().
  // layer_ms (benchmarks): per-layer milliseconds of the last forward of the step (gpu_forward.h).
  Status forward(std::span<const engine::StepItem> items, model::LogitsRows rows, bool record,
                 std::vector<model::SequenceOutput>* out, std::vector<float>* layer_ms = nullptr);

  const KvBlockPool& pool() const { return pool_; }
  const GpuForward& executor() const { return *fwd_; }

 private:
  CudaEngine() = default;
  Result<GpuSequence*> find(engine::SeqId seq) const;
  Status validate(std::span<const engine::StepItem> items) const;
  void release(GpuSequence& s);

  const DeviceModel* model_ = nullptr;
  engine::EngineInfo info_;
  cudaStream_t stream_ = nullptr;
  KvBlockPool pool_;
  SequenceSlots slots_;
  std::unique_ptr<GpuForward> fwd_;
  int64_t bounded_bytes_ = 0;
  std::unordered_map<engine::SeqId, std::unique_ptr<GpuSequence>> seqs_;
  engine::SeqId next_id_ = 1;
};

}  // namespace ds41::gpu
