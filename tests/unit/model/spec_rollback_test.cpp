// MODEL_SPEC 3.10.8 (issue 17): after a journaled verification forward over [x_L, c_0..c_{l-1}]
// and a rollback that keeps a + 1 rows, the sequence state equals that of a plain decode of the
// kept tokens bit for bit — every window ring slot of every layer, the compressed and indexer
// rows and counts, the ratio-2 half-pair buffer, the Engram look-back, the position — and the
// kept rows' logits equal the plain decode's. Steps mix every l in 0..5 and every a in 0..l, at
// both parities of L (ratio-2 pairs completed inside the chunk, straddling its end, or split by
// the rollback). The 80-token prompt exceeds the tiny config's window (8), top-k (8), ratio-2
// pairing and candidate pool (6 x 2) before the first step.
#include "model/spec_rollback.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "golden/golden_arrays.h"
#include "support/state_compare.h"

namespace ds41::testing {
namespace {

TEST(SpecRollback, StateEqualsPlainDecodeAfterMixedSteps) {
  TestModel tm = load_golden_model(2);
  ASSERT_TRUE(tm.model);
  model::Model& m = *tm.model;
  const int64_t V = m.config().vocab_size;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(V) - 1);
  std::vector<int32_t> ids{0};
  while (ids.size() < 80) ids.push_back(tok(rng));
  auto plain = m.new_sequence();
  auto spec = m.new_sequence();
  model::ForwardOptions opt;
  opt.logits = model::LogitsRows::kLast;
  ASSERT_TRUE(m.prefill(*plain, ids, 0, opt).ok());
  ASSERT_TRUE(m.prefill(*spec, ids, 0, opt).ok());
  int64_t steps = 0, split_pairs = 0;
  std::vector<int64_t> seen_a(6, 0);
  while (plain->position() < 260) {
    const int64_t L = spec->position();
    const int64_t l = steps % 6;  // verify length 0..5
    const int64_t a = std::uniform_int_distribution<int64_t>(0, l)(rng);
    // The committed continuation: x_L then a accepted candidates; the rest are "wrong" tokens.
    std::vector<int32_t> vt{tok(rng)};
    for (int64_t i = 0; i < l; ++i) vt.push_back(tok(rng));
    model::SpecJournal j;
    model::SpecJournal* jp = &j;
    model::ForwardOptions fo;
    fo.logits = model::LogitsRows::kAll;
    fo.journals = std::span<model::SpecJournal* const>(&jp, 1);
    model::SequenceInput in{spec.get(), vt, {}};
    std::vector<model::SequenceOutput> out;
    ASSERT_TRUE(m.forward(std::span<const model::SequenceInput>(&in, 1), fo, &out).ok());
    ASSERT_TRUE(model::rollback_spec(*spec, j, a + 1, vt, m.hasher()).ok());
    // The plain decode of the kept tokens, row by row.
    std::vector<float> last;
    for (int64_t i = 0; i <= a; ++i) {
      auto o = m.decode_step(*plain, vt[i], opt);
      ASSERT_TRUE(o.ok()) << o.status().message();
      last = o->logits;
    }
    ASSERT_EQ(0, std::memcmp(last.data(), out[0].logits.data() + a * V, V * sizeof(float)))
        << "kept row logits differ at L " << L;
    expect_same_state(*plain, *spec,
                      "after step " + std::to_string(steps) + " (L " + std::to_string(L) + ", l " +
                          std::to_string(l) + ", a " + std::to_string(a) + ")");
    if (::testing::Test::HasFailure()) return;
    split_pairs += (L + a) % 2 == 0 && a < l;  // the rollback split a ratio-2 pair
    ++seen_a[a];
    ++steps;
  }
  EXPECT_GT(split_pairs, 5);
  for (int64_t a = 0; a <= 5; ++a) EXPECT_GT(seen_a[a], 0) << "a = " << a;
}

}  // namespace
}  // namespace ds41::testing
