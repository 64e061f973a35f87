// The MODEL_SPEC 3.11 plan's branches at the released config (max 1024 tokens, min 544^2
// pixels) and the golden README's double-order case: every plan fits the budget, boxes are whole
// patches, fits keep one side exact.
#include "image/resize_plan.h"

#include <gtest/gtest.h>

namespace ds41::image {
namespace {

TEST(ResizePlan, ReleasedConfigBranches) {
  VisionPlanConfig c;                   // released values
  auto small = plan_image(100, 50, c);  // min-pixel upscale
  ASSERT_TRUE(small.ok());
  EXPECT_GE(small->up_w * small->up_h, 295936 - small->up_w - small->up_h);
  auto tall = plan_image(10, 100000, c);  // w* < 1: one column
  ASSERT_TRUE(tall.ok());
  EXPECT_EQ(tall->box_w, 42);
  EXPECT_EQ(tall->box_h, (1024 - 2) / 2 * 42);
  auto big = plan_image(4000, 3000, c);
  ASSERT_TRUE(big.ok());
  EXPECT_LE(big->n_tokens, 1024);
  for (int64_t w : {1, 7, 14, 15, 543, 544, 1000, 1920, 3840, 9999})
    for (int64_t h : {1, 3, 14, 29, 544, 1080, 2160, 7777}) {
      auto p = plan_image(w, h, c);
      if (!p.ok()) {
        EXPECT_NE(p.status().message().find("too elongated"), std::string::npos) << w << "x" << h;
        continue;
      }
      EXPECT_LE(p->n_tokens, 1024) << w << "x" << h;
      EXPECT_EQ(p->box_h % 14, 0);
      EXPECT_EQ(p->box_w % 14, 0);
      EXPECT_TRUE(p->fit_h == p->box_h || p->fit_w == p->box_w) << w << "x" << h;
      EXPECT_LE(p->fit_h, p->box_h);
      EXPECT_LE(p->fit_w, p->box_w);
    }
}

TEST(ResizePlan, DoubleOrderMattersAsInTheGoldenReadme) {
  // Golden image 5 (330x190 at max 32 tokens, min 84^2): 190*beta/14 = 8.999999999999998 -> box 112.
  VisionPlanConfig c;
  c.max_image_tokens = 32;
  c.min_pixels = 7056;
  auto p = plan_image(330, 190, c);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->box_h, 112);
  EXPECT_EQ(p->box_w, 210);
}

TEST(ResizePlan, RoundIsHalfToEven) {
  EXPECT_EQ(round_half_even(0.5), 0);
  EXPECT_EQ(round_half_even(1.5), 2);
  EXPECT_EQ(round_half_even(2.5), 2);
  EXPECT_EQ(round_half_even(-0.5), 0);
}

TEST(ResizePlan, InvalidInputsAreErrors) {
  EXPECT_FALSE(plan_image(0, 10, {}).ok());
  VisionPlanConfig bad;
  bad.max_image_tokens = 3;
  EXPECT_FALSE(plan_image(10, 10, bad).ok());
}

}  // namespace
}  // namespace ds41::image
