// Test support: bit-for-bit comparison of two sequence states (MODEL_SPEC 4.1 packed rows): every
// window ring slot of every layer and its floor, the compressed / indexer rows and counts, the
// ratio>1 pending groups (incl. stale slots), the Engram look-back, the position and the most
// recent publisher; and the DSpark draft rings when both have them.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "model/sequence_state.h"

namespace ds41::testing {

inline void expect_same_state(model::SequenceState& a, model::SequenceState& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.position(), b.position());
  EXPECT_EQ(a.last_published_source, b.last_published_source);
  const model::KvLayout& lay = a.layout();
  for (int64_t l = 0; l < lay.n_layers; ++l) {
    EXPECT_EQ(a.window_floor(l), b.window_floor(l));
    for (int64_t slot = 0; slot < lay.window; ++slot)
      EXPECT_EQ(0, std::memcmp(a.window_row(l, slot), b.window_row(l, slot), lay.window_row_bytes))
          << "layer " << l << " ring slot " << slot;
  }
  ASSERT_EQ(a.sources().size(), b.sources().size());
  for (size_t i = 0; i < a.sources().size(); ++i) {
    const model::KvSourceState& x = a.sources()[i];
    const model::KvSourceState& y = b.sources()[i];
    SCOPED_TRACE("KV source layer " + std::to_string(x.layout.layer));
    EXPECT_EQ(x.count, y.count);
    EXPECT_EQ(x.kv_rows, y.kv_rows);
    EXPECT_EQ(x.key_rows, y.key_rows);
    EXPECT_EQ(x.pend_filled, y.pend_filled);
    EXPECT_EQ(0, std::memcmp(x.pend_a.data(), y.pend_a.data(), x.pend_a.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(x.pend_b.data(), y.pend_b.data(), x.pend_b.size() * sizeof(float)));
  }
  EXPECT_EQ(a.engram_state().length, b.engram_state().length);
  EXPECT_EQ(a.engram_state().recent, b.engram_state().recent);
  if (a.dspark && b.dspark) {
    ASSERT_EQ(a.dspark->next_position(), b.dspark->next_position());
    const int64_t lo = std::max<int64_t>(0, a.dspark->next_position() - a.dspark->window());
    for (int64_t s = 0; s < a.dspark->n_stages(); ++s)
      for (int64_t p = lo; p < a.dspark->next_position(); ++p)
        EXPECT_EQ(0, std::memcmp(a.dspark->row(s, p), b.dspark->row(s, p), a.dspark->row_bytes()))
            << "draft stage " << s << " position " << p;
  }
}

}  // namespace ds41::testing
