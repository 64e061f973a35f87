// ds41 engine: DsparkDecoder — the speculative decoding driver for one sequence on the CPU
// reference (MODEL_SPEC 3.10.7-3.10.8): every target forward captures the DSpark context
// features; a step drafts B candidates at the anchor, verifies the first l of them in one
// target forward over [x_L, c_0 .. c_{l-1}] (a journaled chunk), accepts greedily or by
// speculative rejection sampling, rolls back every state change made for rejected positions
// (spec_rollback.h) and writes the draft context rows of the committed positions L..L+a only.
// The committed tokens are those a plain decode would give (greedy: token for token; sampled:
// in distribution). Not thread-safe; the model must outlive the decoder.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/speculative.h"
#include "model/dspark.h"
#include "model/model.h"

namespace ds41::engine {

struct SpecStepOptions {
  // Candidates to verify: -1 = all B; else 0..B (0: a plain decode step, no draft).
  int64_t verify_len = -1;
  // MODEL_SPEC 3.10.9 single-sequence scheduling: when >= 0, l = verify_length(q, theta) (capped
  // by verify_len when that is set too). Cannot change greedy outputs, only how many are verified.
  double confidence_threshold = -1.0;
  // 0: greedy. > 0: draft c_k ~ softmax(z_k / T), rejection sampling against softmax(T_j / T).
  double temperature = 0.0;
  std::mt19937_64* rng = nullptr;  // required when temperature > 0
  bool keep_draft = false;         // SpecStep::draft keeps the whole DraftOutput
};

// The draft half of a step (3.10.4-3.10.6): reads the state, changes nothing but the rng draws
// of a sampled draft. verify_len is the step's own cap (SpecStepOptions verify_len, then the
// confidence threshold); a batch budget may lower it before verify().
struct SpecDraft {
  int64_t anchor_pos = 0;
  int32_t anchor = 0;
  std::vector<int32_t> candidates;               // all B proposed (empty when no draft ran)
  std::vector<float> confidence;                 // q_k of the B candidates
  std::vector<std::vector<double>> draft_probs;  // temperature > 0: p_k per candidate
  int64_t verify_len = 0;
  model::DraftOutput draft;  // keep_draft
};

struct SpecStep {
  int64_t anchor_pos = 0;
  int32_t anchor = 0;
  std::vector<int32_t> candidates;  // all B proposed (empty when no draft ran)
  std::vector<float> confidence;    // q_k of the B candidates
  int64_t verified = 0;             // l
  int64_t accepted = 0;             // a
  std::vector<int32_t> tokens;      // committed c_0..c_{a-1}, then the bonus (the next anchor)
  model::DraftOutput draft;         // keep_draft
};

class DsparkDecoder {
 public:
  static Result<DsparkDecoder> create(model::Model* m);

  const model::Dspark& dspark() const { return dspark_; }

  // Prefill with feature capture (chunk as Model::prefill; 0 = one shot), enabling st's draft
  // state and committing the context rows of every prompt position. Returns the last row's logits.
  Result<std::vector<float>> prefill(model::SequenceState& st, std::span<const int32_t> tokens,
                                     int64_t chunk = 0);
  // One speculative step with anchor x_L at L = st.position(). Afterwards st.position() = L + a + 1
  // and the last committed token (the bonus) is the next anchor, not yet run through the target.
  Result<SpecStep> step(model::SequenceState& st, int32_t anchor, const SpecStepOptions& opt);
  // step() in two halves, for batch scheduling (CpuEngine::speculative_step drafts every item,
  // chooses the lengths under the budget, then verifies): draft() changes no state; verify()
  // verifies the first l <= d.verify_len candidates of d with the same options (rng included).
  Result<SpecDraft> draft(model::SequenceState& st, int32_t anchor, const SpecStepOptions& opt);
  Result<SpecStep> verify(model::SequenceState& st, SpecDraft d, int64_t l, const SpecStepOptions& opt);

 private:
  DsparkDecoder(model::Model* m, model::Dspark d) : m_(m), dspark_(d) {}
  model::Model* m_;
  model::Dspark dspark_;
};

}  // namespace ds41::engine
