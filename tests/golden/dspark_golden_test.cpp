// Golden acceptance of the DSpark draft on the CPU reference (issue 17; ../shared/golden/README.md
// "DSpark set"): the context path (features, main_x, every stage's window rows), the draft at the
// 8 anchors (hidden, base logits, candidates, confidences, block rows, routing), and the 32-step
// greedy speculative walk with the real target as verifier, within the README's tolerances. A
// second test checks the draft alone on the golden window rows (README step 2).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "engine/dspark_score.h"
#include "golden/dspark_golden_compare.h"
#include "golden/golden_arrays.h"
#include "model/dspark.h"
#include "quant/fake_quant.h"

namespace ds41::testing {
namespace {

class GoldenDspark : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tm_ = new TestModel(load_golden_model(2, dspark_golden_dir()));
    gold_ = new GoldenFile(dspark_golden_dir() + "/goldens.safetensors");
  }
  static void TearDownTestSuite() {
    delete tm_;
    delete gold_;
  }
  static TestModel* tm_;
  static GoldenFile* gold_;
};
TestModel* GoldenDspark::tm_ = nullptr;
GoldenFile* GoldenDspark::gold_ = nullptr;

TEST_F(GoldenDspark, ContextDraftAndWalk) {
  ASSERT_TRUE(tm_->model);
  engine::DsparkScoreInput in;
  in.input_ids = gold_->get<int32_t>("seq.input_ids").v;
  in.prompt_len = gold_->get<int32_t>("seq.prompt_len").v.at(0);
  for (int32_t L : gold_->get<int32_t>("draft.anchor_pos").v) in.anchors.push_back(L);
  in.walk_steps = gold_->get<int32_t>("walk.accepted").rows();
  auto arrays = engine::dspark_score(tm_->model.get(), in);
  ASSERT_TRUE(arrays.ok()) << arrays.status().message();
  int compared = 0;
  for (const engine::NamedArray& a : *arrays) {
    ASSERT_TRUE(gold_->has(a.name)) << a.name;
    expect_dspark_matches(*gold_, a);
    ++compared;
  }
  EXPECT_EQ(compared, 26);  // every golden array but seq.input_ids and seq.prompt_len
}

// README step 2: the draft alone, its context rings filled with the golden window rows.
TEST_F(GoldenDspark, DraftOnGoldenWindowRows) {
  ASSERT_TRUE(tm_->model);
  model::Model& m = *tm_->model;
  const model::ModelConfig& c = m.config();
  auto ds = model::Dspark::create(m);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  const int64_t hd = c.head_dim, W = c.sliding_window, B = c.dspark_block_size, V = c.vocab_size;
  std::vector<Array<float>> rows;
  for (int64_t s = 0; s < ds->n_stages(); ++s)
    rows.push_back(gold_->get<float>("stage" + std::to_string(s) + ".window_kv"));
  auto pos = gold_->get<int32_t>("draft.anchor_pos");
  auto tok = gold_->get<int32_t>("draft.anchor_token");
  auto cands = gold_->get<int32_t>("draft.candidates");
  auto base = gold_->get<float>("draft.base_logits");
  auto conf = gold_->get<float>("draft.confidence");
  for (int64_t a = 0; a < pos.rows(); ++a) {
    const int64_t L = pos.v[a];
    SCOPED_TRACE("anchor " + std::to_string(L));
    auto st = m.new_sequence();
    ds->enable(*st);
    for (int64_t t = std::max<int64_t>(0, L - W); t < L; ++t)
      for (int64_t s = 0; s < ds->n_stages(); ++s)
        ASSERT_TRUE(quant::q_win_pack_on_grid(&rows[s].v[t * hd], hd, st->dspark->row(s, t)).ok());
    st->dspark->set_next_position(L);
    model::DraftOptions opt;
    opt.record = true;
    model::DraftInput di{st.get(), tok.v[a], L};
    std::vector<model::DraftOutput> out;
    ASSERT_TRUE(ds->draft(std::span<const model::DraftInput>(&di, 1), opt, &out).ok());
    for (int64_t k = 0; k < B; ++k) {
      EXPECT_EQ(out[0].candidates[k], cands.v[a * B + k]) << "k " << k;
      EXPECT_LE(row_error(&base.v[(a * B + k) * V], &out[0].base_logits[k * V], V), kDsparkTolLogits);
      EXPECT_LE(std::fabs(out[0].confidence[k] - conf.v[a * B + k]), kDsparkTolConf);
    }
  }
}

}  // namespace
}  // namespace ds41::testing
