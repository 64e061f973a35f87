// ds41 engine: CpuEngine — engine::Engine over the CPU reference model (model::Model). Each
// sequence owns a model::SequenceState held in host memory; step() is one Model::forward over the
// batch (MODEL_SPEC 4.2-4.3: chunked prefill and decode are exact, and the reference's batch
// forward is row-independent, so a sequence's logits do not depend on what it is batched with).
//
// State export / import (the prefix cache) encodes the SequenceState with state_codec.h; the two
// bounded replays are model::Model's entry points (MODEL_SPEC 4.4, 4.5).
//
// Thread model: driven by one thread (Engine contract), except encode_images, which may run on one
// other thread concurrently with the rest: the tower (model::VisionTower::encode, const) reads only
// the vision weights and goes through the backend, whose weight cache is locked and whose
// ThreadPool takes concurrent parallel_for callers; nothing of seqs_ or the draft state is touched
// (CpuEngineConcurrency.EncodeWhileStepping runs it under ThreadSanitizer). The model (and its
// backend) must outlive the engine.
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>

#include "engine/dspark_decoder.h"
#include "engine/engine.h"
#include "model/model.h"

namespace ds41::engine {

class CpuEngine final : public Engine {
 public:
  // `model_name`: the served model name default (e.g. the model folder's name). `max_context`:
  // positions a sequence may reach (0: the config's max_position_embeddings; a smaller value is
  // vLLM's --max-model-len).
  CpuEngine(model::Model* model, std::string model_name, int64_t max_context = 0);

  const EngineInfo& info() const override { return info_; }
  Result<SeqId> create_sequence() override;
  Result<SeqId> fork_sequence(SeqId src) override;
  Status free_sequence(SeqId seq) override;
  Result<int64_t> sequence_position(SeqId seq) const override;
  Result<int64_t> sequence_bytes(SeqId seq) const override;
  int64_t bytes_for_tokens(int64_t tokens) const override;
  int64_t live_sequences() const override { return static_cast<int64_t>(seqs_.size()); }
  Status step(std::span<const StepItem> items, StepOutput* out) override;
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override;

  // State export / import (engine.h; layouts in state_codec.h).
  Result<std::vector<uint8_t>> export_kv_block(SeqId seq, int64_t index, int64_t block_tokens) const override;
  Result<std::vector<uint8_t>> export_swa_snapshot(SeqId seq, int64_t block_tokens,
                                                   bool approximate) const override;
  Status import_state(SeqId seq, std::span<const std::span<const uint8_t>> blocks,
                      std::span<const uint8_t> snapshot, int64_t block_tokens) override;
  Status replay_window(SeqId seq, std::span<const int32_t> prefix_tokens) override;
  Status prefill_decoder_replay(SeqId seq, std::span<const int32_t> tokens) override;
  // DSpark speculative decoding (MODEL_SPEC 3.10): once enabled (before any sequence exists),
  // every step() captures the context features and writes the draft rows of its positions.
  // FailedPrecondition when the checkpoint has no draft stages.
  Status enable_speculative() override;
  int64_t speculative_block() const override;
  Status speculative_step(std::span<const SpecStepItem> items, const SpecBatchOptions& batch,
                          std::vector<SpecStepResult>* out) override;

 private:
  Result<model::SequenceState*> find(SeqId seq) const;
  // After a state import or a bounded replay the draft rings hold no rows of the restored
  // positions: the draft restarts at the sequence's position (DsparkState::restart_at).
  void restart_draft(model::SequenceState& s) const;

  model::Model* model_;
  EngineInfo info_;
  int64_t bounded_bytes_ = 0;  // what a fresh SequenceState holds (window rings, pending groups)
  std::unordered_map<SeqId, std::unique_ptr<model::SequenceState>> seqs_;
  std::optional<DsparkDecoder> spec_;                    // enable_speculative()
  std::unordered_map<SeqId, std::mt19937_64> spec_rng_;  // sampled speculative steps
  SeqId next_id_ = 1;
};

}  // namespace ds41::engine
