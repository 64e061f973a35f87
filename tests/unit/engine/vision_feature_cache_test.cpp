// Issue 16: the vision-feature cache is a bounded LRU by bytes, counts hits and misses, and
// never keeps an entry larger than its capacity.
#include "engine/vision_feature_cache.h"

#include <gtest/gtest.h>

namespace ds41::engine {
namespace {

SpanEmbeds rows(size_t n, float v) { return std::make_shared<const std::vector<float>>(n, v); }

TEST(VisionFeatureCache, LruByBytesWithHitAndMissCounts) {
  VisionFeatureCache c(3 * 100 * sizeof(float));  // three 100-float entries
  EXPECT_EQ(c.find("a"), nullptr);
  c.insert("a", rows(100, 1));
  c.insert("b", rows(100, 2));
  c.insert("c", rows(100, 3));
  ASSERT_NE(c.find("a"), nullptr);  // a is now the most recent
  c.insert("d", rows(100, 4));      // evicts b, the least recent
  EXPECT_EQ(c.find("b"), nullptr);
  EXPECT_EQ((*c.find("a"))[0], 1.0f);
  EXPECT_NE(c.find("d"), nullptr);
  const VisionCacheStats s = c.stats();
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.bytes, static_cast<int64_t>(300 * sizeof(float)));
}

TEST(VisionFeatureCache, OversizedEntriesAreNotKeptAndReplaceWorks) {
  VisionFeatureCache c(100 * sizeof(float));
  c.insert("big", rows(101, 1));
  EXPECT_EQ(c.find("big"), nullptr);
  c.insert("x", rows(50, 1));
  c.insert("x", rows(60, 2));
  EXPECT_EQ(c.find("x")->size(), 60u);
  EXPECT_EQ(c.stats().bytes, static_cast<int64_t>(60 * sizeof(float)));
}

}  // namespace
}  // namespace ds41::engine
