// ds41 model (internal): ForwardPass — one call of the forward pass over the rows of a batch of
// sequences. Owns the per-call activations (streams, collapse weights, hash ids) and what index
// sources publish to later layers within the call (selections, candidate masks); reads and
// appends the sequences' SequenceState. Split by concept over forward_pass.cpp (rows, layer
// schedule, mHC, head), attention_layer.cpp (MODEL_SPEC 3.4), moe_layer.cpp (3.5) and
// engram_layer.cpp (3.2.4).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace ds41::model {

// MODEL_SPEC 3.5 over n rows with E routed experts, top k (text layers and DSpark stages): y [n, H];
// experts / weights [n, k] in order of descending biased score. vl: per-row image-span flags
// (router bias_vl) or nullptr.
void moe_forward(ops::Backend& be, const ModelConfig& c, const LayerWeights& w, int64_t n_experts,
                 int64_t top_k, const float* x, int64_t n, const uint8_t* vl, float* y, int32_t* experts,
                 float* weights);

class ForwardPass {
 public:
  ForwardPass(const Model& m, const ForwardOptions& opt);

  // Validates the inputs (token ids, state capacity) and builds rows, embeddings and Engram
  // hash ids. Advances nothing on error.
  Status setup(std::span<const SequenceInput> batch);
  // Teacher-forced setup: one fresh sequence, streams / pi given.
  Status setup_teacher_forced(SequenceState* st, std::span<const int32_t> tokens, const float* streams,
                              const float* pi);
  void run_layer(int64_t l);
  // Keeps only the last `keep` rows of every sequence (decoder replay, MODEL_SPEC 4.4) and floors
  // the window of layers > after_layer at the first kept position.
  void keep_tail_rows(int64_t keep, int64_t after_layer);
  // Final collapse, norm and head; fills out and advances every state's position.
  void finish(std::vector<SequenceOutput>* out);

  // What index sources publish within the call.
  struct Published {
    int64_t width = 0;
    std::vector<int32_t> sel;                // [n, width]
    std::vector<std::vector<uint8_t>> cand;  // per sequence [rows_s, cand_t[s]] (candidate source)
    std::vector<int64_t> cand_t;
  };
  std::map<int64_t, Published>& published() { return pub_; }
  const std::vector<float>& streams() const { return streams_; }
  const std::vector<float>& pi() const { return pi_; }
  std::vector<ForwardRecord>& records() { return records_; }
  int64_t rows() const { return n_; }

 private:
  struct SeqRows {
    SequenceState* st = nullptr;
    int64_t begin = 0, end = 0;      // rows of the batch
    int64_t start_pos = 0;           // position of row `begin`
    SpecJournal* journal = nullptr;  // ForwardOptions::journals (MODEL_SPEC 3.10.8)
  };

  void engram_stage(int64_t l);
  void attention(int64_t l, const float* x, float* y);
  void compress(int64_t l, const float* x);
  void index(int64_t l, const float* x, const float* q_r);
  void moe(int64_t l, const float* x, float* y);
  void dump(const std::string& name, std::vector<int64_t> shape, const float* data) const;
  void capture_dspark_features(int64_t l);  // dspark_context.cpp (MODEL_SPEC 3.10.2)

  const Model& m_;
  const ModelConfig& c_;
  ops::Backend& be_;
  ForwardOptions opt_;
  int64_t n_ = 0;
  std::vector<int64_t> pos_;
  std::vector<SeqRows> seqs_;
  std::vector<float> streams_, pi_;  // [n, C, H], [n, C]
  std::vector<int32_t> hash_ids_;    // [n, engram layers, cols]
  std::vector<uint8_t> vl_, dead_;   // [n]
  bool any_vl_ = false, any_dead_ = false;
  std::map<int64_t, Published> pub_;
  std::vector<ForwardRecord> records_;  // per sequence
  std::vector<float> dspark_feat_;      // [n, n_targets * H] (ForwardOptions::dspark_features)
};

}  // namespace ds41::model
