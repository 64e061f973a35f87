// ds41 gpu: CudaEngine — engine::Engine over the GPU executor (GpuForward) and a DeviceModel.
// Each sequence is a slot of SequenceSlots (window rings, pending groups), page lists in the
// KvBlockPool (compressed Q_kv rows + Q_idx keys) and a small host mirror (GpuSequence). A step
// larger than the forward's limits runs as several forwards in order (exact: the forward is
// row-independent and chunked prefill is exact, MODEL_SPEC 4.2-4.3). fork_sequence shares the
// full pages (refcounted) and copies the partial last page and the bounded state.
//
// State export / import (the prefix cache, engine.h) writes and reads the payloads of
// engine/state_codec.h with the CPU engine's code: export copies only the rows a payload needs
// from the pages / slot to the host (a block's B / ratio entries per source; for a snapshot the
// slot's rings, the partial block's entries and the pending groups) and encodes a StateView of
// them; import parses and checks everything first, then takes pages and uploads. replay_window is
// MODEL_SPEC 4.5 with the per-layer window floors of GpuSequence; prefill_decoder_replay is 4.4
// with the CPU reference's semantics: a forward of the rows before the last window that stops at
// the last KV source (GpuForwardOptions::last_layer), the later layers' floors raised, then a full
// forward of the last window.
//
// Images (MODEL_SPEC 3.11): encode_images runs GpuVisionTower on the engine's encoder stream (its
// own non-blocking stream, cuBLAS handle and workspace); step items carry image spans exactly as for
// the CPU engine (flags + span rows, sliced with their chunk).
//
// Thread model: driven by one thread (Engine contract), except encode_images, which may run on one
// other thread (the engine loop's ImageEncoder) concurrently with every other call: the tower shares
// nothing with the forward but the read-only weights, and its kernels, copies and waits go to the
// encoder stream only, so the two overlap on the device and give the serial path's bits
// (GpuVision.EncodeConcurrentWithStepsIsBitIdenticalToSerial). encode_images calls are serialized
// by a mutex. A CUDA graph capture on the engine stream must therefore use
// cudaStreamCaptureModeThreadLocal (or relaxed): in the global mode the encoder thread's pageable
// copies and stream waits would be refused while the capture is open. The DeviceModel must outlive
// the engine.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>

#include "engine/engine.h"
#include "engine/state_view.h"
#include "gpu/device_model.h"
#include "gpu/gpu_forward.h"
#include "gpu/gpu_vision_tower.h"
#include "gpu/kv_block_pool.h"
#include "gpu/sequence_slots.h"

namespace ds41::gpu {

struct CudaEngineOptions {
  std::string model_name;
  GpuLimits limits;                     // one forward's rows / sequences / context (gpu_workspace.h)
  int64_t max_sequences = 64;           // live sequences (slots)
  int64_t kv_bytes = int64_t{8} << 30;  // device bytes of the KV block pool
  int64_t entries_per_page = 64;        // compressed entries per page
  // The vision tower (models with vision_config): created with the engine (its workspace holds one
  // batch of `vision_limits.max_patches` patches, by default one image of the config's maximum);
  // false: no tower (encode_images refuses; steps still take image spans with given rows).
  bool vision = true;
  GpuVisionLimits vision_limits;
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
  // Span rows per image (MODEL_SPEC 3.11) from the GPU tower, one batch (model::encode_prepared_images).
  Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) override;

  Result<std::vector<uint8_t>> export_kv_block(engine::SeqId seq, int64_t index,
                                               int64_t block_tokens) const override;
  Result<std::vector<uint8_t>> export_swa_snapshot(engine::SeqId seq, int64_t block_tokens,
                                                   bool approximate) const override;
  Status import_state(engine::SeqId seq, std::span<const std::span<const uint8_t>> blocks,
                      std::span<const uint8_t> snapshot, int64_t block_tokens) override;
  Status replay_window(engine::SeqId seq, std::span<const int32_t> prefix_tokens) override;
  Status prefill_decoder_replay(engine::SeqId seq, std::span<const int32_t> tokens) override;

  // DSpark speculative decoding (MODEL_SPEC 3.10; docs/dspark.md "GPU engine"): as CpuEngine.
  // enable_speculative allocates the draft rings / buffers (before any sequence exists) and needs
  // max_logit_rows and max_step_tokens >= block + 1; then every forward captures the context
  // features and commits the draft rows of its positions. speculative_step runs, per group of items
  // that fits the limits, ONE batched draft; then chooses every item's verify length under the
  // call's budget (MODEL_SPEC 3.10.9, engine::budget_verify_lengths over all groups); then per
  // group ONE journaled verification forward over [anchor, c_0 .. c_{l-1}] of every item, the
  // acceptance rules of engine/speculative.h on the host, the device rollback of the rejected rows
  // (GpuForward::rollback_spec) and the context rows of the committed positions.
  Status enable_speculative() override;
  int64_t speculative_block() const override;
  Status speculative_step(std::span<const engine::SpecStepItem> items, const engine::SpecBatchOptions& batch,
                          std::vector<engine::SpecStepResult>* out) override;
  // Benchmarks: where a speculative step's time goes. While set (non-null), every speculative_step
  // synchronises the stream between its phases and OVERWRITES *p with the step's milliseconds per
  // phase (summed over the step's groups) and the last verification forward's per-layer times and
  // kernel counts. The synchronisations cost a few microseconds each; off by default.
  struct SpecProfile {
    double draft_ms = 0, verify_forward_ms = 0, accept_ms = 0, rollback_ms = 0, commit_ms = 0;
    int64_t groups = 0, verify_rows = 0;
    std::vector<float> verify_layer_ms;
    std::vector<int64_t> verify_layer_launches;
  };
  void profile_speculative(SpecProfile* p) { spec_prof_ = p; }
  // Tests: the draft for an anchor at the sequence's position (no state changes), with record
  // (base logits, hidden); the packed draft window rows of stage s for positions [first, first + n).
  Result<model::DraftOutput> draft(engine::SeqId seq, int32_t anchor, bool record);
  Status draft_window_rows(engine::SeqId seq, int64_t stage, int64_t first, int64_t n, std::vector<uint8_t>* out);
  // Tests: the last forward's captured features of rows [row_begin, row_begin + n).
  Status last_features(int64_t row_begin, int64_t n, std::vector<float>* out) { return fwd_->download_features(row_begin, n, out); }
  // Tests and `ds41 score`: the main_x rows the last forward committed (GpuForward::download_main_x:
  // per item its last min(tokens, window) rows, in item order).
  Status last_main_x(int64_t n, std::vector<float>* out) { return fwd_->download_main_x(n, out); }

  // Tests and tools: one step with the reference's logits-row choice and records, outputs per item
  // (positions + logits rows, selections when record). Same validation and splitting as step().
  // layer_ms / layer_launches (benchmarks): per-layer milliseconds and kernels launched of the last
  // forward of the step (gpu_forward.h). logits_to (optional): item i's logits rows go there from
  // the pinned arena, `logits_to(i, rows, n)` per round that yields some (GpuForwardOptions::
  // logits_to), instead of into out[i].logits.
  using LogitsSink = std::function<void(size_t item, const float* rows, int64_t n)>;
  Status forward(std::span<const engine::StepItem> items, model::LogitsRows rows, bool record,
                 std::vector<model::SequenceOutput>* out, std::vector<float>* layer_ms = nullptr,
                 std::vector<int64_t>* layer_launches = nullptr, const LogitsSink& logits_to = {});
  // prefill_decoder_replay with the kept rows' logits (`ds41 score --replay decoder`): rows kAll /
  // kLast of the last min(window, tokens) positions, as model::Model::prefill_decoder_replay.
  Status decoder_replay(engine::SeqId seq, std::span<const int32_t> tokens, model::LogitsRows rows,
                        model::SequenceOutput* out);

  const KvBlockPool& pool() const { return pool_; }
  const DeviceModel& device_model() const { return *model_; }
  const GpuForward& executor() const { return *fwd_; }
  // Benchmarks: each forward times its device span (GpuForward::HostTimes::device_us).
  void set_device_span(bool on) { fwd_->set_device_span(on); }
  // The vision tower (null without vision_config or with CudaEngineOptions::vision false); tests
  // and benchmarks run it directly (vit_out, timing).
  GpuVisionTower* vision_tower() { return vision_.get(); }

 private:
  CudaEngine() = default;
  Result<GpuSequence*> find(engine::SeqId seq) const;
  Status validate(std::span<const engine::StepItem> items) const;
  // forward() with the executor's options: items split into rounds within the forward's limits.
  // item_argmax (rows kLast only): per item, the checked argmax of its last logits row
  // (GpuForwardOptions::argmax_checked: cuda::kArgmaxInvalidRow for a row the sampler refuses), -1
  // for an item without one; no logits rows cross to the host.
  Status forward_rounds(std::span<const engine::StepItem> items, model::LogitsRows rows,
                        const GpuForwardOptions& fo, std::vector<model::SequenceOutput>* out,
                        const LogitsSink& logits_to = {}, std::vector<int32_t>* item_argmax = nullptr);
  void release(GpuSequence& s);
  // speculative_step per group of items: the drafts (no state change; cap = the item's own verify
  // length after verify_len and the threshold), then, with the lengths chosen under the budget
  // (len[i] <= cap[i]), the verification, acceptance, rollback and context rows.
  struct SpecDrafts {
    std::vector<int64_t> cap, draft_of;  // per item; draft_of: index into d, -1 = no draft
    std::vector<model::DraftOutput> d;
    std::vector<std::vector<std::vector<double>>> draft_p;  // per draft: p_k (sampled items)
  };
  Status speculative_draft(std::span<const engine::SpecStepItem> items, SpecDrafts* dr);
  Status speculative_verify(std::span<const engine::SpecStepItem> items, const SpecDrafts& dr,
                            std::span<const int64_t> len, std::span<engine::SpecStepResult> out);
  // Host copies behind a StateView of `s` (export): per source the entries [first[j], first[j] +
  // rows[j]); with `bounded` also the rings and pending groups.
  struct HostRows {
    std::vector<uint8_t> rings;
    std::vector<std::vector<uint8_t>> kv, key;
    std::vector<std::vector<float>> pend_a, pend_b;
  };
  engine::StateView meta_view(const GpuSequence& s) const;
  Status view_rows(const GpuSequence& s, std::span<const int64_t> first, std::span<const int64_t> rows,
                   bool bounded, HostRows* h, engine::StateView* v) const;

  const DeviceModel* model_ = nullptr;
  engine::EngineInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t vision_stream_ = nullptr;  // the tower's (encode_images may run concurrently with step)
  std::mutex encode_mu_;                  // one encode_images at a time
  KvBlockPool pool_;
  SequenceSlots slots_;
  std::unique_ptr<GpuForward> fwd_;
  SpecProfile* spec_prof_ = nullptr;  // profile_speculative
  std::chrono::steady_clock::time_point spec_t_;
  // profile_speculative: drains the stream and adds the milliseconds since the last lap to *field.
  void spec_lap(double SpecProfile::*field);
  std::unique_ptr<GpuVisionTower> vision_;
  int64_t bounded_bytes_ = 0;
  std::unordered_map<engine::SeqId, std::unique_ptr<GpuSequence>> seqs_;
  engine::SeqId next_id_ = 1;
  bool spec_ = false;
  std::unordered_map<engine::SeqId, std::mt19937_64> spec_rng_;  // T > 0 speculative steps
};

}  // namespace ds41::gpu
