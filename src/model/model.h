// ds41 model: Model — the V4.1 text model (MODEL_SPEC 3) as a composition of ops over a
// Backend, with explicit per-sequence state (SequenceState) and the entry points of
// MODEL_SPEC 4: exact prefill (one shot or chunked at any boundary), decode steps, a batch of
// independent sequences per call, and the two bounded-replay approximations as explicit opt-ins.
//
// Everything is derived from config.json and the layer schedule; nothing here knows layer
// numbers. Threads belong to the backend; this code never spawns any.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engram/hasher.h"
#include "model/config.h"
#include "model/dspark_weights.h"
#include "model/kv_layout.h"
#include "model/layer_schedule.h"
#include "model/loader/safetensors.h"
#include "model/model_weights.h"
#include "model/sequence_state.h"
#include "model/vision_tower.h"
#include "model/vision_weights.h"
#include "ops/backend.h"

namespace ds41::model {

struct LoadOptions {
  // Folder with tokenizer.json; required when the config has Engram layers (the compressed
  // vocabulary of MODEL_SPEC 3.2.1 comes from it). Empty: <model dir> is tried.
  std::string tokenizer_dir;
  // Optional load progress: called on the loading thread with the weight bytes prepared so far
  // and the total (quantized payload + scales), after each weight and once at the end
  // (done == total). Used by the CLI's progress line.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

enum class LogitsRows { kNone, kLast, kAll };

// Receives named intermediates: name "layer{l}.{what}" or "final_hidden", shape with the batch
// rows first (rows of all sequences of the call, in input order), float32 data.
using DumpFn =
    std::function<void(const std::string& name, const std::vector<int64_t>& shape, const float* data)>;

struct SpecJournal;  // spec_rollback.h

struct ForwardOptions {
  LogitsRows logits = LogitsRows::kLast;
  bool record = false;           // fill SequenceOutput::record (selections, routing, hash ids)
  const DumpFn* dump = nullptr;  // optional, called synchronously
  // MODEL_SPEC 7.21 / Q2: on single-token steps where a ratio>1 group is incomplete, score the
  // index sources with ratio > 1 against the most recently published key cache (the official
  // reference's behaviour) instead of the owner's keys. Default: owner's keys (HF, vLLM).
  bool stale_index_keys = false;
  // MODEL_SPEC 3.10.2: capture the DSpark context features of every row (the stream means
  // entering the dspark_target_layer_ids layers) into SequenceOutput::dspark_features.
  bool dspark_features = false;
  // MODEL_SPEC 3.10.8: journal what the call overwrites so that a verification forward can be
  // rolled back to any prefix of its rows (one per input sequence; see spec_rollback.h).
  std::span<SpecJournal* const> journals = {};
};

struct SequenceInput {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;
  // Optional, one flag per token: inside an image span (router bias_vl; Engram DEAD).
  std::span<const uint8_t> image_span = {};
  // Optional: [flagged positions, hidden] rows that replace the token embeddings of the positions
  // flagged in image_span, in order (model/vision_span.h builds them). Empty: the flagged
  // positions keep their token embeddings.
  std::span<const float> span_embeds = {};
};

// Selections of one call for one sequence; rows = the call's tokens.
struct ForwardRecord {
  std::vector<int32_t> hash_ids;                 // [rows, engram layers, cols]
  std::map<int64_t, std::vector<int32_t>> topk;  // index source -> [rows, index_topk], ascending, -1 pad
  std::map<int64_t, std::vector<int32_t>> cand_blocks;  // candidate source -> [rows, candidate_topk_blocks]
  std::map<int64_t, std::vector<int32_t>> router_experts;  // layer -> [rows, experts per token]
  std::map<int64_t, std::vector<float>> router_weights;    // layer -> [rows, experts per token]
};

struct SequenceOutput {
  std::vector<int64_t> positions;  // absolute position of each logits row
  std::vector<float> logits;       // [positions.size(), vocab]
  ForwardRecord record;
  // ForwardOptions::dspark_features: [rows, n_targets * hidden] for the call's rows, positions
  // dspark_first_pos.. (every row, whatever `logits` asks for).
  std::vector<float> dspark_features;
  int64_t dspark_first_pos = -1;
  void append(SequenceOutput&& o);
};

// Inputs of the teacher-forced single-layer check (golden README "How to check an engine").
struct TeacherForcedInput {
  std::span<const int32_t> tokens;  // the whole sequence, positions 0..S-1
  const float* streams = nullptr;   // [S, C, H] entering the layer (before its Engram)
  const float* pi = nullptr;        // [S, C] collapse weights entering the layer
  // Owner state (only what the layer reads from other layers): compressed entries and keys of
  // its KV owner [T, head_dim] / [T, index_head_dim], the owner's selection [S, index_topk], the
  // candidate mask [S, T_cand] of the candidate source.
  const float* owner_kv = nullptr;
  const float* owner_keys = nullptr;
  int64_t owner_entries = 0;
  const int32_t* owner_topk = nullptr;
  int64_t owner_topk_width = 0;
  const uint8_t* cand_mask = nullptr;
  int64_t cand_width = 0;
};

struct TeacherForcedOutput {
  std::vector<float> streams;  // [S, C, H] leaving the layer
  std::vector<float> pre;      // [S, C] the FFN site's pre (next layer's pi)
  ForwardRecord record;
};

class Model {
 public:
  // Opens DIR (config.json + checkpoint), derives the schedule, binds and validates weights.
  static Result<std::unique_ptr<Model>> load(const std::string& dir, const LoadOptions& opt,
                                             ops::Backend* backend);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const LayerSchedule& schedule() const { return sched_; }
  const KvLayout& kv_layout() const { return layout_; }
  const ModelWeights& weights() const { return *weights_; }
  ops::Backend& backend() const { return *backend_; }
  const engram::EngramHasher* hasher() const { return hasher_.get(); }
  // The vision tower and its weights (MODEL_SPEC 3.11); null without vision_config.
  const VisionWeights* vision_weights() const { return vision_weights_.get(); }
  const VisionTower* vision_tower() const { return vision_tower_.get(); }
  // The DSpark draft stages (MODEL_SPEC 3.10.1), or nullptr when the checkpoint has none.
  const DsparkWeights* dspark_weights() const { return dspark_weights_.get(); }
  const std::vector<float>& rope_inv_freq(bool yarn) const { return yarn ? inv_freq_yarn_ : inv_freq_main_; }

  std::unique_ptr<SequenceState> new_sequence() const;

  // One exact forward over a batch of independent sequences; each input's tokens continue its
  // state at state->position(). out gets one SequenceOutput per input.
  Status forward(std::span<const SequenceInput> batch, const ForwardOptions& opt,
                 std::vector<SequenceOutput>* out);

  // Exact prefill of one sequence in chunks of `chunk` tokens (0 = one shot); outputs of all
  // chunks concatenated.
  Result<SequenceOutput> prefill(SequenceState& st, std::span<const int32_t> tokens, int64_t chunk,
                                 const ForwardOptions& opt);
  // One decode step (single token at st.position()).
  Result<SequenceOutput> decode_step(SequenceState& st, int32_t token, const ForwardOptions& opt);

  // MODEL_SPEC 4.4 (approximation, opt-in): prefill of a fresh sequence where layers after the
  // last KV source run only on the last `sliding_window` prompt rows, their windows floored at
  // the first kept position. The last KV source itself runs on every row (vLLM / fastllm's cut,
  // Q4). Logits exist only for the kept rows. Refused when an Engram layer lies after the cut.
  Result<SequenceOutput> prefill_decoder_replay(SequenceState& st, std::span<const int32_t> tokens,
                                                const ForwardOptions& opt);
  // MODEL_SPEC 4.5 (approximation, opt-in): st holds a cached prefix of H = prefix_tokens.size()
  // tokens whose window rings were not persisted. Recomputes positions [H - W, H) through every
  // layer with window attention floored at H - W, rebuilding the rings and the pending ratio>1
  // group, without rewriting any compressed or indexer row the state already holds.
  Result<SequenceOutput> encoder_replay(SequenceState& st, std::span<const int32_t> prefix_tokens,
                                        const ForwardOptions& opt);

  // Runs layer `layer` alone on golden inputs (see TeacherForcedInput).
  Result<TeacherForcedOutput> run_layer_teacher_forced(int64_t layer, const TeacherForcedInput& in);

 private:
  friend class ForwardPass;
  Model() = default;
  ModelConfig cfg_;
  LayerSchedule sched_;
  KvLayout layout_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<engram::EngramHasher> hasher_;
  std::unique_ptr<VisionWeights> vision_weights_;
  std::unique_ptr<VisionTower> vision_tower_;
  std::unique_ptr<DsparkWeights> dspark_weights_;
  ops::Backend* backend_ = nullptr;
  std::vector<float> inv_freq_main_, inv_freq_yarn_;
};

// RoPE inverse frequencies (MODEL_SPEC 3.8): base^(-2i/rope_dim), and with YaRN for compressed
// layers; computed in float64, rounded to float32.
std::vector<float> rope_inv_freq_main(const ModelConfig& c);
std::vector<float> rope_inv_freq_yarn(const ModelConfig& c);

}  // namespace ds41::model
