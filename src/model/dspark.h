// ds41 model: Dspark — the DSpark draft of DeepSeek-V4.1 (MODEL_SPEC 3.10) on the CPU reference,
// as a composition of ops over the Model's backend and explicit per-sequence state:
//   - context (3.10.2-3.10.3): the target's forward captures, per row, the 4-stream means entering
//     the dspark_target_layer_ids layers (ForwardOptions::dspark_features); commit_context()
//     projects and norms them (main_x) and writes every stage's Q_win window row for committed
//     positions into SequenceState::dspark;
//   - the draft forward for an anchor (3.10.4-3.10.6): the 5-position block through the stages
//     (both mHC sites, block attention over the stage's context window plus all block rows, the
//     128-expert top-3 MoE), the collapse with the last FFN pre, the shared head, then the Markov
//     term and the confidence head left to right, greedy or through a caller's chooser.
// Verification, acceptance and rollback live in spec_rollback.h (state) and the engine's
// speculative driver (rules). The model's threads belong to its backend; nothing here spawns any.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace ds41::model {

// The index of the largest z, the lowest index on ties (the draft's greedy choice, MODEL_SPEC 3.10.5).
inline int32_t argmax_lowest(std::span<const float> z) {
  int32_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(z.size()); ++i)
    if (z[i] > z[best]) best = static_cast<int32_t>(i);
  return best;
}

// Per-row results of the context path (golden names context.* / stage{s}.window_kv).
struct DsparkContextRows {
  std::vector<float> main_x;                  // [n, H]
  std::vector<std::vector<float>> window_kv;  // per stage [n, head_dim] (Q_win values)
  std::vector<std::vector<uint8_t>> packed;   // per stage [n, window_row_bytes]
};

// Chooses c_k from the Markov-corrected logits z_k (3.10.6); greedy when empty.
// seq: index of the anchor in the draft() batch; k: block position 0..B-1.
using DraftChooser = std::function<int32_t(int64_t seq, int64_t k, std::span<const float> z)>;

struct DraftInput {
  const SequenceState* state = nullptr;  // context rings for positions < L (state->dspark)
  int32_t anchor = 0;                    // x_L, the token the target produced for position L
  int64_t pos = 0;                       // L
};

struct DraftOptions {
  DraftChooser choose;       // empty: greedy argmax (lowest index on ties)
  bool keep_logits = false;  // keep z_k (rejection sampling needs p_k = softmax(z_k / T))
  bool record = false;       // keep base logits, hidden, block rows and routing (golden checks)
};

struct DraftOutput {
  std::vector<int32_t> candidates;       // [B] c_0 .. c_{B-1} for positions L+1 .. L+B
  std::vector<float> confidence_logits;  // [B] gamma_k (raw, as [R])
  std::vector<float> confidence;         // [B] sigmoid(gamma_k) (as vLLM)
  std::vector<float> z;                  // keep_logits: [B, V] U_k + Markov term
  // record:
  std::vector<float> base_logits;                    // [B, V] U_k
  std::vector<float> hidden;                         // [B, H] h_k (pre-norm)
  std::vector<std::vector<float>> block_kv;          // per stage [B, head_dim]
  std::vector<std::vector<int32_t>> router_experts;  // per stage [B, k]
};

class Dspark {
 public:
  // The model must have DSpark stages (Model::dspark_weights()).
  static Result<Dspark> create(const Model& m);

  int64_t block_size() const;
  int64_t n_stages() const;
  int64_t feature_width() const;  // n_targets * hidden

  // Gives st its draft rings (empty; next position = st.position()). Idempotent.
  void enable(SequenceState& st) const;

  // main_x and the stages' window rows of n rows of features at positions first_pos.. (3.10.2-3).
  DsparkContextRows context_rows(const float* features, int64_t n, int64_t first_pos) const;
  // Writes the window rows of positions first_pos .. first_pos + n - 1 into st.dspark, which must
  // continue exactly there (committed positions only, in order). Only the last `window` rows are
  // computed.
  Status commit_context(SequenceState& st, const float* features, int64_t n, int64_t first_pos) const;

  // One draft step per input (rows of all inputs batched through the stages).
  Status draft(std::span<const DraftInput> batch, const DraftOptions& opt,
               std::vector<DraftOutput>* out) const;

 private:
  explicit Dspark(const Model& m) : m_(&m) {}
  void stage_attention(int64_t s, std::span<const DraftInput> batch, const float* x, const int64_t* pos,
                       float* y, float* block_kv) const;  // dspark_attention.cpp
  const Model* m_;
};

}  // namespace ds41::model
