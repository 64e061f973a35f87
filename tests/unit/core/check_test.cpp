// DS41_CHECK and DS41_CHECK_<OP>: a failed check aborts and prints file:line, the condition, the
// values involved and the optional (printf-style) message; a passing check evaluates its operands
// exactly once and prints nothing.
#include "core/check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace ds41 {
namespace {

enum class Color : uint8_t { kRed = 3 };

TEST(CheckDeathTest, PlainCheckPrintsConditionAndLine) {
  EXPECT_DEATH(DS41_CHECK(1 + 1 == 3), "CHECK failed at .*check_test.cpp:[0-9]+: 1 \\+ 1 == 3");
  EXPECT_DEATH(DS41_CHECK(false, "a literal message"), "CHECK failed.*\n  a literal message");
}

TEST(CheckDeathTest, FormattedMessagePrintsTheArguments) {
  const int64_t id = 4096, rows = 2048;
  EXPECT_DEATH(DS41_CHECK(id < rows, "row id %lld outside [0, %lld)", static_cast<long long>(id),
                          static_cast<long long>(rows)),
               "id < rows\n  row id 4096 outside \\[0, 2048\\)");
}

TEST(CheckDeathTest, ComparisonsPrintBothValues) {
  const int64_t out_dim = 7, groups = 2;
  EXPECT_DEATH(DS41_CHECK_EQ(out_dim % groups, 0), "out_dim % groups == 0 \\(1 vs\\. 0\\)");
  EXPECT_DEATH(DS41_CHECK_LT(out_dim, groups, "grouped %s", "linear"),
               "out_dim < groups \\(7 vs\\. 2\\)\n  grouped linear");
  EXPECT_DEATH(DS41_CHECK_LE(out_dim, 6), "out_dim <= 6 \\(7 vs\\. 6\\)");
  EXPECT_DEATH(DS41_CHECK_GT(groups, out_dim), "groups > out_dim \\(2 vs\\. 7\\)");
  EXPECT_DEATH(DS41_CHECK_GE(-1, groups), "-1 >= groups \\(-1 vs\\. 2\\)");
  EXPECT_DEATH(DS41_CHECK_NE(groups, 2), "groups != 2 \\(2 vs\\. 2\\)");
}

TEST(CheckDeathTest, ValuesOfEveryKindArePrinted) {
  EXPECT_DEATH(DS41_CHECK_EQ(0.5f, 0.25), "\\(0.5 vs\\. 0.25\\)");
  EXPECT_DEATH(DS41_CHECK_EQ(true, false), "\\(true vs\\. false\\)");
  EXPECT_DEATH(DS41_CHECK_EQ(Color::kRed, Color{4}), "\\(3 vs\\. 4\\)");
  EXPECT_DEATH(DS41_CHECK_EQ(std::string("kFp8Tiles"), "kBF16"), "\\(\"kFp8Tiles\" vs\\. \"kBF16\"\\)");
  EXPECT_DEATH(DS41_CHECK_EQ(uint8_t{0x38}, uint8_t{0x39}), "\\(56 vs\\. 57\\)");
}

TEST(Check, PassingChecksEvaluateOperandsOnce) {
  int calls = 0;
  auto next = [&] { return ++calls; };
  DS41_CHECK_EQ(next(), 1);
  DS41_CHECK_LT(next(), 3, "message %d", next());  // the message is formatted only on failure
  EXPECT_EQ(calls, 2);
  DS41_CHECK(next() == 3, "literal");
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace ds41
