// Tests for src/core: Status/Result, dtype tables, bf16 rounding, fake clock (thread pool: thread_pool_test.cpp).
#include <gtest/gtest.h>

#include <atomic>

#include "core/clock.h"
#include "core/dtype.h"
#include "core/status.h"

namespace ds41 {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("x must be positive, got " + std::to_string(x));
  return x * 2;
}

Status chain(int x) {
  DS41_ASSIGN_OR_RETURN(int y, parse_positive(x));
  if (y > 100) return out_of_range("too big");
  return ok_status();
}

TEST(Status, ResultCarriesValueOrError) {
  auto r = parse_positive(4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 8);
  auto e = parse_positive(-1);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("-1"), std::string::npos);
  EXPECT_TRUE(chain(3).ok());
  EXPECT_EQ(chain(-3).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(chain(60).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(chain(60).with_context("f.json").message(), "f.json: too big");
}

TEST(DType, NamesRoundTrip) {
  for (auto n : {"F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", "I32", "U8", "I64"}) {
    auto t = dtype_from_name(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_STREQ(dtype_name(*t), n);
  }
  EXPECT_FALSE(dtype_from_name("F8_E5M2X").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

TEST(FakeClock, AdvancesOnlyWhenTold) {
  FakeClock c(1000);
  EXPECT_EQ(c.now_unix_ns(), 1000);
  c.advance_s(2.5);
  EXPECT_EQ(c.now_unix_ns(), 1000 + 2'500'000'000LL);
}

}  // namespace
}  // namespace ds41
