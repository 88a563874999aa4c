// Tests for core/check.h and core/error.h.
#include <spmd/core/check.h>

#include <gtest/gtest.h>

#include <spmd/core/error.h>
#include "tests/support/test_support.h"

namespace spmd {
namespace {

TEST(Check, PassingChecksDoNothing) {
  SPMD_CHECK(1 + 1 == 2);
  SPMD_CHECK_EQ(3, 3);
  SPMD_CHECK_LT(3, 4);
  SPMD_CHECK_GE(4, 4);
}

TEST(Check, FailureNamesFileLineExpressionAndOperands) {
  int a = 3;
  int b = 4;
  std::string message = testing::expect_throws<InternalError>(
      [&] { SPMD_CHECK_EQ(a, b); }, {"check_test.cpp:", "a == b", "3 vs 4"});
  EXPECT_NE(message.find("check failed"), std::string::npos);
}

TEST(Check, PlainCheckNamesExpression) {
  testing::expect_throws<InternalError>([] { SPMD_CHECK(2 < 1); }, {"2 < 1"});
}

TEST(Check, MessageFormIncludesDetail) {
  testing::expect_throws<InternalError>([] { SPMD_CHECK_MSG(false, "rank {} lost", 7); },
                                        {"rank 7 lost"});
}

TEST(Error, TypedErrorsDeriveFromError) {
  testing::expect_throws<Error>([] { throw_error<ShapeError>("add: {} vs {}", 1, 2); },
                                {"add: 1 vs 2"});
  testing::expect_throws<MeshError>([] { throw_error<MeshError>("slice"); });
  testing::expect_throws<CommError>([] { throw_error<CommError>("all_reduce"); });
}

}  // namespace
}  // namespace spmd
