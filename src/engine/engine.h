// ds41 engine: Engine — the batch-of-sequences interface that the scheduler drives and that every
// backend implements (the CPU reference now, the GPU engine next; ARCHITECTURE.md "engine").
//
// One step() runs one forward over a batch that mixes prefill chunks and single decode tokens of
// many sequences: item i extends sequence items[i].seq by items[i].tokens (continuing at its
// position) and, when want_logits, returns the logits row of its last token. Sequences are created,
// forked (a copy of the whole state: the prefix-cache's share point) and freed through the engine;
// their state lives in the engine (host memory for the CPU engine, device pools for the GPU engine)
// and its size in bytes is queryable so the scheduler admits by capacity.
//
// State export / import (issue 13, the prefix cache): a sequence's global KV leaves and enters the
// engine as 128-token global-KV blocks and its bounded state as SWA snapshots, both in the byte
// layouts of docs/formats/kv_block.md ("Engine state payloads"), shared by every engine so a block
// written by one restores in another. These are virtual with an unimplemented() default: an engine
// that has not implemented them yet serves without a prefix cache.
//
// Thread model: an Engine is driven by one thread (the engine loop); it is not thread-safe, with one
// exception. encode_images may run on ONE other thread (the loop's ImageEncoder worker,
// engine/image_encoder.h) concurrently with any other call of the driving thread (step,
// speculative_step, the sequence calls, export / import, the replays); encode_images calls never
// overlap each other (the worker runs one at a time; the GPU engine also serializes them). So an
// implementation keeps its tower off everything those calls mutate: the CPU engine's tower reads the
// immutable weights and computes through the backend, whose weight cache is locked and whose
// ThreadPool takes concurrent callers; the GPU engine's tower has its own CUDA stream, cuBLAS handle
// and workspace and reads only the model's weights. Any other pair of calls from two threads is a
// data race. An engine that cannot meet this contract must be driven with
// LoopConfig::image_encoder_jobs = 0 (encode_images then runs on the loop thread).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "image/preprocess.h"

namespace ds41::engine {

using SeqId = int64_t;

struct EngineInfo {
  std::string model_name;     // served model name default (the model folder's name)
  std::string device;         // "cpu" or "cuda:N"
  int64_t vocab_size = 0;     // logits row width
  int64_t max_context = 0;    // positions a sequence may reach (config max_position_embeddings)
  int32_t eos_token_id = -1;  // ends generation unless ignore_eos (config eos_token_id); -1: none
  // Positions before the end of a prefix whose token ids replay_window() reads (the sliding
  // window + the Engram look-back); 0: unknown (a caller assumes the whole prefix). The prefix
  // cache never replays over an image span (token ids cannot rebuild its positions).
  int64_t replay_lookback = 0;
  // The engine has a vision tower: encode_images computes span rows (MODEL_SPEC 3.11).
  bool has_vision = false;
};

struct StepItem {
  SeqId seq = -1;
  std::span<const int32_t> tokens;  // >= 1 token; continues the sequence at its position
  bool want_logits = true;          // return the logits row of the last token
  // Optional image spans (MODEL_SPEC 3.11): one flag per token, and the rows replacing the
  // flagged tokens' embeddings (as model::SequenceInput).
  std::span<const uint8_t> image_span = {};
  std::span<const float> span_embeds = {};
  // The caller draws this item's token greedily from the raw logits row (temperature 0, nothing
  // applied to the row, no logprobs): the engine may return that token in StepOutput::token
  // instead of the row — engine::Sampler's greedy draw (argmax_token: the first of equal maxima;
  // a row holding NaN or +inf, or every logit -inf, is StepOutput::kInvalidRow). The GPU engine does
  // so when every logits item of the step asks it (the argmax on the device: 4 bytes per row cross
  // to the host instead of the 517 KB row, and no host scan of it); the CPU engine returns rows.
  bool greedy_only = false;
};

// Speculative decoding (MODEL_SPEC 3.10; engine/speculative.h): one draft + verification step of
// a sequence whose last sampled token `anchor` has not yet run through the target.
struct SpecStepItem {
  SeqId seq = -1;
  int32_t anchor = 0;
  int64_t verify_len = -1;           // candidates verified: -1 = the whole block, 0 = plain step
  double confidence_threshold = -1;  // >= 0: MODEL_SPEC 3.10.9 single-sequence scheduling
  double temperature = 0;            // 0: greedy; > 0: rejection sampling (temperature only)
  uint64_t seed = 0;                 // T > 0: seeds the sequence's speculative RNG on first use
};

struct SpecStepResult {
  std::vector<int32_t> tokens;  // committed after the anchor: accepted candidates, then the bonus
  int64_t verified = 0, accepted = 0;
  int64_t budget_cut = 0;  // candidates the batch budget took off this item's own cap
  // The draft: all B candidates and their confidences q_k (MODEL_SPEC 3.10.5), verified or not;
  // empty when no draft ran (a plain step).
  std::vector<int32_t> candidates;
  std::vector<float> confidence;
};

// Options of one speculative_step call (the whole batch).
struct SpecBatchOptions {
  // MODEL_SPEC 3.10.9 confidence scheduling under a batch token budget: at most this many
  // candidates are verified over all items of the call. The engine drafts every item first, then
  // admits the (item, j) pairs with the highest prefix survival s_j = prod_{i<=j} q_i within each
  // item's own cap (verify_len, confidence_threshold) — engine/speculative.h
  // budget_verify_lengths — and verifies [anchor, c_0 .. c_{l-1}] per item. Confidence never
  // changes which tokens are proposed, so greedy outputs do not depend on it. -1: no budget.
  int64_t verify_budget = -1;
};

struct StepOutput {
  static constexpr int32_t kInvalidRow = -2;
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<int64_t> row;   // per item: its row in logits, or -1 (want_logits false, or a token below)
  // Per item (or empty: none): the greedy token the engine drew for a StepItem::greedy_only item
  // (>= 0), kInvalidRow for a row the sampler refuses, -1 where the row (or nothing) was returned.
  std::vector<int32_t> token;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const EngineInfo& info() const = 0;

  virtual Result<SeqId> create_sequence() = 0;
  // A new sequence holding a copy of src's state (same position).
  virtual Result<SeqId> fork_sequence(SeqId src) = 0;
  virtual Status free_sequence(SeqId seq) = 0;
  virtual Result<int64_t> sequence_position(SeqId seq) const = 0;
  // Bytes the sequence's state holds now.
  virtual Result<int64_t> sequence_bytes(SeqId seq) const = 0;
  // Bytes a sequence of `tokens` tokens holds (admission by capacity; exact for the CPU engine:
  // bounded state + emitted compressed entries, as SequenceState allocates them).
  virtual int64_t bytes_for_tokens(int64_t tokens) const = 0;
  virtual int64_t live_sequences() const = 0;

  // One forward over the items (distinct sequences, each with >= 1 token). Errors (unknown
  // sequence, bad token id, context overflow, backend failure) leave every sequence unchanged.
  // `out` is overwritten (vocab, logits, row): a caller may keep one StepOutput across steps so its
  // logits buffer keeps its pages (EngineLoop does).
  virtual Status step(std::span<const StepItem> items, StepOutput* out) = 0;
  // Image span embeddings [span length, hidden] per image, one tower batch (MODEL_SPEC 3.11).
  // Engines without a vision tower refuse. May run concurrently with the other calls (thread model
  // above); the result does not depend on what runs meanwhile.
  virtual Result<std::vector<std::vector<float>>> encode_images(
      std::span<const image::PreparedImage* const> images) {
    return unimplemented("this engine has no vision tower");
  }

  // ---- State export / import (docs/formats/kv_block.md "Engine state payloads") ----
  // Every call names the block size in tokens (the prefix cache's, 128 by default); each KV
  // source's ratio must divide it.

  // The global-KV block `index` of the sequence: the compressed and indexer rows of every KV
  // source for tokens [index * block_tokens, (index + 1) * block_tokens). The sequence must have
  // consumed those tokens (kOutOfRange otherwise).
  virtual Result<std::vector<uint8_t>> export_kv_block(SeqId seq, int64_t index, int64_t block_tokens) const;
  // The SWA snapshot at the sequence's position L: everything a restore at L needs besides the
  // floor(L / block_tokens) full blocks (window rings, window floors, the partial last block's
  // rows, pending ratio>1 groups, the Engram look-back, the position). `approximate` is stored
  // in the snapshot's flags (the state went through a bounded replay, MODEL_SPEC 4.4 / 4.5).
  virtual Result<std::vector<uint8_t>> export_swa_snapshot(SeqId seq, int64_t block_tokens,
                                                           bool approximate) const;
  // Restores a fresh sequence (position 0) from blocks 0..n-1 and, when `snapshot` is not empty,
  // the SWA snapshot at L with n == floor(L / block_tokens): then the sequence continues exactly
  // as the one exported. Without a snapshot the sequence holds only the global KV at position
  // n * block_tokens and must be completed by replay_window() before it steps. Errors (layout
  // mismatch, wrong sizes, non-fresh sequence) leave the sequence fresh.
  virtual Status import_state(SeqId seq, std::span<const std::span<const uint8_t>> blocks,
                              std::span<const uint8_t> snapshot, int64_t block_tokens);
  // MODEL_SPEC 4.5 Encoder SWA Bounded Replay (an approximation): the sequence holds the global
  // KV of `prefix_tokens` (import_state without a snapshot); recomputes the last window of them
  // to rebuild the window rings, pending groups and Engram look-back.
  virtual Status replay_window(SeqId seq, std::span<const int32_t> prefix_tokens);
  // MODEL_SPEC 4.4 Decoder SWA Bounded Replay (an approximation): prefill of a fresh sequence
  // where the layers after the last KV source run only on the last window of `tokens`. No
  // logits (the caller steps the next token normally).
  virtual Status prefill_decoder_replay(SeqId seq, std::span<const int32_t> tokens);
  // Speculative decoding: turns it on (before any sequence exists: every forward then captures
  // the draft context); FailedPrecondition when the engine or the checkpoint has none.
  virtual Status enable_speculative() {
    return failed_precondition("this engine has no speculative decoding");
  }
  // The draft block size (0 = not available: no draft stages, or off).
  virtual int64_t speculative_block() const { return 0; }
  // One speculative step per item (distinct sequences), the verify lengths chosen under
  // batch.verify_budget. Afterwards each sequence's position is its anchor's + accepted + 1, and
  // the last result token is its next anchor.
  virtual Status speculative_step(std::span<const SpecStepItem> items, const SpecBatchOptions& batch,
                                  std::vector<SpecStepResult>* out) {
    return failed_precondition("this engine has no speculative decoding");
  }
};

// Flags of an SWA snapshot payload (docs/formats/kv_block.md).
inline constexpr uint32_t kSwaFlagApproximate = 1;

}  // namespace ds41::engine
