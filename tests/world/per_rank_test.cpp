// Tests for world/per_rank.h: collapsing, arithmetic, and the divergence check on comparisons.
#include <spmd/world/per_rank.h>

#include <gtest/gtest.h>

#include "tests/support/test_support.h"

namespace spmd {
namespace {

TEST(PerRank, CollapsesWhenUniform) {
  PerRank<int64_t> a({0, 1, 2}, {5, 5, 5});
  ASSERT_TRUE(a.is_uniform());
  EXPECT_EQ(*a.uniform(), 5);
  EXPECT_EQ(a.at(7), 5);  // a uniform value answers for any rank
  PerRank<int64_t> b({0, 1, 2}, {5, 6, 5});
  EXPECT_FALSE(b.is_uniform());
  EXPECT_EQ(b.at(1), 6);
  EXPECT_EQ(b.to_string(), "{0: 5, 1: 6, 2: 5}");
}

TEST(PerRank, ArithmeticAppliesRankByRank) {
  PerRank<int64_t> a({0, 1}, {3, 4});
  PerRank<int64_t> b = a * 2 + 1;
  EXPECT_EQ(b.at(0), 7);
  EXPECT_EQ(b.at(1), 9);
  PerRank<int64_t> c = b - a;  // {4, 5}
  EXPECT_EQ(c.at(1), 5);
  PerRank<int64_t> d = a % 2;  // {1, 0}
  EXPECT_EQ(d.at(0), 1);
  PerRank<int64_t> e = a - a;  // all zero: collapses
  EXPECT_TRUE(e.is_uniform());
}

TEST(PerRank, ComparisonsAnswerWhenRanksAgree) {
  PerRank<int64_t> a({0, 1}, {3, 4});
  EXPECT_TRUE(a < 10);
  EXPECT_FALSE(a > 10);
  EXPECT_TRUE(a != 0);
  PerRank<int64_t> u = 5;
  EXPECT_TRUE(u == 5);
}

TEST(PerRank, DivergentComparisonThrows) {
  PerRank<int64_t> a({0, 1, 2}, {3, 4, 5});
  std::string message =
      testing::expect_throws<DivergenceError>([&] { (void)(a < 4); }, {"`<`", "0: 3", "2: 5"});
  testing::expect_throws<DivergenceError>([&] { (void)(a == 4); });
  testing::expect_throws<DivergenceError>([&] { (void)a.value("shard length"); }, {"shard length"});
}

// Note [User call sites]: the report names the comparison's own line, for every operand order.
TEST(PerRank, DivergentComparisonNamesTheLine) {
  PerRank<int64_t> a({0, 1, 2}, {3, 4, 5});
  auto line_of = [](int line) { return fmt::format("per_rank_test.cpp:{}", line); };
  // clang-format off
  int line = __LINE__; testing::expect_throws<DivergenceError>([&] { (void)(a == 4); }, {line_of(line)});
  line = __LINE__; testing::expect_throws<DivergenceError>([&] { (void)(4 != a); }, {line_of(line)});
  line = __LINE__; testing::expect_throws<DivergenceError>([&] { (void)(a >= a * 0 + 4); }, {line_of(line)});
  // clang-format on
  EXPECT_TRUE(a < a + 1);  // the same comparison, answered alike everywhere
}

TEST(PerRank, RejectsBadConstruction) {
  testing::expect_throws<Error>([] { PerRank<int>({1, 0}, {1, 2}); }, {"ascending"});
  testing::expect_throws<Error>([] { PerRank<int>({0}, {1, 2}); }, {"1 ranks but 2 values"});
  PerRank<int> a({0, 1}, {1, 2});
  testing::expect_throws<Error>([&] { a.at(5); }, {"rank 5 is not held"});
}

TEST(PerRank, VectorValues) {
  PerRank<std::vector<int64_t>> coords({0, 1}, {{0, 1}, {1, 0}});
  EXPECT_EQ(coords.at(1), (std::vector<int64_t>{1, 0}));
  auto first = coords.map([](const std::vector<int64_t>& c) { return c[0]; });
  EXPECT_EQ(first.at(1), 1);
}

}  // namespace
}  // namespace spmd
