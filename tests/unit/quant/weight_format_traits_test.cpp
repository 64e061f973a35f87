// The weight-format traits table (quant/weight_format.h): rows in enum order with distinct names,
// payload and scale sizes per MODEL_SPEC 2.1 (ragged FP8 tiles round up, FP4 packs two values
// per byte), and each row's dequantizer reading the layout those sizes describe.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/weight_format.h"
#include "quant/weight_formats.h"

namespace ds41::quant {
namespace {

TEST(WeightFormatTraits, RowsAreInEnumOrderWithDistinctNames) {
  std::set<std::string> names;
  for (int i = 0; i < kWeightFormatCount; ++i) {
    EXPECT_EQ(static_cast<int>(kWeightFormatTraits[i].format), i);
    names.insert(kWeightFormatTraits[i].name);
    EXPECT_EQ(kWeightFormatTraits[i].dequant_rows == nullptr,
              kWeightFormatTraits[i].format == WeightFormat::kNone);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kWeightFormatCount));
  EXPECT_STREQ(weight_format_name(WeightFormat::kFp8Tiles), "fp8-tiles-32");
}

TEST(WeightFormatTraits, SizesFollowTheCheckpointLayout) {
  // [70, 100]: FP8 tiles ceil(70/32) x ceil(100/32) = 3 x 4.
  EXPECT_EQ(weight_payload_bytes(WeightFormat::kFp8Tiles, 70, 100), 7000);
  EXPECT_EQ(weight_scale_bytes(WeightFormat::kFp8Tiles, 70, 100), 12);
  // FP4 experts [3072, 4096]: packed two per byte, one scale per row per 32 inputs.
  EXPECT_EQ(weight_payload_bytes(WeightFormat::kFp4Rows, 3072, 4096), 3072 * 2048);
  EXPECT_EQ(weight_scale_bytes(WeightFormat::kFp4Rows, 3072, 4096), 3072 * 128);
  EXPECT_EQ(weight_payload_bytes(WeightFormat::kBF16, 3, 5), 30);
  EXPECT_EQ(weight_scale_bytes(WeightFormat::kBF16, 3, 5), 0);
  EXPECT_EQ(weight_payload_bytes(WeightFormat::kF32, 3, 5), 60);
  EXPECT_EQ(weight_payload_bytes(WeightFormat::kEngramRows, 10, 64), 640);
  EXPECT_EQ(weight_scale_bytes(WeightFormat::kEngramRows, 10, 64), 20);
  EXPECT_EQ(
      weight_payload_bytes(WeightFormat::kNone, 10, 64) + weight_scale_bytes(WeightFormat::kNone, 10, 64), 0);
}

TEST(WeightFormatTraits, DequantizersReadRowRanges) {
  // Each format's dequantizer over rows [1, 3) equals rows 1..2 of the full dequantization, and
  // unscaled formats decode their values exactly.
  const int64_t out = 4, in = 64;
  for (const WeightFormatTraits& t : kWeightFormatTraits) {
    if (!t.dequant_rows) continue;
    SCOPED_TRACE(t.name);
    std::vector<uint8_t> data(weight_payload_bytes(t.format, out, in)),
        scale(weight_scale_bytes(t.format, out, in), 127);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 37) % 0x7e);
    if (t.format == WeightFormat::kF32)
      for (int64_t i = 0; i < out * in; ++i) {
        float v = 0.25f * static_cast<float>(i);
        std::memcpy(&data[4 * i], &v, 4);
      }
    std::vector<float> full(out * in), part(2 * in);
    t.dequant_rows(data.data(), scale.data(), out, in, 0, out, full.data());
    t.dequant_rows(data.data(), scale.data(), out, in, 1, 3, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), &full[in], part.size() * sizeof(float)));
    if (t.format == WeightFormat::kF32) {
      EXPECT_EQ(full[5], 1.25f);
    }
    if (t.format == WeightFormat::kBF16) {
      uint16_t b;
      std::memcpy(&b, &data[2 * 7], 2);
      EXPECT_EQ(full[7], bf16_to_f32(b));
    }
  }
}

}  // namespace
}  // namespace ds41::quant
