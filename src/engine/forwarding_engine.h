// ds41 engine: ForwardingEngine — an Engine that forwards every entry point, the optional ones
// included, to another Engine. The base of wrappers that add one thing around an engine (ownership
// of the model it computes with: tools/engine_factory.cpp; recording calls: tests). Every entry
// point is forwarded: a default left here would answer "unimplemented" for an inner engine that
// has it (images and the prefix cache failed through a wrapper that way before).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/engine.h"

namespace ds41::engine {

class ForwardingEngine : public Engine {
 public:
  // inner outlives the wrapper (or is owned by the derived class, destroyed after it is used).
  explicit ForwardingEngine(Engine* inner) : inner_(inner) {}

  const EngineInfo& info() const override { return inner_->info(); }
  Result<SeqId> create_sequence() override { return inner_->create_sequence(); }
  Result<SeqId> fork_sequence(SeqId s) override { return inner_->fork_sequence(s); }
  Status free_sequence(SeqId s) override { return inner_->free_sequence(s); }
  Result<int64_t> sequence_position(SeqId s) const override { return inner_->sequence_position(s); }
  Result<int64_t> sequence_bytes(SeqId s) const override { return inner_->sequence_bytes(s); }
  int64_t bytes_for_tokens(int64_t t) const override { return inner_->bytes_for_tokens(t); }
  int64_t live_sequences() const override { return inner_->live_sequences(); }
  Status step(std::span<const StepItem> items, StepOutput* out) override { return inner_->step(items, out); }
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override {
    return inner_->encode_images(images);
  }
  Result<std::vector<uint8_t>> export_kv_block(SeqId s, int64_t index, int64_t block_tokens) const override {
    return inner_->export_kv_block(s, index, block_tokens);
  }
  Result<std::vector<uint8_t>> export_swa_snapshot(SeqId s, int64_t block_tokens, bool approximate) const override {
    return inner_->export_swa_snapshot(s, block_tokens, approximate);
  }
  Status import_state(SeqId s, std::span<const std::span<const uint8_t>> blocks, std::span<const uint8_t> snapshot,
                      int64_t block_tokens) override {
    return inner_->import_state(s, blocks, snapshot, block_tokens);
  }
  Status replay_window(SeqId s, std::span<const int32_t> prefix_tokens) override {
    return inner_->replay_window(s, prefix_tokens);
  }
  Status prefill_decoder_replay(SeqId s, std::span<const int32_t> tokens) override {
    return inner_->prefill_decoder_replay(s, tokens);
  }
  Status enable_speculative() override { return inner_->enable_speculative(); }
  int64_t speculative_block() const override { return inner_->speculative_block(); }
  Status speculative_step(std::span<const SpecStepItem> items, const SpecBatchOptions& batch,
                          std::vector<SpecStepResult>* out) override {
    return inner_->speculative_step(items, batch, out);
  }

 protected:
  Engine* inner() const { return inner_; }

 private:
  Engine* inner_;
};

}  // namespace ds41::engine
