// Golden: decoding, the resize plan and the Pillow-exact bicubic + pad of the six public images
// (plans and resized_u8 exactly equal; pixel_values of image 0 bit for bit).
#include <gtest/gtest.h>

#include "golden_vision/vision_golden_support.h"
#include "image/image_decode.h"
#include "image/preprocess.h"

namespace ds41::testing {
namespace {

TEST(VisionPreprocessGolden, PlansAndResizedImagesAreExact) {
  GoldenFile g(vision_dir() + "/goldens.safetensors");
  for (int k = 0; k < kVisionImages; ++k) {
    SCOPED_TRACE("image" + std::to_string(k));
    auto d = image::decode_image_file(vision_image_path(k));
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->format, image::ImageFormat::kPng);
    auto p = image::prepare_image(d->rgb, vision_plan_config());
    ASSERT_TRUE(p.ok()) << p.status().message();
    const image::ImagePlan& pl = p->plan;
    const std::vector<int32_t> mine = {int32_t(pl.orig_w),   int32_t(pl.orig_h),  int32_t(pl.up_w),
                                       int32_t(pl.up_h),     int32_t(pl.box_h),   int32_t(pl.box_w),
                                       int32_t(pl.fit_h),    int32_t(pl.fit_w),   int32_t(pl.pad_top),
                                       int32_t(pl.pad_left), int32_t(pl.n_llm_h), int32_t(pl.n_llm_w),
                                       int32_t(pl.n_tokens)};
    const std::string pre = "image" + std::to_string(k) + ".";
    EXPECT_EQ(mine, g.get<int32_t>(pre + "plan").v);
    const std::vector<int32_t> grid = {1, int32_t(pl.box_h / 14), int32_t(pl.box_w / 14)};
    EXPECT_EQ(grid, g.get<int32_t>(pre + "grid_thw").v);
    auto u8 = g.get<uint8_t>(pre + "resized_u8");
    ASSERT_EQ(u8.shape, (std::vector<int64_t>{pl.box_h, pl.box_w, 3}));
    int64_t differ = 0, max_diff = 0;
    for (size_t i = 0; i < u8.v.size(); ++i) {
      const int64_t dlt = std::abs(int64_t(u8.v[i]) - int64_t(p->resized.rgb[i]));
      differ += dlt != 0;
      max_diff = std::max(max_diff, dlt);
    }
    EXPECT_EQ(differ, 0) << "max level difference " << max_diff;
    if (k == 0) {
      auto pv = g.get<float>("image0.pixel_values");
      const std::vector<float> patches = image::image_patches(p->resized, 14);
      ASSERT_EQ(patches.size(), pv.v.size());
      EXPECT_EQ(0, std::memcmp(patches.data(), pv.v.data(), patches.size() * sizeof(float)));
    }
  }
}

}  // namespace
}  // namespace ds41::testing
